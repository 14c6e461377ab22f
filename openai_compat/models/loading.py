"""Engine loading: configured model -> started engine -> registered ModelEntry.

Owns engine construction (exported backends, sparse heads, length caps), the probe that tells
what a started engine can do, int8 calibration and its cache, warm-up, and stopping engines.
It must not answer requests or look names up: that is registry.py (names -> entries) and
inference/embed.py (requests -> engine calls). infinity-emb is built and stopped by
engine/infinity/engines.py, its internals read in engine/infinity/ and engine/adapter.py.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from openai_compat import cpus
from openai_compat.engine import adapter, folders, native, pooling
from openai_compat.engine.infinity import engines as infinity_engines
from openai_compat.engine.infinity import hooks as infinity_hooks
from openai_compat.engine.infinity import splade
from openai_compat.engine.infinity.feeder import Feeder
from openai_compat.formats.prompts import Prompts
from openai_compat.formats.token_ids import Cl100kDecoder, ModelTokenIdDecoder
from openai_compat.formats.tokens import TokenCounter
from openai_compat.lifecycle import in_daemon_thread
from openai_compat.models import memory
from openai_compat.models.calibration import calibrate
from openai_compat.models.preflight import check_options
from openai_compat.models.registry import Capability, EngineFailure, ModelEntry, Registry
from openai_compat.settings import (
    ModelConfig,
    default_export_dir,
    infinity_installed,
    runs_natively,
)

logger = logging.getLogger("openai_compat")

# infinity-emb's capability names -> ours
_CAPABILITIES: dict[str, Capability] = {
    "embed": "embed",
    "rerank": "rerank",
    "classify": "classify",
    "image_embed": "image",
    "audio_embed": "audio",
}


def create_engine(config: ModelConfig, export_dir: Path | None = None) -> Any:
    """Build (load weights of) one engine: the native one, or infinity-emb's where the model
    names one of its engines and it is installed. Blocking: run it in a thread."""
    check_options(config)
    if runs_natively(config.engine):
        return _create_native(config, export_dir or default_export_dir())
    if not infinity_installed():
        raise EngineFailure(
            f"model {config.served_name!r}: engine = {config.engine!r} is one of infinity-emb's "
            "engines, which is not installed here: use engine = 'native' (the default), or "
            "install infinity-emb in an environment of its own (requirements/infinity.txt)"
        )
    try:
        engine = infinity_engines.create(config)
    except (KeyError, ValueError, TypeError) as exc:
        raise EngineFailure(f"model {config.served_name!r}: invalid engine options: {exc}") from exc
    replica = adapter.replica_of(engine)
    sparse = config.kind == "sparse" or (
        config.kind == "auto" and splade.is_masked_lm(config.source)
    )
    try:
        if sparse:
            splade.serve_sparse(replica, config.source, config.trust_remote_code)
        adapter.apply_max_length(replica, config.max_length)
        pooling.apply_pooling(replica, config.pooling_method, sparse=sparse)
    except ValueError as exc:
        raise EngineFailure(f"model {config.served_name!r}: {exc}") from exc
    return engine


def _create_native(config: ModelConfig, export_dir: Path) -> native.NativeEngine:
    try:
        engine = native.load(config, cpus.engine_threads(), export_dir)
        adapter.apply_max_length(engine, config.max_length)
        pooling.apply_pooling(engine, config.pooling_method, sparse=engine.kind == "sparse")
    except (ValueError, TypeError, KeyError) as exc:
        raise EngineFailure(f"model {config.served_name!r}: {exc}") from exc
    return engine


async def _probe(engine: Any, counter: TokenCounter | None) -> tuple[list[Any], bool]:
    """One embedding through the engine; and whether the token count the engine reported
    for it (if any) matches the model's tokenizer (only then is it trusted)."""
    vectors, _ = await engine.embed(["dimension probe"])
    expected = await counter.usage(["dimension probe"], truncate=True) if counter else None
    return vectors, adapter.engine_token_count(vectors) == expected


async def describe(
    config: ModelConfig,
    engine: Any,
    cl100k: Cl100kDecoder | None,
    cache_dir: Path | None = None,
) -> ModelEntry:
    """Inspect a started engine: capabilities, size, tokenizer, the limit it applies."""
    problems = adapter.contract_problems(engine)
    if problems:
        raise EngineFailure("; ".join(problems))
    caps = frozenset(_CAPABILITIES[c] for c in engine.capabilities if c in _CAPABILITIES)
    native = set(engine.capabilities)
    replica = adapter.replica_of(engine)
    backend = adapter.backend_tokenizer(replica)
    max_length = adapter.applied_max_length(replica)
    counter = TokenCounter(backend, max_length) if backend is not None else None
    decoder: Any | None = None
    if config.token_ids == "cl100k_base":
        decoder = cl100k
    elif config.token_ids == "model" and backend is not None:
        decoder = ModelTokenIdDecoder(backend)
    folder, folder_default = adapter.folder_prompts(replica)
    declared = folders.declared_prompts(config.source, config.revision) if folder else None
    if declared is not None:  # a blank prompt the library added must not shadow a real one
        folder = {k: v for k, v in folder.items() if v or k in declared}
    try:
        prompts = Prompts.resolve(config.prompts, config.default_prompt, folder, folder_default)
        if getattr(engine, "modes", False):
            prompts = dataclasses.replace(prompts, modes=True)
    except ValueError as exc:
        raise EngineFailure(f"model {config.served_name!r}: {exc}") from exc
    dimensions = None
    multivector = False
    engine_counts = False
    raw_output = False
    quantizer = None
    sparse_size = _sparse_size(replica)
    if sparse_size is not None:
        # A SPLADE model (create_engine): sparse vectors, and rerank by their dot product.
        caps = (caps - {"embed"}) | {"sparse", "rerank"}
        dimensions = sparse_size
        vectors, engine_counts = await _probe(engine, counter)
    elif "embed" in caps:
        counting = infinity_hooks.count_tokens_in_engine(replica)
        vectors, counts_match = await _probe(engine, counter)
        engine_counts = counting and counts_match
        raw_output = adapter.raw_vectors(vectors) is not None
        probe = np.asarray(vectors[0])
        dimensions = int(probe.shape[-1])
        multivector = probe.ndim == 2
        # Cosine similarity of embeddings gives every single-vector model a rerank ability,
        # MaxSim over token vectors every multi-vector one (late interaction).
        caps = caps | {"rerank"}
        if not multivector:
            quantizer = await calibrate(engine, config, cache_dir)
    elif adapter.is_native(engine):
        engine_counts = True  # rerankers and classifiers count the inputs they tokenize
    return ModelEntry(
        config=config,
        engine=engine,
        capabilities=caps,
        dimensions=dimensions,
        max_length=max_length,
        counter=counter,
        token_decoder=decoder,
        logits=infinity_hooks.LogitsRunner.for_replica(replica, config.served_name),
        multivector=multivector,
        modes=bool(getattr(engine, "modes", False)),
        engine_counts=engine_counts,
        raw_output=raw_output,
        exact_token_ids=config.token_ids == "model" and infinity_hooks.accepts_token_ids(replica),
        image_tokens=adapter.image_tokens(replica) if "image" in caps else 0,
        sampling_rate=adapter.sampling_rate(replica) if "audio" in caps else None,
        cosine_rerank="embed" in native
        and "rerank" in caps
        and sparse_size is None
        and not multivector,
        sparse=sparse_size is not None,
        modalities=_modalities(engine, caps),
        messages=bool(getattr(engine, "messages", False)),
        prompts=prompts,
        quantizer=quantizer,
        # The native engine forms its own batches (engine/scheduler.py); the feeder gathers
        # waves for infinity-emb, whose queue batches as soon as anything arrives.
        feeder=Feeder(engine, config.batch_size)
        if config.wave_batching
        and not adapter.is_native(engine)
        and ("embed" in native or sparse_size is not None)
        else None,
    )


def _modalities(engine: Any, caps: frozenset[Capability]) -> frozenset[str]:
    """What a model's inputs may be: the native engine says; else what its abilities imply."""
    told = getattr(engine, "modalities", None)
    if isinstance(told, frozenset | set):
        return frozenset(told)
    return frozenset(
        {"text"}
        | ({"image"} if "image" in caps else set())
        | ({"audio"} if "audio" in caps else set())
    )


def _sparse_size(replica: Any) -> int | None:
    """A sparse model's vector size (its vocabulary); None for any other model."""
    if adapter.is_native(replica):
        size: int | None = replica.runner.sparse_size
        return size
    return splade.sparse_size(replica)


class ModelLoader:
    """`await loader(config) -> ModelEntry`: creates, starts, describes and warms one model
    (pool.py calls it, one load at a time). Every model shares its one cl100k_base decoder,
    which builds its encoding on first use (formats/token_ids.py)."""

    def __init__(
        self,
        registry: Registry,
        export_dir: Path | None = None,
        max_multivector_values: int | None = None,
    ) -> None:
        self.registry, self.export_dir = registry, export_dir
        self.max_multivector_values = max_multivector_values
        self.cl100k = Cl100kDecoder()

    @staticmethod
    def weight_bytes(entry: ModelEntry) -> int | None:
        """What the model's own tensors take (pool.py charges this to the memory budget);
        None where the engine holds no torch tensors (the RSS growth of its load counts)."""
        try:
            return memory.tensor_bytes(adapter.torch_modules(entry.engine))
        except adapter.EngineContractError:  # not a local engine (a Ray deployment's handle)
            return None

    async def __call__(self, config: ModelConfig) -> ModelEntry:
        registry, export_dir = self.registry, self.export_dir
        started = time.perf_counter()
        logger.info("loading model %r from %s", config.served_name, config.model)
        engine = None
        try:
            engine = await in_daemon_thread(
                create_engine, config, export_dir, name=config.served_name
            )
            registry.engines.append(engine)
            await engine.astart()
            entry = await describe(config, engine, self.cl100k, export_dir or default_export_dir())
            if config.model_warmup:
                await warm_up(entry)
            bound = getattr(engine, "bound_output", None)  # clients' calls, not the warm-up's
            if entry.multivector and bound is not None and self.max_multivector_values:
                bound(entry.dimensions, self.max_multivector_values)
        except BaseException as exc:
            if engine is not None:  # a lazy load that failed must not leave its engine behind
                await _stop_quietly(registry, engine)
            if isinstance(exc, EngineFailure) or not isinstance(exc, Exception):
                raise
            raise EngineFailure(
                f"model {config.served_name!r} ({config.model}) failed to load: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        entry.load_seconds = time.perf_counter() - started
        logger.info(
            "model %r ready in %.1fs: %s, dimensions=%s, max_length=%s",
            entry.name,
            entry.load_seconds,
            ",".join(sorted(entry.capabilities)),
            entry.dimensions,
            entry.max_length,
        )
        return entry


async def _stop_quietly(registry: Registry, engine: Any) -> None:
    registry.engines = [e for e in registry.engines if e is not engine]
    try:
        await engine.astop()
    except Exception:  # already broken: the load's own error is the one to report
        logger.debug("stopping a failed engine raised", exc_info=True)


def _close_helpers(entry: ModelEntry) -> None:
    """Close what an entry runs beside its engine: the logits and late-chunking runners and
    infinity-emb's wave feeder."""
    for helper in (entry.logits, entry.late, entry.feeder):
        if helper is not None:
            helper.close()


async def unload_entry(registry: Registry, entry: ModelEntry) -> None:
    """Stop one model's engine and drop what holds its memory (pool.py then trims)."""
    registry.remove(entry)
    _close_helpers(entry)
    await entry.engine.astop()
    entry.engine = entry.counter = entry.logits = entry.feeder = entry.token_decoder = None
    entry.late = None


async def warm_up(entry: ModelEntry) -> None:
    """One full batch of short inputs and one input at the model's limit, through the same
    engine path requests take: allocators, kernels and the batcher are warm for the first
    request. (infinity-emb's own warm-up runs a dozen batches, up to 512 tokens each: most of
    a CPU replica's start-up, for timings it no longer uses.)"""
    size = entry.config.batch_size
    short = [f"warm-up {i}" for i in range(size)]
    longest = " ".join(["warm"] * (entry.max_length or 512))
    engine = entry.engine
    if "embed" in entry.capabilities or entry.sparse:
        if entry.quantizer is None or entry.quantizer.from_cache:  # else calibration ran them
            await engine.embed(short)
        await engine.embed([longest])
    elif "rerank" in entry.capabilities:
        await engine.rerank(query="warm-up", docs=short)
        await engine.rerank(query="warm-up", docs=[longest])
    elif "classify" in entry.capabilities:
        await engine.classify(sentences=short)
        await engine.classify(sentences=[longest])


async def stop_engines(registry: Registry) -> None:
    """Stop every engine that was started: native ones each, infinity-emb's as one
    AsyncEngineArray (only then is infinity-emb imported)."""
    if not registry.engines:
        return
    for entry in registry.entries():
        _close_helpers(entry)
    engines, registry.engines = registry.engines, []
    for engine in engines:
        if adapter.is_native(engine):
            await engine.astop()
    others = [e for e in engines if not adapter.is_native(e)]
    if others:
        await infinity_engines.stop(others)
