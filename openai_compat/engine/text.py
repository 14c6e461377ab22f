"""Text models on sentence-transformers 6, through its public stages only.

`preprocess` tokenizes a caller's inputs (on the model's preparation thread, when they
arrive); each row is kept unpadded with its length, its cost to the scheduler. A batch of rows
from any callers is padded again (`collate`) and run through the model as `encode`/`predict`
run it (`model(features)`: compile() applies), then the kind's own tail: an embedder's
`sentence_embedding` (or its token vectors, cut by the attention mask, for ColBERT-style
models), a cross-encoder's `scores` upcast to float32 with its `activation_fn`. Padding does
not change a row's result beyond float noise (the attention mask keeps padding out), so the
outputs equal the library's own `encode`/`predict` (tests/test_native_engine.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from openai_compat.engine.usage import TokenCountedArray, TokenIds, unit_rows

TextKind = Literal["embedder", "crossencoder", "classifier"]
# Keys of preprocess's output that are per-token rows; anything else is per batch (modality).
_PAD_KEYS = {"input_ids"}


@dataclass
class Row:
    """One input, tokenized and unpadded: its tensors by key, and its length."""

    tensors: dict[str, Any]
    length: int


def split_rows(features: dict[str, Any], left: bool) -> tuple[list[Row], dict[str, Any]]:
    """preprocess's padded batch -> one unpadded Row per input, and the per-batch keys."""
    import torch

    mask = features["attention_mask"]
    n, width = mask.shape
    lengths = mask.sum(dim=1).tolist()
    per_row = {
        k: v
        for k, v in features.items()
        if isinstance(v, torch.Tensor) and v.dim() == 2 and tuple(v.shape) == (n, width)
    }
    shared = {k: v for k, v in features.items() if k not in per_row}
    if any(isinstance(v, torch.Tensor) for v in shared.values()):
        raise ValueError("this model's inputs are not plain token rows")
    rows = []
    for i, length in enumerate(lengths):
        cut = slice(width - length, width) if left else slice(0, length)
        rows.append(Row({k: v[i, cut] for k, v in per_row.items()}, int(length)))
    return rows, shared


def collate(rows: Sequence[Row], shared: dict[str, Any], pad_id: int, left: bool) -> dict:
    """Rows -> one padded batch with the keys preprocess gives."""
    import torch

    width = max(r.length for r in rows)
    out: dict[str, Any] = {}
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
    out.update(shared)
    return out


class TextRunner:
    """One sentence-transformers model: prepare on any (one) thread, run on the forward
    thread only (scheduler.Scheduler)."""

    def __init__(self, model: Any, kind: TextKind, threads: int, multivector: bool = False):
        self.model, self.kind, self.threads = model, kind, threads
        self.multivector = multivector
        tokenizer = model.tokenizer
        self.tokenizer = tokenizer
        self.left = getattr(tokenizer, "padding_side", "right") == "left"
        self.pad_id = int(tokenizer.pad_token_id or 0)
        self.input_names = list(getattr(tokenizer, "model_input_names", ["input_ids"]))
        # What preprocess gives per batch rather than per row (its modality): read once, here.
        probe = ("probe", "probe") if kind != "embedder" else "probe"
        self._shared = split_rows(model.preprocess([probe]), self.left)[1]

    # ------------------------------------------------------------ any thread (preparation)

    def prepare(self, inputs: Sequence[Any]) -> list[Row]:
        """A caller's inputs -> rows. Texts (and (text, text) pairs for cross-encoders) go
        through the model's preprocess; TokenIds are taken as given, no specials added."""
        rows: list[Row | None] = [None] * len(inputs)
        texts = [i for i, x in enumerate(inputs) if not isinstance(x, TokenIds)]
        if texts:
            features = self.model.preprocess([inputs[i] for i in texts])
            made, _ = split_rows(features, self.left)
            for i, row in zip(texts, made, strict=True):
                rows[i] = row
        for i, x in enumerate(inputs):
            if isinstance(x, TokenIds):
                rows[i] = self._ids_row(x.ids)
        return [r for r in rows if r is not None]

    def _ids_row(self, ids: Sequence[int]) -> Row:
        import torch

        n = len(ids)
        tensors = {"input_ids": torch.tensor(list(ids), dtype=torch.long)}
        tensors["attention_mask"] = torch.ones(n, dtype=torch.long)
        if "token_type_ids" in self.input_names:
            tensors["token_type_ids"] = torch.zeros(n, dtype=torch.long)
        return Row(tensors, n)

    # ------------------------------------------------------------ the forward thread

    def on_thread(self) -> None:
        import torch

        torch.set_num_threads(self.threads)
        self.model.eval()

    def run(self, rows: Sequence[Row]) -> list[Any]:
        import torch

        features = collate(rows, self._shared, self.pad_id, self.left)
        with torch.inference_mode():
            out = self.model(features)
            if self.kind == "embedder":
                return self._vectors(out, rows)
            return self._scores(out)

    def _vectors(self, out: dict[str, Any], rows: Sequence[Row]) -> list[Any]:
        if self.multivector:
            tokens = out["token_embeddings"].float()
            mask = out["attention_mask"].bool()
            return [
                TokenCountedArray.of(t[m].cpu().numpy(), r.length)
                for t, m, r in zip(tokens, mask, rows, strict=True)
            ]
        unit, norms = unit_rows(out["sentence_embedding"].float().cpu().numpy())
        return [
            TokenCountedArray.of(unit[i], r.length, float(norms[i])) for i, r in enumerate(rows)
        ]

    def _scores(self, out: dict[str, Any]) -> list[Any]:
        """Raw scores (logits) per input: the tails of rerank and classify apply to them."""
        matrix = out["scores"].float().cpu().numpy()  # sub-fp32 upcast, as predict does
        if matrix.ndim == 1:
            matrix = matrix[:, None]
        return list(matrix)
