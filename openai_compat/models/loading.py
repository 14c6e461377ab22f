"""Engine loading: configured model -> started engine -> registered ModelEntry.

Owns engine construction (exported backends, sparse heads, length caps), the probe that tells
what a started engine can do, int8 calibration and its cache, warm-up, and stopping engines.
It must not answer requests or look names up: that is registry.py (names -> entries) and
inference/embed.py (requests -> engine calls). Engines are built and stopped by
engine/build.py and read through engine/contract.py's Engine only.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from openai_compat.engine import build, folders
from openai_compat.engine.contract import Engine
from openai_compat.engine.usage import engine_token_count, raw_vectors
from openai_compat.formats.prompts import Prompts
from openai_compat.formats.token_ids import Cl100kDecoder, ModelTokenIdDecoder
from openai_compat.formats.tokens import TokenCounter
from openai_compat.frame.settings import ModelConfig, default_export_dir
from openai_compat.ground.lifecycle import in_daemon_thread
from openai_compat.models import memory
from openai_compat.models.calibration import calibrate
from openai_compat.models.preflight import check_options
from openai_compat.models.registry import Capability, EngineFailure, ModelEntry, Registry

logger = logging.getLogger("openai_compat")

# infinity-emb's capability names -> ours
_CAPABILITIES: dict[str, Capability] = {
    "embed": "embed",
    "rerank": "rerank",
    "classify": "classify",
    "image_embed": "image",
    "audio_embed": "audio",
}


def create_engine(config: ModelConfig, export_dir: Path | None = None) -> Engine:
    """Build (load weights of) one model's engine (engine/build.py decides which). Blocking:
    run it in a thread."""
    check_options(config)
    try:
        return build.create(config, export_dir or default_export_dir())
    except build.NotInstalled as exc:
        raise EngineFailure(f"model {config.served_name!r}: {exc}") from exc
    except (ValueError, TypeError, KeyError) as exc:
        raise EngineFailure(f"model {config.served_name!r}: {exc}") from exc


async def _probe(engine: Engine, counter: TokenCounter | None) -> tuple[list[Any], bool]:
    """One embedding through the engine; and whether the token count the engine reported
    for it (if any) matches the model's tokenizer (only then is it trusted)."""
    vectors, _ = await engine.embed(["dimension probe"])
    expected = await counter.usage(["dimension probe"], truncate=True) if counter else None
    return vectors, engine_token_count(vectors) == expected


async def describe(
    config: ModelConfig,
    engine: Engine,
    cl100k: Cl100kDecoder | None,
    cache_dir: Path | None = None,
) -> ModelEntry:
    """Inspect a started engine: capabilities, size, tokenizer, the limit it applies."""
    problems = engine.contract_problems()
    if problems:
        raise EngineFailure("; ".join(problems))
    caps = frozenset(_CAPABILITIES[c] for c in engine.capabilities if c in _CAPABILITIES)
    engine_caps = set(engine.capabilities)  # the engine's names (image_embed, ...)
    backend = engine.tokenizer()
    max_length = engine.max_length()
    counter = TokenCounter(backend, max_length) if backend is not None else None
    decoder: Any | None = None
    if config.token_ids == "cl100k_base":
        decoder = cl100k
    elif config.token_ids == "model" and backend is not None:
        decoder = ModelTokenIdDecoder(backend)
    folder, folder_default = engine.prompts()
    declared = folders.declared_prompts(config.source, config.revision) if folder else None
    if declared is not None:  # a blank prompt the library added must not shadow a real one
        folder = {k: v for k, v in folder.items() if v or k in declared}
    try:
        prompts = Prompts.resolve(config.prompts, config.default_prompt, folder, folder_default)
        if engine.modes:
            prompts = dataclasses.replace(prompts, modes=True)
    except ValueError as exc:
        raise EngineFailure(f"model {config.served_name!r}: {exc}") from exc
    dimensions = None
    multivector = False
    engine_counts = False
    raw_output = False
    quantizer = None
    sparse_size = engine.sparse_size()
    if sparse_size is not None:
        # A SPLADE model (create_engine): sparse vectors, and rerank by their dot product.
        caps = (caps - {"embed"}) | {"sparse", "rerank"}
        dimensions = sparse_size
        vectors, engine_counts = await _probe(engine, counter)
    elif "embed" in caps:
        vectors, counts_match = await _probe(engine, counter)
        engine_counts = engine.reports_tokens() and counts_match
        raw_output = raw_vectors(vectors) is not None
        probe = np.asarray(vectors[0])
        dimensions = int(probe.shape[-1])
        multivector = probe.ndim == 2
        # Cosine similarity of embeddings gives every single-vector model a rerank ability,
        # MaxSim over token vectors every multi-vector one (late interaction).
        caps = caps | {"rerank"}
        if not multivector:
            quantizer = await calibrate(engine, config, cache_dir)
        if "sparse" in engine.outputs():  # BGE-M3's lexical weights (TEI's /embed_sparse)
            caps = caps | {"sparse"}
    else:  # rerankers and classifiers: the engines that count the inputs they tokenize
        engine_counts = engine.reports_tokens()
    return ModelEntry(
        config=config,
        engine=engine,
        capabilities=caps,
        dimensions=dimensions,
        max_length=max_length,
        counter=counter,
        token_decoder=decoder,
        logits=engine.logits_runner(),
        multivector=multivector,
        modes=engine.modes,
        engine_counts=engine_counts,
        raw_output=raw_output,
        exact_token_ids=config.token_ids == "model" and engine.takes_token_ids(),
        image_tokens=engine.image_tokens() if "image" in caps else 0,
        image_side=engine.image_side() if "image" in caps else None,
        precision=engine.precision(),
        sampling_rate=engine.sampling_rate if "audio" in caps else None,
        cosine_rerank="embed" in engine_caps
        and "rerank" in caps
        and sparse_size is None
        and not multivector
        and not engine.outputs(),  # BGE-M3 ranks by its own scores (inference/hybrid.py)
        sparse=sparse_size is not None,
        outputs=engine.outputs(),
        modalities=engine.modalities,
        messages=engine.messages,
        prompts=prompts,
        quantizer=quantizer,
        feeder=engine.wave_feeder(config.batch_size) if config.wave_batching else None,
    )


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
            return memory.tensor_bytes(entry.engine.torch_modules())
        except RuntimeError:  # an engine whose library changed (its contract's error)
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
            multivector = entry.multivector or "multivector" in entry.outputs
            if multivector and entry.dimensions and self.max_multivector_values:
                # clients' calls, not the warm-up's
                engine.bound_output(entry.dimensions, self.max_multivector_values)
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


async def _stop_quietly(registry: Registry, engine: Engine) -> None:
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


# The longest input the warm-up runs: a model's limit up to this (BGE-M3's 8,192 tokens took
# 150 s of its 157 s start on 2 CPU cores; attention grows with the square of the length).
WARM_TOKENS = 512


async def warm_up(entry: ModelEntry) -> None:
    """One full batch of short inputs and one input at the model's limit (at most WARM_TOKENS),
    through the same engine path requests take: allocators, kernels and the batcher are warm
    for the first request. (infinity-emb's own warm-up runs a dozen batches, up to 512 tokens
    each: most of a CPU replica's start-up, for timings it no longer uses.)"""
    size = entry.config.batch_size
    short = [f"warm-up {i}" for i in range(size)]
    longest = " ".join(["warm"] * min(entry.max_length or WARM_TOKENS, WARM_TOKENS))
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
    """Stop every engine that was started (engine/build.stop)."""
    if not registry.engines:
        return
    for entry in registry.entries():
        _close_helpers(entry)
    engines, registry.engines = registry.engines, []
    await build.stop(engines)
