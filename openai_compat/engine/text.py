"""Models on sentence-transformers 6, through its public stages only: text, image and audio.

`preprocess` turns a caller's inputs into features (on the model's preparation thread, when
they arrive); each input becomes a Row: token rows are kept unpadded with their length (their
cost to the scheduler), image and audio rows whole with a fixed cost (a ViT's patches, the
audio's feature frames). A batch of rows from any callers is grouped by what preprocess gave
per batch (the modality: a CLIP model's texts and images run apart), padded again (`collate`)
and run through the model as `encode`/`predict` run it (`model(features)`: compile() applies),
then the kind's own tail: an embedder's `sentence_embedding` (or its token vectors, cut by the
attention mask, for ColBERT-style models), a SPLADE model's vocabulary-sized row as a sparse
vector, a cross-encoder's `scores` upcast to float32 with its `activation_fn`. Padding does not
change a row's result beyond float noise (the attention mask keeps padding out), so the outputs
equal the library's own `encode`/`predict` (tests/test_native_engine.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from openai_compat.engine.usage import TokenCountedArray, TokenIds, unit_rows

# embedder: SentenceTransformer (text); sparse: SparseEncoder with SPLADE pooling; crossencoder
# and classifier: CrossEncoder with one label / more; clip and clap: SentenceTransformer whose
# modalities include image / audio besides text.
TextKind = Literal["embedder", "sparse", "crossencoder", "classifier", "clip", "clap"]
# Keys of preprocess's output that are per-token rows; anything else is per batch (modality).
_PAD_KEYS = {"input_ids"}
# Logits a SPLADE forward chunk may hold (rows x tokens x vocabulary): 64 M floats = 256 MB.
SPARSE_LOGITS_BUDGET = 64 * 1024 * 1024


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

    def __post_init__(self) -> None:
        if self.used < 0:
            self.used = self.length


def group_of(
    shared: dict[str, Any], tensors: dict[str, Any] | None = None, task: str | None = None
) -> tuple[Any, ...]:
    """The group of token rows with these per-batch keys (and mode), or (given an input's
    tensors) of a pixel or audio row: those stack only with rows of the same shapes."""
    shapes = () if tensors is None else tuple(tuple(t.shape) for t in tensors.values())
    keys = tuple(sorted((k, repr(v)) for k, v in shared.items()))
    return (tensors is None, keys, shapes, task)


# A ColBERT query's expansion tokens (sentence-transformers' query_expansion): attended to or
# not, they are part of the row (MaxSim scores them), so a row runs to its last one.
_EXPANSION = "query_expansion_positions"


def split_rows(
    features: dict[str, Any], left: bool, cost: int = 1, task: str | None = None
) -> tuple[list[Row], dict[str, Any]]:
    """preprocess's batch -> one Row per input, and the per-batch keys. With an attention
    mask the rows are token rows (cut to their length: the attention mask's, or to the last
    expansion token of a ColBERT query); without one (pixel values, audio features) each
    input's tensors are kept whole at `cost` each."""
    import torch

    tensors = {k: v for k, v in features.items() if isinstance(v, torch.Tensor) and v.dim() > 0}
    mask = features.get("attention_mask")
    if mask is not None:
        n, width = mask.shape
        per_row = {k: v for k, v in tensors.items() if tuple(v.shape) == (n, width)}
    else:
        n = min((int(v.shape[0]) for v in tensors.values()), default=0)
        per_row = {k: v for k, v in tensors.items() if int(v.shape[0]) == n}
    shared = {k: v for k, v in features.items() if k not in per_row}
    if any(isinstance(v, torch.Tensor) for v in shared.values()):
        raise ValueError("this model's inputs are not rows of one input each")
    if mask is None:
        rows = []
        for i in range(n):
            whole = {k: v[i] for k, v in per_row.items()}
            rows.append(Row(whole, cost, shared, False, group_of(shared, whole, task), task=task))
        return rows, shared
    group = group_of(shared, task=task)
    extent = mask.bool()
    if _EXPANSION in per_row:
        extent = extent | per_row[_EXPANSION].bool()
    rows = []
    for i, (length, used) in enumerate(
        zip(extent.sum(dim=1).tolist(), mask.sum(dim=1).tolist(), strict=True)
    ):
        cut = slice(width - length, width) if left else slice(0, length)
        tensors = {k: v[i, cut] for k, v in per_row.items()}
        rows.append(Row(tensors, int(length), shared, True, group, int(used), task))
    return rows, shared


def collate(rows: Sequence[Row], shared: dict[str, Any], pad_id: int, left: bool) -> dict:
    """Rows of one group -> one batch with the keys preprocess gives (token rows padded)."""
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
    out.update(shared)
    return out


class TextRunner:
    """One sentence-transformers model: prepare on any (one) thread, run on the forward
    thread only (scheduler.Scheduler). `modes`: a MultiVectorEncoder, whose queries and
    documents are prepared and run apart (encode_query / encode_document's `task`)."""

    def __init__(
        self,
        model: Any,
        kind: TextKind,
        threads: int,
        multivector: bool = False,
        exported: Path | None = None,
        modes: bool = False,
    ):
        self.model, self.kind, self.threads = model, kind, threads
        self.multivector = multivector
        self.modes = modes
        self.exported = exported  # the export's folder, where one runs the forward pass
        # An export whose runtime takes a thread count per batch says what the counts need
        # (ONNX: a session each, exported.py); OpenVINO's keeps the pool it was built with.
        self._prepare = getattr(model[0].model, "prepare_threads", None) if exported else None
        tokenizer = model.tokenizer
        self.tokenizer = tokenizer
        self.left = getattr(tokenizer, "padding_side", "right") == "left"
        self.pad_id = int(tokenizer.pad_token_id or 0)
        self.input_names = list(getattr(tokenizer, "model_input_names", ["input_ids"]))
        # What preprocess gives per batch of texts rather than per row (the modality): read
        # once, here, for rows made from token ids.
        probe = ("probe", "probe") if kind in ("crossencoder", "classifier") else "probe"
        self._shared = split_rows(model.preprocess([probe]), self.left)[1]
        self._group = group_of(self._shared)
        config = getattr(model.transformers_model, "config", None)
        self.sparse_size: int | None = None  # a SPLADE model's vector size: its vocabulary
        if kind == "sparse":
            self.sparse_size = int(getattr(config, "vocab_size", 0) or len(tokenizer))
        vision = getattr(config, "vision_config", None)
        size, patch = getattr(vision, "image_size", 0), getattr(vision, "patch_size", 0)
        # Tokens one image is to a ViT: its patches and a class token.
        self.image_tokens = (size // patch) ** 2 + 1 if size and patch else 0
        self.sampling_rate: int | None = None  # the rate a CLAP model's audio must have
        if kind == "clap":  # its first module's processor (sentence-transformers' Transformer)
            extractor = getattr(getattr(model[0], "processor", None), "feature_extractor", None)
            rate = getattr(extractor, "sampling_rate", None)
            self.sampling_rate = rate if isinstance(rate, int) else None

    # ------------------------------------------------------------ any thread (preparation)

    def prepare(self, inputs: Sequence[Any], task: str | None = None) -> list[Row]:
        """A caller's inputs -> rows. Texts (and (text, text) pairs for cross-encoders), images
        and audio files go through the model's preprocess; TokenIds are taken as given, no
        specials added. One call's inputs are of one modality (the engine's calls are).
        `task` (a model with modes): "query" or "document", as encode_query /
        encode_document prepare them (a caller's prompt is already in the text)."""
        if task is not None and not self.modes:
            raise ValueError("this model has no query and document modes")
        if self.modes and task is None:
            task = "document"  # encode()'s and encode_document's side
        rows: list[Row | None] = [None] * len(inputs)
        given = [i for i, x in enumerate(inputs) if not isinstance(x, TokenIds)]
        if given:
            batch = [inputs[i] for i in given]
            if self.kind == "clap" and isinstance(batch[0], bytes | bytearray):
                batch = [_audio(b) for b in batch]
            extra = {} if task is None else {"task": task}
            features = self.model.preprocess(batch, **extra)
            made, _ = split_rows(features, self.left, self._cost(features), task)
            for i, row in zip(given, made, strict=True):
                rows[i] = row
        for i, x in enumerate(inputs):
            if isinstance(x, TokenIds):
                if task is not None:  # the mode's markers and expansion come from preprocess
                    raise ValueError("token-id inputs cannot be embedded in a query/document mode")
                rows[i] = self._ids_row(x.ids)
        return [r for r in rows if r is not None]

    def _cost(self, features: dict[str, Any]) -> int:
        """What one image or audio input costs the token budget: a ViT's tokens, or the
        audio's feature frames."""
        audio = features.get("input_features")
        if audio is not None:
            return int(audio.shape[-2])
        return max(1, self.image_tokens)

    def _ids_row(self, ids: Sequence[int]) -> Row:
        import torch

        n = len(ids)
        tensors = {"input_ids": torch.tensor(list(ids), dtype=torch.long)}
        tensors["attention_mask"] = torch.ones(n, dtype=torch.long)
        if "token_type_ids" in self.input_names:
            tensors["token_type_ids"] = torch.zeros(n, dtype=torch.long)
        return Row(tensors, n, self._shared, True, self._group)

    # ------------------------------------------------------------ the forward thread

    def on_thread(self) -> None:
        import torch

        # torch's count is per thread once the thread has read it: its first read sets the
        # thread to the count last set anywhere, which would undo this lane's own choice if
        # it came after (two lanes, scheduler.py).
        torch.get_num_threads()
        torch.set_num_threads(self.threads)
        self.model.eval()

    def tunable_threads(self) -> int:
        """The most threads a batch may be given: torch's count (and an ONNX export's,
        which runs each batch on the session of the count set) may change between batches;
        OpenVINO's compiled model keeps the pool it was built with: fixed."""
        return self.threads if self.exported is None or self._prepare is not None else 1

    def prepare_threads(self, counts: Sequence[int]) -> None:
        """What each thread count a batch may be given needs before its first batch: an ONNX
        export's session per count (exported.py); torch needs nothing."""
        if self._prepare is not None:
            self._prepare(counts)

    def set_threads(self, count: int) -> None:
        import torch

        torch.set_num_threads(count)

    def run(self, rows: Sequence[Row]) -> list[Any]:
        """One batch from the scheduler: each group of rows (one modality) through the model
        in one pass (a SPLADE model's in chunks that bound its logits), results in order."""
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, row in enumerate(rows):
            groups.setdefault(row.group, []).append(i)
        results: list[Any] = [None] * len(rows)
        for indices in groups.values():
            step = len(indices)
            if self.sparse_size is not None:
                width = max(rows[i].length for i in indices)
                step = max(1, SPARSE_LOGITS_BUDGET // (width * self.sparse_size))
            for start in range(0, len(indices), step):
                part = indices[start : start + step]
                outputs = self._forward([rows[i] for i in part])
                for i, result in zip(part, outputs, strict=True):
                    results[i] = result
        return results

    def _forward(self, rows: Sequence[Row]) -> list[Any]:
        import torch

        features = collate(rows, rows[0].shared, self.pad_id, self.left)
        task = rows[0].task  # one group: one mode
        with torch.inference_mode():
            out = self.model(features) if task is None else self.model(features, task=task)
            if self.kind in ("crossencoder", "classifier"):
                return self._scores(out)
            if self.kind == "sparse":
                return self._sparse(out, rows)
            return self._vectors(out, rows)

    def _vectors(self, out: dict[str, Any], rows: Sequence[Row]) -> list[Any]:
        if self.multivector:
            tokens = out["token_embeddings"].float()
            mask = out["attention_mask"].bool()
            return [
                TokenCountedArray.of(t[m].cpu().numpy(), r.used)
                for t, m, r in zip(tokens, mask, rows, strict=True)
            ]
        unit, norms = unit_rows(out["sentence_embedding"].float().cpu().numpy())
        return [TokenCountedArray.of(unit[i], r.used, float(norms[i])) for i, r in enumerate(rows)]

    def _sparse(self, out: dict[str, Any], rows: Sequence[Row]) -> list[Any]:
        from openai_compat.formats.sparse import SparseVector

        matrix = out["sentence_embedding"].float().cpu().numpy()
        return [SparseVector.from_dense(matrix[i], r.used) for i, r in enumerate(rows)]

    def _scores(self, out: dict[str, Any]) -> list[Any]:
        """Raw scores (logits) per input: the tails of rerank and classify apply to them."""
        matrix = out["scores"].float().cpu().numpy()  # sub-fp32 upcast, as predict does
        if matrix.ndim == 1:
            matrix = matrix[:, None]
        return list(matrix)


def _audio(raw: bytes) -> dict[str, Any]:
    """An audio file -> the samples and rate sentence-transformers' preprocess takes: decoded
    when formats/media.py validated it (DecodedAudio), else here, once."""
    from openai_compat.formats.media import DecodedAudio

    audio = raw if isinstance(raw, DecodedAudio) else DecodedAudio.of(bytes(raw))
    return {"array": audio.samples, "sampling_rate": audio.rate}
