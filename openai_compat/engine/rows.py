"""What preprocess gives, as one Row per input, and rows of one group back into a batch.

sentence-transformers' `preprocess` turns a list of inputs into one batch of features. The
scheduler forms its own batches from the rows of many callers, so each input's share is cut
out here (`split_rows`) and put back together with other callers' rows (`collate`):

- token rows (a key shaped [inputs, tokens] beside an attention mask) are kept unpadded with
  their length, and padded again on the tokenizer's side;
- an input's other tensors (a page image's pixels, a VLM's image grid or images per sample)
  are kept with their leading axis and concatenated along it, which is how processors batch
  them: stacked images ([1, 3, H, W] each) and flattened patches (Qwen2-VL's [patches, dim]
  with [1, 3] grids) alike. Where a tensor's first axis is not one entry per input (flattened
  patches of several images), the inputs are preprocessed one at a time (`NotPerInput`);
- without an attention mask (CLIP's pixel values, CLAP's audio features) each input's tensors
  are kept whole and stacked;
- anything else preprocess gives (its modality, a processor's flags) is per batch: rows with
  different such values, or blobs of different shapes, never share a forward pass (`group`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# Keys of preprocess's output padded with the tokenizer's pad id (anything else with 0).
_PAD_KEYS = {"input_ids"}
# A ColBERT query's expansion tokens (sentence-transformers' query_expansion): attended to or
# not, they are part of the row (MaxSim scores them), so a row runs to its last one.
_EXPANSION = "query_expansion_positions"


class NotPerInput(ValueError):
    """A batch's tensor is not one entry per input (several images' patches flattened):
    preprocess the inputs one at a time."""


@dataclass
class Row:
    """One input after preprocess: its tensors by key (token rows unpadded), its cost (the
    tokens it takes), and what preprocess gave for its whole batch (its modality)."""

    tensors: dict[str, Any]
    length: int
    shared: dict[str, Any] = field(default_factory=dict)
    tokens: bool = True  # token rows are padded to a batch; pixel or audio rows are stacked
    # Rows with the same group can share one forward pass (group_of; set when the row is
    # made, on the preparation thread, so the forward thread only compares it).
    group: tuple[Any, ...] = ()
    # The input's own tokens (usage): `length` less a ColBERT query's expansion tokens,
    # which cost a forward pass but were not sent.
    used: int = -1
    task: str | None = None  # a multi-vector model's mode ("query", "document"); None: none
    # a token row's other tensors (an image's pixels...), leading axis kept: concatenated
    blobs: dict[str, Any] = field(default_factory=dict)
    # what a BGE-M3 caller asked of the row's forward (bge_m3.OUTPUTS); None: the model's
    # one vector. Rows asking different outputs share a batch: only the heads differ.
    outputs: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.used < 0:
            self.used = self.length


def group_of(
    shared: dict[str, Any],
    tensors: dict[str, Any] | None = None,
    task: str | None = None,
    blobs: dict[str, Any] | None = None,
) -> tuple[Any, ...]:
    """The group of token rows with these per-batch keys (and mode, and blobs' shapes past
    their leading axis), or (given an input's tensors) of a pixel or audio row: those stack
    only with rows of the same shapes."""
    shapes = () if tensors is None else tuple(tuple(t.shape) for t in tensors.values())
    keys = tuple(sorted((k, repr(v)) for k, v in shared.items()))
    extra = tuple(sorted((k, tuple(v.shape[1:])) for k, v in (blobs or {}).items()))
    return (tensors is None, keys, shapes, task, extra)


def split_rows(
    features: dict[str, Any], left: bool, cost: int = 1, task: str | None = None
) -> tuple[list[Row], dict[str, Any]]:
    """preprocess's batch -> one Row per input, and the per-batch keys. With an attention
    mask the rows are token rows (cut to their length: the attention mask's, or to the last
    expansion token of a ColBERT query), each with its other tensors as blobs; without one
    (pixel values, audio features) each input's tensors are kept whole at `cost` each."""
    import torch

    tensors = {k: v for k, v in features.items() if isinstance(v, torch.Tensor) and v.dim() > 0}
    mask = features.get("attention_mask")
    if mask is not None:
        n, width = mask.shape
        per_row = {k: v for k, v in tensors.items() if tuple(v.shape[:2]) == (n, width)}
        per_row = {k: v for k, v in per_row.items() if v.dim() == 2}
        others = {k: v for k, v in tensors.items() if k not in per_row}
        if n > 1 and any(int(v.shape[0]) != n for v in others.values()):
            raise NotPerInput(", ".join(sorted(others)))
    else:
        n = min((int(v.shape[0]) for v in tensors.values()), default=0)
        per_row = {k: v for k, v in tensors.items() if int(v.shape[0]) == n}
        others = {}
    shared = {k: v for k, v in features.items() if k not in per_row and k not in others}
    if any(isinstance(v, torch.Tensor) for v in shared.values()):
        raise NotPerInput(", ".join(k for k, v in shared.items() if isinstance(v, torch.Tensor)))
    if mask is None:
        rows = []
        for i in range(n):
            whole = {k: v[i] for k, v in per_row.items()}
            rows.append(Row(whole, cost, shared, False, group_of(shared, whole, task), task=task))
        return rows, shared
    extent = mask.bool()
    if _EXPANSION in per_row:
        extent = extent | per_row[_EXPANSION].bool()
    rows = []
    for i, (length, used) in enumerate(
        zip(extent.sum(dim=1).tolist(), mask.sum(dim=1).tolist(), strict=True)
    ):
        cut = slice(width - length, width) if left else slice(0, length)
        cut_tensors = {k: v[i, cut] for k, v in per_row.items()}
        # one input: every other tensor is its own (a Qwen2-VL image's flattened patches)
        blobs = {k: (v if n == 1 else v[i : i + 1]) for k, v in others.items()}
        group = group_of(shared, task=task, blobs=blobs)
        rows.append(
            Row(cut_tensors, int(length), shared, True, group, int(used), task, blobs=blobs)
        )
    return rows, shared


def collate(rows: Sequence[Row], shared: dict[str, Any], pad_id: int, left: bool) -> dict:
    """Rows of one group -> one batch with the keys preprocess gives (token rows padded,
    blobs concatenated along their leading axis)."""
    import torch

    out: dict[str, Any] = {}
    if not rows[0].tokens:
        out = {k: torch.stack([r.tensors[k] for r in rows]) for k in rows[0].tensors}
        out.update(shared)
        return out
    width = max(r.length for r in rows)
    for key, first in rows[0].tensors.items():
        fill = pad_id if key in _PAD_KEYS else 0
        batch = torch.full((len(rows), width), fill, dtype=first.dtype)
        for i, row in enumerate(rows):
            t = row.tensors[key]
            if left:
                batch[i, width - len(t) :] = t
            else:
                batch[i, : len(t)] = t
        out[key] = batch
    for key in rows[0].blobs:
        out[key] = torch.cat([r.blobs[key] for r in rows], dim=0)
    out.update(shared)
    return out
