"""Served names and aliases -> one loaded model each, with what it can do. Strict lookups."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from openai_compat.compact import CALIBRATION_TEXTS, Quantizer
from openai_compat.engine import adapter, backends
from openai_compat.engine.feeder import Feeder
from openai_compat.errors import BadRequest, ModelNotFound, RateLimited
from openai_compat.lifecycle import in_daemon_thread
from openai_compat.prompts import Prompts
from openai_compat.settings import ModelConfig, check_unique_names
from openai_compat.tokens import Cl100kDecoder, ModelTokenIdDecoder, TokenCounter

logger = logging.getLogger("openai_compat")

Capability = Literal["embed", "sparse", "rerank", "classify", "image", "audio"]

# infinity-emb's capability names -> ours
_CAPABILITIES: dict[str, Capability] = {
    "embed": "embed",
    "rerank": "rerank",
    "classify": "classify",
    "image_embed": "image",
    "audio_embed": "audio",
}


class EngineFailure(RuntimeError):
    """A model could not be loaded or started; stops the server."""


@dataclass
class ModelEntry:
    """One loaded model and everything the API needs to know about it."""

    config: ModelConfig
    engine: Any  # infinity_emb.AsyncEmbeddingEngine
    capabilities: frozenset[Capability]
    dimensions: int | None = None
    max_length: int | None = None
    counter: TokenCounter | None = None
    token_decoder: Any | None = None  # Cl100kDecoder | ModelTokenIdDecoder | None
    logits: adapter.LogitsRunner | None = None  # raw classification logits (classifiers)
    multivector: bool = False  # one vector per token (ColBERT-style), not one per input
    engine_counts: bool = False  # the engine reports each embedding's tokens (no 2nd pass)
    raw_output: bool = False  # vectors keep their pre-normalisation norm (TEI normalize=false)
    sparse: bool = False  # SPLADE: sparse vectors (sparse.SparseVector), dimensions = vocabulary
    image_tokens: int = 0  # tokens one image is to the model (ViT patches + class token)
    sampling_rate: int | None = None  # what audio inputs must be sampled at
    cosine_rerank: bool = False  # reranks by embedding similarity (no cross-encoder)
    prompts: Prompts = field(default_factory=Prompts)
    quantizer: Quantizer | None = None  # int8/uint8 ranges (see compact.py)
    feeder: Feeder | None = None  # embed calls in length-sorted waves (engine/feeder.py)
    queued: int = 0  # inputs admitted and not yet answered
    inflight: int = 0  # requests being served
    created: int = field(default_factory=lambda: int(time.time()))
    load_seconds: float = 0.0

    @property
    def name(self) -> str:
        return self.config.served_name

    @property
    def owned_by(self) -> str:
        model = self.config.model
        if "/" in model and not model.startswith(("/", ".", "builtin:")):
            return model.split("/")[0]
        return "openai-compat"

    @contextmanager
    def admit(self, inputs: int, limit: int) -> Iterator[None]:
        """Admission control: refuse (429) work that would push the queued inputs past `limit`.

        A request is always admitted onto an idle model, so one larger than the limit can
        still run; the queue never holds more than `limit` plus one request's inputs.
        """
        if limit and self.queued and self.queued + inputs > limit:
            raise RateLimited(
                f"Model {self.name!r} has {self.queued} inputs queued (limit {limit}); "
                "retry shortly.",
                headers={"Retry-After": "1"},
            )
        self.queued += inputs
        self.inflight += 1
        try:
            yield
        finally:
            self.queued -= inputs
            self.inflight -= 1

    def tokenizer(self, param: str) -> TokenCounter:
        """The model's own tokenizer (tokenize and decode routes); 400 for models without."""
        if self.counter is None:
            raise BadRequest(f"Model {self.name!r} has no tokenizer.", param=param)
        return self.counter

    def engine_queue(self) -> int:
        """Inputs waiting for the model: in infinity-emb's batching queue, and held by the
        feeder for its next wave."""
        held = self.feeder.waiting if self.feeder is not None else 0
        return adapter.queue_length(self.engine) + held

    async def embed(self, texts: list[str]) -> tuple[list[Any], int]:
        """The engine's embed (vectors, usage), through the feeder where there is one."""
        if self.feeder is not None:
            return await self.feeder.embed(texts)
        result: tuple[list[Any], int] = await self.engine.embed(texts)
        return result

    def alive(self) -> bool:
        """False once the engine's batching machinery has died."""
        return adapter.batcher_alive(self.engine)


class Registry:
    """Served name or alias -> ModelEntry. Filled while models load; order is config order."""

    def __init__(self, configs: Sequence[ModelConfig]) -> None:
        check_unique_names(list(configs))
        self.configs = tuple(configs)
        self._entries: dict[str, ModelEntry] = {}  # served name -> entry
        self._names: dict[str, str] = {}  # served name or alias -> served name
        self._order: list[str] = [c.served_name for c in configs]
        self.engines: list[Any] = []  # every engine started, for shutdown
        self._defaults: dict[str, ModelEntry] = {}  # capability -> model (choose_defaults)

    # ------------------------------------------------------------ filling

    def add(self, entry: ModelEntry) -> None:
        for name in (entry.name, *entry.config.aliases):
            if name in self._names:
                raise ValueError(f"duplicate model name or alias {name!r}")
        self._entries[entry.name] = entry
        self._names[entry.name] = entry.name
        for alias in entry.config.aliases:
            self._names[alias] = entry.name

    @property
    def complete(self) -> bool:
        return len(self._entries) == len(self.configs)

    def __iter__(self) -> Iterable[ModelEntry]:
        return iter([self._entries[n] for n in self._order if n in self._entries])

    def entries(self) -> list[ModelEntry]:
        return list(self.__iter__())

    def served_names(self) -> list[str]:
        """Every name a client may use: served names, then aliases."""
        names = list(self._order)
        names += [a for c in self.configs for a in c.aliases]
        return names

    # ------------------------------------------------------------ lookups

    def resolve(self, name: str) -> ModelEntry:
        served = self._names.get(name)
        if served is None:
            raise ModelNotFound(name, self.served_names())
        return self._entries[served]

    def require(self, name: str, capability: Capability) -> ModelEntry:
        """The model for `name`, which must be able to do `capability` (else 400)."""
        entry = self.resolve(name)
        if capability not in entry.capabilities:
            can = ", ".join(sorted(entry.capabilities)) or "nothing"
            kind = " (a multi-vector model: one vector per token)" if entry.multivector else ""
            raise BadRequest(
                f"Model {name!r}{kind} cannot {_VERB[capability]}; it can: {can}.",
                param="model",
                code="model_not_supported",
            )
        return entry

    def choose_defaults(self, chosen: dict[str, str]) -> None:
        """Fix the model each capability serves to requests that name none (TEI's API,
        infinity's without `model`): `chosen` (--default-model), else the first served model
        that can, a real cross-encoder before an embedding model's cosine ranking. Once, when
        every model is loaded; a chosen name that is not served, or cannot, stops start-up."""
        defaults: dict[str, ModelEntry] = {}
        for capability, name in chosen.items():
            try:
                defaults[capability] = self.require(name, capability)  # type: ignore[arg-type]
            except (ModelNotFound, BadRequest) as exc:
                raise EngineFailure(f"--default-model {capability}={name}: {exc.message}") from exc
        entries = self.entries()
        for capability in _VERB:
            able = [e for e in entries if capability in e.capabilities]
            if capability == "rerank":  # stable sorts: config order otherwise
                able.sort(key=lambda e: (e.cosine_rerank, e.sparse))
            elif capability == "embed":
                able.sort(key=lambda e: e.multivector)
            if able:
                defaults.setdefault(capability, able[0])
        self._defaults = defaults

    def default(self, capability: Capability, *, or_first: bool = False) -> ModelEntry:
        """The model for requests that name none (see choose_defaults); with `or_first`, the
        first served model when none can (tokenizing needs only a tokenizer)."""
        entry = self._defaults.get(capability)
        if entry is None and or_first and self._order:
            entry = self.resolve(self._order[0])
        if entry is None:
            raise BadRequest(
                f"No served model can {_VERB[capability]}.",
                param="model",
                code="model_not_supported",
            )
        return entry

    def by_index(self, index: int, capability: Capability) -> ModelEntry:
        """The tutorial's routes pick models by position in the configured list."""
        param = "model_index"
        if not 0 <= index < len(self._order):
            raise BadRequest(
                f"{param} {index} is out of range: {len(self._order)} model(s) are served "
                f"({', '.join(f'{i}={n}' for i, n in enumerate(self._order))}).",
                param=param,
                code="invalid_model_index",
            )
        return self.require(self._order[index], capability)


_VERB: dict[str, str] = {
    "embed": "embed text",
    "sparse": "make sparse vectors",
    "rerank": "rerank documents",
    "classify": "classify text",
    "image": "embed images",
    "audio": "embed audio",
}


# ---------------------------------------------------------------- loading


def engine_args(config: ModelConfig) -> Any:
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
        # Our own, cheaper warm-up runs instead (warm_up).
        model_warmup=False,
        compile=config.compile,
        bettertransformer=config.bettertransformer,
        # Priorities by character length: our own counter does the real token counting.
        lengths_via_tokenize=False,
    )
    if config.engine in backends.BACKENDS:
        # infinity-emb's torch embedder batches; its transformer is swapped for the export
        # (create_engine), so the torch weights need no acceleration.
        options.update(engine="torch", device="cpu", bettertransformer=False, compile=False)
    return EngineArgs(**options)


def create_engine(config: ModelConfig, export_dir: Path | None = None) -> Any:
    """Build (load weights of) one infinity-emb engine. Blocking: run it in a thread."""
    from infinity_emb import AsyncEmbeddingEngine

    try:
        args = engine_args(config)
    except (KeyError, ValueError, TypeError) as exc:
        raise EngineFailure(f"model {config.served_name!r}: invalid engine options: {exc}") from exc
    engine = AsyncEmbeddingEngine.from_args(args)
    replica = adapter.replica_of(engine)
    sparse = config.kind == "sparse" or (
        config.kind == "auto" and adapter.is_masked_lm(config.source)
    )
    try:
        if sparse and config.engine in backends.BACKENDS:
            raise ValueError(f"engine = {config.engine!r} cannot serve a sparse model")
        if config.engine in backends.BACKENDS:
            export = backends.prepare_for(config, export_dir or backends.default_export_dir())
            adapter.use_transformer_module(replica, backends.load_module(export))
        if sparse:
            adapter.serve_sparse(replica, config.source, config.trust_remote_code)
        adapter.apply_max_length(replica, config.max_length)
    except ValueError as exc:
        raise EngineFailure(f"model {config.served_name!r}: {exc}") from exc
    return engine


async def _probe(engine: Any, counter: TokenCounter | None) -> tuple[list[Any], bool]:
    """One embedding through the engine; and whether the token count the engine reported
    for it (if any) matches the model's tokenizer (only then is it trusted)."""
    vectors, _ = await engine.embed(["dimension probe"])
    expected = await counter.usage(["dimension probe"], truncate=True) if counter else None
    return vectors, adapter.engine_token_count(vectors) == expected


def calibration_file(config: ModelConfig, cache_dir: Path) -> Path:
    """Where a model's calibration embeddings are kept between starts: keyed by everything
    that changes them (source, revision, engine, dtype, pooling, the calibration texts, and
    for a local folder its files' sizes and times)."""
    parts = [config.source, config.revision or "", config.engine, config.quantize or ""]
    parts += [config.dtype, config.pooling_method, config.device, "\n".join(CALIBRATION_TEXTS)]
    folder = Path(config.source)
    if folder.is_dir():
        for f in sorted(folder.iterdir()):
            if f.is_file():
                st = f.stat()
                parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    return cache_dir / "calibration" / f"{backends.slug(config.served_name)}-{key}.npy"


async def calibrate(engine: Any, config: ModelConfig, cache_dir: Path | None) -> Quantizer:
    """The int8 calibration: the fixed texts' embeddings, read from the cache when one
    exists and still matches the model (its first text is embedded again and compared),
    else embedded (two batches: half a second on one CPU core for MiniLM) and cached."""
    path = calibration_file(config, cache_dir) if cache_dir is not None else None
    if path is not None and path.is_file():
        try:
            cached = np.load(path, allow_pickle=False)
        except (OSError, ValueError):
            cached = None
        if cached is not None and cached.ndim == 2 and len(cached) == len(CALIBRATION_TEXTS):
            first, _ = await engine.embed([CALIBRATION_TEXTS[0]])
            fresh = np.asarray(first[0], dtype=np.float32)
            if fresh.shape == cached[0].shape and np.allclose(fresh, cached[0], atol=1e-4):
                return Quantizer(cached, config.quantization_range, from_cache=True)
            logger.info(
                "model %r: cached calibration is stale; measuring again", config.served_name
            )
    vectors, _ = await engine.embed(list(CALIBRATION_TEXTS))
    matrix = np.asarray(vectors, dtype=np.float32)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.stem}.tmp-{os.getpid()}.npy")
            np.save(tmp, matrix, allow_pickle=False)
            tmp.replace(path)
        except OSError as exc:  # a read-only cache is fine: measure on every start
            logger.info("model %r: calibration not cached (%s)", config.served_name, exc)
    return Quantizer(matrix, config.quantization_range)


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
    try:
        prompts = Prompts.resolve(config.prompts, config.default_prompt, folder, folder_default)
    except ValueError as exc:
        raise EngineFailure(f"model {config.served_name!r}: {exc}") from exc
    dimensions = None
    multivector = False
    engine_counts = False
    raw_output = False
    quantizer = None
    sparse_size = adapter.sparse_size(replica)
    if sparse_size is not None:
        # A SPLADE model (create_engine): sparse vectors, and rerank by their dot product.
        caps = (caps - {"embed"}) | {"sparse", "rerank"}
        dimensions = sparse_size
        vectors, engine_counts = await _probe(engine, counter)
    elif "embed" in caps:
        counting = adapter.count_tokens_in_engine(replica)
        vectors, counts_match = await _probe(engine, counter)
        engine_counts = counting and counts_match
        raw_output = adapter.raw_vectors(vectors) is not None
        probe = np.asarray(vectors[0])
        dimensions = int(probe.shape[-1])
        multivector = probe.ndim == 2
        if not multivector:
            # Cosine similarity of embeddings gives every single-vector model a rerank ability.
            caps = caps | {"rerank"}
            quantizer = await calibrate(engine, config, cache_dir)
    return ModelEntry(
        config=config,
        engine=engine,
        capabilities=caps,
        dimensions=dimensions,
        max_length=max_length,
        counter=counter,
        token_decoder=decoder,
        logits=adapter.LogitsRunner.for_replica(replica, config.served_name),
        multivector=multivector,
        engine_counts=engine_counts,
        raw_output=raw_output,
        image_tokens=adapter.image_tokens(replica) if "image" in caps else 0,
        sampling_rate=adapter.sampling_rate(replica) if "audio" in caps else None,
        cosine_rerank="embed" in native and "rerank" in caps and sparse_size is None,
        sparse=sparse_size is not None,
        prompts=prompts,
        quantizer=quantizer,
        feeder=Feeder(engine, config.batch_size)
        if config.wave_batching and ("embed" in native or sparse_size is not None)
        else None,
    )


async def load_models(registry: Registry, export_dir: Path | None = None) -> None:
    """Load, start and warm every configured model in order, and register it."""
    cl100k = await in_daemon_thread(Cl100kDecoder, name="cl100k")

    async def load(config: ModelConfig) -> ModelEntry:
        started = time.perf_counter()
        logger.info("loading model %r from %s", config.served_name, config.model)
        try:
            engine = await in_daemon_thread(
                create_engine, config, export_dir, name=config.served_name
            )
            registry.engines.append(engine)
            await engine.astart()
            entry = await describe(
                config, engine, cl100k, export_dir or backends.default_export_dir()
            )
            if config.model_warmup:
                await warm_up(entry)
        except EngineFailure:
            raise
        except Exception as exc:
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

    # One at a time: transformers' from_pretrained builds models under process-global
    # contexts (meta-device init), and two loads in parallel threads corrupt each other
    # ("Cannot copy out of meta tensor").
    for config in registry.configs:
        registry.add(await load(config))


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
    """Stop every engine that was started, as one AsyncEngineArray."""
    if not registry.engines:
        return
    from infinity_emb import AsyncEngineArray

    for entry in registry.entries():
        if entry.logits is not None:
            entry.logits.close()
        if entry.feeder is not None:
            entry.feeder.close()
    engines, registry.engines = registry.engines, []
    await AsyncEngineArray(engines=engines).astop()
