"""infinity-emb's engine (optional: requirements/infinity.txt) behind engine/contract.py's
Engine: built, stopped, its refusals read, and every question the server asks answered from
internals.py (its attributes, checked as a contract), hooks.py (what we install in it) and
splade.py. With engine/infinity/'s other modules, the only place that imports infinity-emb."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any

from openai_compat.engine import folders, late, limits, pooling
from openai_compat.engine.infinity import hooks, internals, splade
from openai_compat.engine.infinity.feeder import Feeder
from openai_compat.frame.settings import ModelConfig
from openai_compat.ground.errors import BadRequest


def engine_args(config: ModelConfig) -> Any:
    """infinity-emb's EngineArgs for a model's configuration."""
    from infinity_emb import EngineArgs

    options: dict[str, Any] = dict(
        model_name_or_path=config.source,
        served_model_name=config.served_name,
        engine=config.engine,
        device=config.device,
        batch_size=config.batch_size,
        revision=config.revision,
        trust_remote_code=config.trust_remote_code,
        dtype=config.dtype,
        pooling_method=config.pooling_method,
        # Our own, cheaper warm-up runs instead (models/loading.warm_up).
        model_warmup=False,
        compile=config.compile,
        bettertransformer=config.bettertransformer,
        # Priorities by character length: our own counter does the real token counting.
        lengths_via_tokenize=False,
    )
    return EngineArgs(**options)


class InfinityEngine:
    """One model on infinity-emb's AsyncEmbeddingEngine (`inner`), its first replica read."""

    def __init__(self, inner: Any, name: str) -> None:
        self.inner, self.name = inner, name
        self.replica = internals.replica_of(inner)
        self.kind = internals.kind_of(self.replica)
        self.capabilities: set[str] = set(inner.capabilities)
        rate = getattr(self.replica, "sampling_rate", None)
        self.sampling_rate = rate if isinstance(rate, int) else None
        self._counts = False

    @classmethod
    def create(cls, config: ModelConfig) -> InfinityEngine:
        """The engine for the model (its weights loaded: blocking), set up as configured: a
        SPLADE head, the length cap, the pooling; ValueError for options it cannot take."""
        from infinity_emb import AsyncEmbeddingEngine

        if config.bettertransformer and not internals.bettertransformer_available():
            raise ValueError(
                "bettertransformer = true needs optimum's BetterTransformer (optimum < 2), "
                "which is not installed; leave the option out"
            )
        try:
            engine = cls(AsyncEmbeddingEngine.from_args(engine_args(config)), config.served_name)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"invalid engine options: {exc}") from exc
        replica = engine.replica
        sparse = config.kind == "sparse" or (
            config.kind == "auto" and splade.is_masked_lm(config.source)
        )
        if sparse:
            splade.serve_sparse(replica, config.source, config.trust_remote_code)
        engine.apply_max_length(config.max_length)
        pooled = engine._pooled()
        pooling.apply_pooling(replica, config.pooling_method, pooled=pooled, sparse=sparse)
        if not sparse:
            engine._counts = hooks.count_tokens_in_engine(replica)
        return engine

    # ------------------------------------------------------------ lifecycle and calls

    @property
    def is_running(self) -> bool:
        return internals.batcher_alive(self.inner)

    async def astart(self) -> None:
        await self.inner.astart()

    async def astop(self) -> None:
        await self.inner.astop()

    async def embed(
        self,
        sentences: Sequence[Any],
        task: str | None = None,
        prompt: str | None = None,
        outputs: frozenset[str] | None = None,
    ) -> tuple[list[Any], int]:
        if task is not None or prompt or outputs:
            raise ValueError(
                f"model {self.name!r} has no query and document modes, messages or outputs"
            )
        return await _refused(self.inner.embed(list(sentences)))

    async def image_embed(
        self, *, images: Sequence[Any], prompt: str | None = None
    ) -> tuple[list[Any], int]:
        return await _refused(self.inner.image_embed(images=list(images)))

    async def audio_embed(self, *, audios: Sequence[Any]) -> tuple[list[Any], int]:
        return await _refused(self.inner.audio_embed(audios=list(audios)))

    async def rerank(self, *, query: str, docs: Sequence[str]) -> tuple[list[Any], int]:
        return await _refused(self.inner.rerank(query=query, docs=list(docs)))

    async def classify(self, *, sentences: Sequence[Any]) -> tuple[list[Any], int]:
        return await _refused(self.inner.classify(sentences=list(sentences)))

    # ------------------------------------------------------------ what the model is

    modes = False
    messages = False

    @property
    def modalities(self) -> frozenset[str]:
        caps = self.capabilities
        return frozenset(
            {"text"}
            | ({"image"} if "image_embed" in caps else set())
            | ({"audio"} if "audio_embed" in caps else set())
        )

    def _hf_tokenizer(self) -> Any | None:
        return internals.hf_tokenizer(self.replica)

    def tokenizer(self) -> Any | None:
        backend = getattr(self._hf_tokenizer(), "backend_tokenizer", None)
        for name in ("_infinity_tokenizer", "tokenizer"):  # any tokenizer the replica carries
            if backend is None:
                backend = getattr(getattr(self.replica, name, None), "backend_tokenizer", None)
        return backend

    def apply_max_length(self, max_length: int | None) -> None:
        """Truncate at `max_length` (default: the model's own limit, where the replica has
        no setting of its own); ValueError where it cannot."""
        model, tokenizer = internals.torch_model(self.replica), self._hf_tokenizer()
        limits.check(max_length, model, tokenizer)
        default = limits.default_limit(model, tokenizer)
        internals.apply_max_length(self.replica, max_length, default)

    def max_length(self) -> int | None:
        return limits.plausible(internals.applied_max_length(self.replica))

    def prompts(self) -> tuple[dict[str, str], str | None]:
        if self.kind not in ("embedder", "sparse"):
            return {}, None
        internals.attr(self.replica, "prompts", "SentenceTransformer")
        internals.attr(self.replica, "default_prompt_name", "SentenceTransformer")
        return folders.library_prompts(self.replica)

    def labels(self) -> dict[str, str]:
        return limits.labels(internals.torch_model(self.replica))

    def sparse_size(self) -> int | None:
        return splade.sparse_size(self.replica)

    def reports_tokens(self) -> bool:
        return self._counts

    def takes_token_ids(self) -> bool:
        return hooks.accepts_token_ids(self.replica)

    def image_tokens(self) -> int:
        return internals.image_tokens(self.replica)

    def outputs(self) -> tuple[str, ...]:
        return ()  # BGE-M3's heads run on the native engine

    def precision(self) -> dict[str, Any] | None:
        return None  # infinity-emb chooses its own dtype (bf16 or fp16 on a GPU)

    def image_side(self) -> int | None:
        return None  # infinity-emb's processors are its own: images decoded at full size

    def _pooled(self) -> bool:
        return self.kind == "embedder" and not internals.multivector(self.replica)

    def pooling_mode(self) -> str | None:
        return late.pooling_mode(self.replica) if self._pooled() else None

    # ------------------------------------------------------------ helpers and state

    def late_runner(self) -> late.LateRunner:
        return late.LateRunner(self.replica)

    def logits_runner(self) -> hooks.LogitsRunner | None:
        return hooks.LogitsRunner.for_replica(self.replica, self.name)

    def wave_feeder(self, batch_size: int) -> Feeder | None:
        """Embed calls in length-sorted waves: infinity-emb's queue batches as soon as
        anything arrives (feeder.py)."""
        wanted = "embed" in self.capabilities or self.sparse_size() is not None
        return Feeder(self, batch_size) if wanted else None

    def bound_output(self, width: int, most: int) -> None:
        """infinity-emb's queue has no place to check a call before its forward pass; the
        answer's own check (inference/plan.py) applies."""

    def queue_length(self) -> int:
        return internals.queue_length(self.inner)

    def batch_stats(self) -> None:
        return None

    def torch_modules(self) -> list[Any]:
        return internals.torch_modules(self.inner)

    def contract_problems(self) -> list[str]:
        return internals.contract_problems(self.inner)


async def stop(engines: Sequence[InfinityEngine]) -> None:
    """Stop infinity-emb's engines (their batching threads) together."""
    from infinity_emb import AsyncEngineArray

    await AsyncEngineArray(engines=[e.inner for e in engines]).astop()


async def _refused(call: Awaitable[Any]) -> tuple[list[Any], int]:
    """The engine's answer; its bad-input exceptions as the 400s they are."""
    try:
        result: tuple[list[Any], int] = await call
    except Exception as exc:
        refused = refusal(exc)
        if refused is None:
            raise
        raise refused from exc
    return result


def refusal(exc: Exception) -> BadRequest | None:
    """The 400 for one of infinity-emb's bad-input exceptions; None for anything else."""
    from infinity_emb.primitives import (
        AudioCorruption,
        ImageCorruption,
        MatryoshkaDimError,
        ModelNotDeployedError,
    )

    if isinstance(exc, ModelNotDeployedError):
        return BadRequest(str(exc), param="model", code="model_not_supported")
    if isinstance(exc, MatryoshkaDimError):
        return BadRequest(str(exc), param="dimensions")
    if isinstance(exc, ImageCorruption | AudioCorruption):
        return BadRequest(str(exc), param="input", code="invalid_media")
    return None
