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
from pathlib import Path
from typing import Any, Literal

from openai_compat.engine import limits
from openai_compat.engine.rows import NotPerInput, Row, collate, group_of, split_rows
from openai_compat.engine.usage import TokenCountedArray, TokenIds, unit_rows

# embedder: SentenceTransformer (text); sparse: SparseEncoder with SPLADE pooling; crossencoder
# and classifier: CrossEncoder with one label / more; clip and clap: SentenceTransformer whose
# modalities include image / audio besides text.
TextKind = Literal["embedder", "sparse", "crossencoder", "classifier", "clip", "clap"]
# Logits a SPLADE forward chunk may hold (rows x tokens x vocabulary): 64 M floats = 256 MB.
SPARSE_LOGITS_BUDGET = 64 * 1024 * 1024


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
        self.m3: Any | None = None  # a BGE-M3 folder's heads (bge_m3.M3Heads; native.load)
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
        # what decoding may shrink an image to (formats/media.py) for the model's processor
        processor = getattr(model[0], "processor", None)
        self.image_side = limits.image_side(processor) if processor is not None else None
        # what the library's model takes: "text", "image", "audio", and "message" for a model
        # that renders its inputs through its chat template (prompts become a system message)
        self.modalities = set(getattr(model, "modalities", None) or ["text"])
        self.sampling_rate: int | None = None  # the rate a CLAP model's audio must have
        if kind == "clap":  # its first module's processor (sentence-transformers' Transformer)
            extractor = getattr(getattr(model[0], "processor", None), "feature_extractor", None)
            rate = getattr(extractor, "sampling_rate", None)
            self.sampling_rate = rate if isinstance(rate, int) else None

    # ------------------------------------------------------------ any thread (preparation)

    def prepare(
        self, inputs: Sequence[Any], task: str | None = None, prompt: str | None = None
    ) -> list[Row]:
        """A caller's inputs -> rows. Texts (and (text, text) pairs for cross-encoders), images,
        {"image", "text"} dicts (a vision-language model's) and audio files go through the
        model's preprocess, each form in its own preprocess call; TokenIds are taken as
        given, no specials added. `task` (a model with modes): "query" or "document", as
        encode_query / encode_document prepare them. `prompt`: given to preprocess as the
        library's encode(prompt=...) gives it (a system message for a model that renders
        messages); a text model's callers put theirs in the text."""
        if task is not None and not self.modes:
            raise ValueError("this model has no query and document modes")
        if self.modes and task is None:
            task = "document"  # encode()'s and encode_document's side
        rows: list[Row | None] = [None] * len(inputs)
        forms: dict[str, list[int]] = {}
        for i, x in enumerate(inputs):
            if isinstance(x, TokenIds):
                if task is not None:  # the mode's markers and expansion come from preprocess
                    raise ValueError("token-id inputs cannot be embedded in a query/document mode")
                rows[i] = self._ids_row(x.ids)
            else:
                forms.setdefault(_form(x), []).append(i)
        for given in forms.values():
            batch = [inputs[i] for i in given]
            if self.kind == "clap" and isinstance(batch[0], bytes | bytearray):
                batch = [_audio(b) for b in batch]
            for i, row in zip(given, self._preprocess(batch, task, prompt), strict=True):
                rows[i] = row
        return [r for r in rows if r is not None]

    def _preprocess(self, batch: list[Any], task: str | None, prompt: str | None) -> list[Row]:
        extra: dict[str, Any] = {} if task is None else {"task": task}
        if prompt:
            extra["prompt"] = prompt
        features = self.model.preprocess(batch, **extra)
        try:
            return split_rows(features, self.left, self._cost(features), task)[0]
        except NotPerInput:  # several inputs' patches flattened together: one at a time
            made: list[Row] = []
            for item in batch:
                one = self.model.preprocess([item], **extra)
                made += split_rows(one, self.left, self._cost(one), task)[0]
            return made

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
            if self.m3 is not None and any(r.outputs for r in rows):
                return self._m3(out, features, rows)
            return self._vectors(out, rows)

    def _m3(self, out: dict[str, Any], features: dict[str, Any], rows: Sequence[Row]) -> list[Any]:
        """BGE-M3's outputs from the one forward: a row that asked none gets the model's
        dense vector as any embedder's, the others what they asked (bge_m3.M3Output)."""
        asked = [r.outputs or frozenset() for r in rows]
        assert self.m3 is not None
        made = self.m3.outputs(
            out["token_embeddings"], features["attention_mask"], features["input_ids"], asked
        )
        dense = self._vectors(out, rows)
        results: list[Any] = []
        for row, plain, m3 in zip(rows, dense, made, strict=True):
            m3.tokens = row.used
            results.append(m3 if row.outputs else plain)
        return results

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


def _form(item: Any) -> str:
    """Which preprocess call an input goes to: its Python form (text, pair, image, dict)."""
    return type(item).__name__ if isinstance(item, str | tuple | dict | bytes) else "media"


def _audio(raw: bytes) -> dict[str, Any]:
    """An audio file -> the samples and rate sentence-transformers' preprocess takes: decoded
    when formats/media.py validated it (DecodedAudio), else here, once."""
    from openai_compat.formats.media import DecodedAudio

    audio = raw if isinstance(raw, DecodedAudio) else DecodedAudio.of(bytes(raw))
    return {"array": audio.samples, "sampling_rate": audio.rate}
