"""The native engine: one model on sentence-transformers 6, our own queue and forward thread.

It offers the calls the server makes of an engine (embed, rerank, classify and raw logits;
capabilities; astart/astop), so the rest of the server cannot tell it from the optional
infinity-emb engine. A call's inputs are tokenized on the model's preparation thread (off the
event loop, one thread: a fast tokenizer is not safe to share between threads, and its batch
encoding is parallel inside already), then wait in the model's scheduler (scheduler.py) for
the forward thread, which runs one batch at a time with torch's threads sized to the CPUs the
process may use (cpus.py).

Kinds: a folder whose architecture is `*ForSequenceClassification` is a CrossEncoder, a
reranker with one label and a classifier with more (raw logits, softmax for classify, the
model's own activation for rerank, as `predict` applies it); a masked-LM folder (or any with
`kind = "sparse"`) is a SparseEncoder with SPLADE pooling, giving sparse vectors over the
vocabulary; anything else is a SentenceTransformer: an embedder (ColBERT-style architectures
giving one vector per token), or, where its modalities include images or audio (CLIP, CLAP:
sentence-transformers reads them from the model's processor), a text + image or text + audio
embedder.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from openai_compat.engine import bge_m3, classes, folders, late, limits, pooling, precision, tails
from openai_compat.engine.debug import DebugRunner
from openai_compat.engine.prep import FairPrep
from openai_compat.engine.priority import in_background, reserve_prepared, tenant
from openai_compat.engine.refusals import EngineStopped, InputRefused, OutputTooLarge
from openai_compat.engine.scheduler import Scheduler
from openai_compat.engine.tails import RerankScore
from openai_compat.engine.text import TextKind, TextRunner
from openai_compat.frame.model_config import DEBUG_ENGINE

_CAPABILITIES: dict[TextKind, set[str]] = {
    "embedder": {"embed"},
    "sparse": {"embed"},
    "crossencoder": {"rerank"},
    "classifier": {"classify"},
    "clip": {"embed", "image_embed"},
    "clap": {"embed", "audio_embed"},
}
logger = logging.getLogger("openai_compat")


class NativeEngine:
    """One loaded model behind its scheduler."""

    def __init__(
        self,
        runner: TextRunner | DebugRunner,
        *,
        name: str,
        batch_size: int,
        max_batch_tokens: int,
        lanes: int = 1,
    ) -> None:
        self.runner, self.name = runner, name
        self.kind: TextKind = runner.kind
        self.model = runner.model  # the library's own object (public attributes only)
        self.capabilities = set(_CAPABILITIES[self.kind])
        if self.kind in ("embedder", "clip") and "image" in runner.modalities:
            self.capabilities.add("image_embed")  # a VLM embedder's, a ColPali's page images
        self.sampling_rate = runner.sampling_rate  # what a CLAP model's audio must be sampled at
        labels = getattr(getattr(self.model, "config", None), "id2label", None) or {}
        self._labels = {int(k): str(v) for k, v in labels.items()}  # read once, at load
        self.scheduler = Scheduler(
            runner,
            name=name,
            batch_size=batch_size,
            max_batch_tokens=max_batch_tokens,
            lanes=lanes,
        )
        self._prepare = FairPrep(name)
        self.verdict: precision.Verdict | None = None  # the dtype it runs in (load sets it)
        self._started = False
        # a multi-vector model's bound on one call's output: (values per token, most values)
        self._output_bound: tuple[int, int] | None = None

    # ------------------------------------------------------------ lifecycle

    @property
    def is_running(self) -> bool:
        return self._started and self.scheduler.running

    async def astart(self) -> None:
        if not self._started:
            self.scheduler.start()
            self._started = True

    async def astop(self) -> None:
        self._prepare.shutdown()
        await asyncio.to_thread(self.scheduler.stop)

    def queue_length(self) -> int:
        return self.scheduler.waiting()

    # ------------------------------------------------------------ calls

    async def _run(
        self,
        inputs: Sequence[Any],
        task: str | None = None,
        prompt: str | None = None,
        outputs: frozenset[str] | None = None,
    ) -> tuple[list[Any], int]:
        """The runner's results for `inputs`, and the tokens they took (after truncation,
        special tokens and a VLM's image tokens included). `outputs`: what a BGE-M3 caller
        asked of the forward (bge_m3.M3Output per input)."""
        if not self.is_running:
            raise EngineStopped(f"model {self.name!r}: the engine is not running")
        name, weight = tenant()
        job = self._prepare.submit(
            name, weight, len(inputs), self.runner.prepare, list(inputs), task, prompt
        )
        try:
            rows = await asyncio.wrap_future(job)
        except ValueError as exc:  # preparation is the inputs' alone: the client's to mend
            raise InputRefused(f"the model could not prepare these inputs: {exc}") from exc
        for row in rows if outputs else ():
            row.outputs = outputs
        self._check_output(rows, outputs)
        await reserve_prepared(sum(r.used for r in rows))  # where the caller could not count
        costs = [r.length for r in rows]
        results = await self.scheduler.submit(
            rows, costs, background=in_background(), tenant=name, weight=weight
        )
        return results, sum(r.used for r in rows)

    def _check_output(self, rows: Sequence[Any], outputs: frozenset[str] | None) -> None:
        """OutputTooLarge where the call's token vectors would pass the bound."""
        if self._output_bound is None:
            return
        width, most = self._output_bound
        if not self.runner.multivector:
            m3 = self.runner.m3
            if m3 is None or not outputs or "multivector" not in outputs:
                return
            width = m3.width
        values = sum(r.length for r in rows if r.tokens) * width
        if values > most:
            raise OutputTooLarge(values, most)

    def bound_output(self, width: int, most: int) -> None:
        """Refuse a call whose token vectors (its rows' tokens x `width`) would pass `most`
        values, once its inputs are tokenized and before they are queued (a multi-vector
        model's answer grows with its inputs' tokens)."""
        self._output_bound = (width, most)

    @property
    def modes(self) -> bool:
        """Whether the model embeds queries and documents apart (a MultiVectorEncoder)."""
        return bool(self.runner.modes)

    @property
    def modalities(self) -> frozenset[str]:
        """What the model's inputs may be: "text", "image", "audio"."""
        return frozenset(m for m in ("text", "image", "audio") if m in self.runner.modalities)

    @property
    def messages(self) -> bool:
        """Whether the model renders inputs through its chat template (a VLM's "message"
        modality): a prompt is then given apart, as a system message, not in the text."""
        return "message" in self.runner.modalities

    async def embed(
        self,
        sentences: Sequence[str],
        task: str | None = None,
        prompt: str | None = None,
        outputs: frozenset[str] | None = None,
    ) -> tuple[list[Any], int]:
        """Unit vectors (or token vectors) with their tokens and norms; usage in tokens.
        `task`: "query" or "document" on a model with modes (its default: document);
        `prompt`: a model with messages' system prompt; `outputs`: a BGE-M3 model's
        (bge_m3.OUTPUTS), an M3Output per input."""
        self._check("embed")
        if outputs and self.runner.m3 is None:
            raise ValueError(f"model {self.name!r} gives one kind of vector only")
        return await self._run(sentences, task, prompt, outputs)

    async def image_embed(
        self, *, images: Sequence[Any], prompt: str | None = None
    ) -> tuple[list[Any], int]:
        """Vectors of decoded images (PIL), or of {"image", "text"} dicts on a model that
        renders messages, in the space of the model's text vectors; a multi-vector model's
        (ColPali's) page images on its document side."""
        self._check("image_embed")
        return await self._run(images, None, prompt)

    async def audio_embed(self, *, audios: Sequence[Any]) -> tuple[list[Any], int]:
        """Unit vectors of audio files (bytes, validated and at the model's sampling rate)."""
        self._check("audio_embed")
        return await self._run(audios)

    async def rerank(
        self, *, query: str, docs: Sequence[str], raw_scores: bool = False
    ) -> tuple[list[RerankScore], int]:
        """Each (query, doc) pair's score: the model's activation (sigmoid for one label)
        of its logit, as CrossEncoder.predict gives it; the raw logit if asked."""
        self._check("rerank")
        rows, tokens = await self._run([(query, d) for d in docs])
        logits = np.stack(rows)[:, 0] if rows else np.zeros(0, dtype=np.float32)
        scores = logits if raw_scores else tails.activation(self.model, logits)
        results = [
            RerankScore(i, float(s), d) for i, (s, d) in enumerate(zip(scores, docs, strict=True))
        ]
        return results, tokens

    async def classify(
        self, *, sentences: Sequence[str], raw_scores: bool = False
    ) -> tuple[list[list[dict[str, Any]]], int]:
        """Every label's probability (softmax of the logits) per input, or the logits."""
        self._check("classify")
        rows, tokens = await self._run(sentences)
        return [tails.labelled(r, self._labels, softmax=not raw_scores) for r in rows], tokens

    async def logits(self, inputs: Sequence[Any]) -> list[list[dict[str, Any]]]:
        """Raw logits per input: a text, or a {'text', 'text_pair'} dict (a pair)."""
        pairs = [(x["text"], x["text_pair"]) if isinstance(x, dict) else x for x in inputs]
        rows, _ = await self._run(pairs)
        return [tails.labelled(r, self._labels, softmax=False) for r in rows]

    def close(self) -> None:
        """As a model's logits runner (ModelEntry.logits): nothing of its own to close, the
        logits go through the engine's own queue, which astop stops."""

    def _check(self, capability: str) -> None:
        if capability not in self.capabilities:
            raise ValueError(f"model {self.name!r} cannot {capability}")

    # ------------------------------------------- what the server asks (contract.Engine)

    def torch_modules(self) -> list[Any]:
        """The torch modules holding the model's weights; none where an export runs it (its
        runtime's memory shows in the process's growth during the load)."""
        return [] if self.runner.exported is not None else [self.model]

    def apply_max_length(self, max_length: int | None) -> None:
        """Truncate at `max_length` (default: the model's own limit); ValueError past what
        the model takes. Sentence-transformers' own setting, every kind."""
        model, tokenizer = self.model.transformers_model, self.runner.tokenizer
        limits.check(max_length, model, tokenizer)
        limit = max_length or limits.default_limit(model, tokenizer)
        if limit is not None:
            self.model.max_seq_length = limit

    def max_length(self) -> int | None:
        return limits.plausible(self.model.max_seq_length)

    def tokenizer(self) -> Any | None:
        return getattr(self.runner.tokenizer, "backend_tokenizer", None)

    def prompts(self) -> tuple[dict[str, str], str | None]:
        # a "clip" is also a vision-language embedder, whose prompts are system messages
        if self.kind not in ("embedder", "sparse", "clip"):
            return {}, None
        return folders.library_prompts(self.model)

    def labels(self) -> dict[str, str]:
        return limits.labels(self.model.transformers_model)

    def sparse_size(self) -> int | None:
        return self.runner.sparse_size

    def outputs(self) -> tuple[str, ...]:
        return bge_m3.OUTPUTS if self.runner.m3 is not None else ()

    def reports_tokens(self) -> bool:
        return not self.runner.multivector  # token vectors: the server counts

    def takes_token_ids(self) -> bool:
        return self.kind == "embedder"

    def image_tokens(self) -> int:
        return int(self.runner.image_tokens)

    def image_side(self) -> int | None:
        return self.runner.image_side

    def precision(self) -> dict[str, Any] | None:
        return self.verdict.card() if self.verdict is not None else None

    @property
    def pooled(self) -> bool:  # one vector per input from a Pooling module
        return self.kind == "embedder" and not self.runner.multivector

    def apply_pooling(self, method: str) -> None:
        """Pool with `method` (config's pooling_method); ValueError where it cannot apply."""
        pooling.apply_pooling(self.model, method, pooled=self.pooled, sparse=self.kind == "sparse")

    def pooling_mode(self) -> str | None:
        return late.pooling_mode(self.model) if self.pooled else None

    def late_runner(self) -> late.LateRunner:
        return late.LateRunner(self.model)

    def logits_runner(self) -> NativeEngine | None:
        return self if self.kind == "classifier" else None  # logits go through the queue

    def wave_feeder(self, batch_size: int) -> None:  # the scheduler forms its own batches
        return None

    def batch_stats(self) -> dict[str, Any]:
        return self.scheduler.stats.as_dict()

    def contract_problems(self) -> list[str]:
        return []


# ---------------------------------------------------------------- loading


def load(config: Any, threads: int, export_dir: Path | None = None) -> NativeEngine:
    """Build (load the weights of) the engine for one configured model, its forward pass on
    torch or on an export (`config.backend`; exported.py); `engine = "debugengine"`: no model
    at all (debug.py). Blocking."""
    if config.engine == DEBUG_ENGINE:
        return NativeEngine(
            DebugRunner(),
            name=config.served_name,
            batch_size=config.batch_size,
            max_batch_tokens=config.max_batch_tokens,
        )
    classes.check_library()
    source = str(config.source)
    archs = classes.architectures(source, config.revision, config.trust_remote_code)
    device = None if config.device == "auto" else config.device
    options: dict[str, Any] = dict(
        device=device, revision=config.revision, trust_remote_code=config.trust_remote_code
    )
    if config.dtype not in (*precision.EXPLICIT, "auto"):
        raise ValueError(f"dtype {config.dtype!r} is not served by the native engine")
    # "auto": float32 whatever the folder was saved in; precision.decide lowers it where the
    # device's policy and the quality check say so
    options["model_kwargs"] = {"dtype": "float32" if config.dtype == "auto" else config.dtype}
    model, kind, multivector = classes.load_model(config, source, archs, options)
    exported: Path | None = None
    from openai_compat.frame.settings import default_export_dir

    export_dir = export_dir or default_export_dir()
    heads = None  # BGE-M3's sparse and ColBERT heads (an export runs the dense path alone)
    if kind == "embedder" and not multivector and config.backend == "torch":
        heads = bge_m3.heads_of(model, source, config.revision)
    reading = bge_m3.CheckReading(heads) if heads is not None else None
    verdict = precision.decide(model, config, kind, multivector, export_dir, reading)  # logs it
    if config.backend != "torch":
        if kind != "embedder" or multivector:
            raise ValueError(
                f"backend = {config.backend!r} serves text embedding models only; this is a "
                f"{kind} model (serve it with backend = 'torch')"
            )
        from openai_compat.engine.exported import serve_exported

        exported = serve_exported(model, config, export_dir, threads)
    elif config.compile:
        # torch's own nn.Module.compile: the model's forward, which preprocess + model() run,
        # compiled on first use per shape family (dynamic: batches vary in size and length).
        model.compile(dynamic=True)
    runner = TextRunner(
        model,
        kind,
        threads,
        multivector=multivector,
        exported=exported,
        modes=type(model).__name__ == "MultiVectorEncoder",
    )
    runner.m3 = heads
    engine = NativeEngine(
        runner,
        name=config.served_name,
        batch_size=config.batch_size,
        max_batch_tokens=config.max_batch_tokens,
        lanes=lanes(config, runner),
    )
    engine.verdict = verdict
    return engine


def lanes(config: Any, runner: TextRunner) -> int:
    """Forward passes of a model that may run side by side (scheduler.py's lanes): the
    model's `forward_lanes`, or by default two where torch or ONNX Runtime runs the model on a
    CPU of two cores or more (under load one thread each beats one pass on two: 1.13-1.16x for
    MiniLM on 2 vCPUs; ONNX Runtime's sessions are thread-safe), else one: OpenVINO's compiled
    model keeps its own thread pool, a compiled forward is not run from two threads at once
    (torch.compile is not thread-safe: pytorch/pytorch#136833), and a GPU runs one pass at a
    time anyway."""
    if config.forward_lanes:
        return int(config.forward_lanes)
    on_cpu = getattr(getattr(runner.model, "device", None), "type", "cpu") == "cpu"
    return 2 if runner.tunable_threads() > 1 and on_cpu and not config.compile else 1
