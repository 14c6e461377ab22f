"""Served names and aliases -> one loaded model each, with what it can do. Strict lookups."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from openai_compat.engine import adapter
from openai_compat.engine.infinity.feeder import Feeder
from openai_compat.engine.priority import in_background
from openai_compat.errors import BadRequest, ModelNotFound, RateLimited, ServiceUnavailable
from openai_compat.formats.compact import Quantizer
from openai_compat.formats.prompts import Prompts
from openai_compat.formats.tokens import TokenCounter
from openai_compat.models.cache import EmbeddingCache
from openai_compat.settings import ModelConfig, check_unique_names
from openai_compat.tenants.limits import current as current_caller
from openai_compat.tenants.shares import QueueShares

if TYPE_CHECKING:
    from openai_compat.models.pool import ModelPool

Capability = Literal["embed", "sparse", "rerank", "classify", "image", "audio"]


def owned_by(model: str) -> str:
    """A hub id's organisation; ours for local folders and builtins."""
    if "/" in model and not model.startswith(("/", ".", "builtin:")):
        return model.split("/")[0]
    return "openai-compat"


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
    logits: Any | None = None  # raw classification logits: LogitsRunner, NativeEngine
    late: Any | None = None  # engine.late.LateRunner, made on the first late-chunking request
    multivector: bool = False  # one vector per token (ColBERT-style), not one per input
    modes: bool = False  # queries and documents embedded apart (MultiVectorEncoder's task)
    engine_counts: bool = False  # the engine reports each input's tokens (no 2nd pass)
    raw_output: bool = False  # vectors keep their pre-normalisation norm (TEI normalize=false)
    exact_token_ids: bool = False  # token_ids = "model": ids reach the model as given
    sparse: bool = False  # SPLADE: sparse vectors (sparse.SparseVector), dimensions = vocabulary
    image_tokens: int = 0  # tokens one image is to the model (ViT patches + class token)
    sampling_rate: int | None = None  # what audio inputs must be sampled at
    cosine_rerank: bool = False  # reranks by embedding similarity (no cross-encoder)
    prompts: Prompts = field(default_factory=Prompts)
    quantizer: Quantizer | None = None  # int8/uint8 ranges (see formats/compact.py)
    feeder: Feeder | None = None  # embed calls in length-sorted waves (engine/infinity/feeder.py)
    cache: EmbeddingCache | None = None  # exact vectors of texts seen before (cache.py)
    queued: int = 0  # live inputs admitted and not yet answered
    inflight: int = 0  # live requests in the engine's hands
    background_queued: int = 0  # the same for Batch API lines (their own budget)
    background_inflight: int = 0
    created: int = field(default_factory=lambda: int(time.time()))
    load_seconds: float = 0.0
    shares: QueueShares = field(default_factory=QueueShares, repr=False)  # with keys

    @property
    def name(self) -> str:
        return self.config.served_name

    @property
    def owned_by(self) -> str:
        return owned_by(self.config.model)

    @contextmanager
    def admit(self, inputs: int, limit: int) -> Iterator[None]:
        """Admission control: refuse (429) work that would push the queued inputs past `limit`.

        A request is always admitted onto an idle model, so one larger than the limit can
        still run; the queue never holds more than `limit` plus one request's inputs. Live
        requests and Batch API lines (inside feeder.background()) have a budget each: a job
        never uses up live admission, and live traffic never starves a job of its own.
        """
        background = in_background()
        queued = self.background_queued if background else self.queued
        caller = current_caller.get()
        if caller is not None:
            key = caller.key
            self.shares.admit(self.name, key.name, key.weight, inputs, limit, background)
        elif limit and queued and queued + inputs > limit:
            raise RateLimited(
                f"Model {self.name!r} has {queued} inputs queued (limit {limit}); retry shortly.",
                headers={"Retry-After": "1"},
            )
        if background:
            self.background_queued += inputs
            self.background_inflight += 1
        else:
            self.queued += inputs
            self.inflight += 1
        try:
            yield
        finally:
            if background:
                self.background_queued -= inputs
                self.background_inflight -= 1
            else:
                self.queued -= inputs
                self.inflight -= 1
            if caller is not None:
                self.shares.release(caller.key.name, inputs, background)

    @property
    def pending(self) -> int:
        """Inputs admitted and not yet answered, live and background."""
        return self.queued + self.background_queued

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

    async def embed(self, texts: list[str], mode: str | None = None) -> tuple[list[Any], int]:
        """The engine's embed (vectors, usage), through the exact cache (cache.py) and the
        feeder where there are. `mode` ("query", "document"): a model with modes only."""
        if mode is not None and not self.modes:
            raise RuntimeError(f"model {self.name!r} has no query and document modes")

        async def compute(todo: list[str]) -> tuple[list[Any], int]:
            return await self._embed(todo, mode)

        if self.cache is not None:
            return await self.cache.embed(self.name, texts, compute, mode=mode)
        return await compute(texts)

    async def _embed(self, texts: list[str], mode: str | None) -> tuple[list[Any], int]:
        if mode is not None:  # the native engine (and Ray replicas of it): no feeder
            moded: tuple[list[Any], int] = await self.engine.embed(texts, mode)
            return moded
        if self.feeder is not None:
            return await self.feeder.embed(texts)
        result: tuple[list[Any], int] = await self.engine.embed(texts)
        return result

    def alive(self) -> bool:
        """False once the engine's batching machinery has died."""
        return adapter.batcher_alive(self.engine)


class Registry:
    """Served name or alias -> ModelEntry, for every configured model; the loaded ones have
    an entry. With a pool (pool.py), `acquire` loads a model that is not loaded and leases it
    to the request; without one (a registry filled by hand) every model must be loaded."""

    def __init__(self, configs: Sequence[ModelConfig]) -> None:
        check_unique_names(list(configs))
        self.configs = tuple(configs)
        self._configs = {c.served_name: c for c in configs}
        self._entries: dict[str, ModelEntry] = {}  # served name -> loaded entry
        self._names: dict[str, str] = {}  # served name or alias -> served name
        for c in configs:
            for name in (c.served_name, *c.aliases):
                self._names[name] = c.served_name
        self._order: list[str] = [c.served_name for c in configs]
        self.engines: list[Any] = []  # every engine started, for shutdown
        self._defaults: dict[str, str] = {}  # capability -> served name (choose_defaults)
        # served name -> what it could do at its last load (lazy models: known once loaded)
        self._seen: dict[str, ModelEntry] = {}
        self.cache: EmbeddingCache | None = None  # shared by the models that use one
        self.pool: ModelPool | None = None

    # ------------------------------------------------------------ filling

    def add(self, entry: ModelEntry) -> None:
        if entry.name in self._entries or self._names.get(entry.name, entry.name) != entry.name:
            raise ValueError(f"duplicate model name or alias {entry.name!r}")
        if self.cache is not None and entry.config.cache and not entry.sparse:
            entry.cache = self.cache
        self._entries[entry.name] = entry
        self._seen[entry.name] = entry
        for name in (entry.name, *entry.config.aliases):
            self._names[name] = entry.name

    def remove(self, entry: ModelEntry) -> None:
        """Forget an unloaded model's entry (its names stay: a request loads it again)."""
        if self._entries.get(entry.name) is entry:
            del self._entries[entry.name]
        self.engines = [e for e in self.engines if e is not entry.engine]

    @property
    def complete(self) -> bool:
        return len(self._entries) == len(self.configs)

    def visible(self, served: str) -> bool:
        """Whether the current request's key may use the model served as `served` (a key's
        `models` name served names or aliases; each grants the model with all its names).
        Outside a request, or for a key without `models`: every model."""
        caller = current_caller.get()
        if caller is None or caller.key.models is None:
            return True
        return served in {self._names.get(m) for m in caller.key.models}

    def _served(self, name: str) -> str:
        """The served name for `name`, or 404 model_not_found: a model outside the current
        key's scope is answered exactly as one that does not exist."""
        served = self._names.get(name)
        if served is None or not self.visible(served):
            raise ModelNotFound(name, self.served_names())
        return served

    def config(self, name: str) -> ModelConfig:
        """The configuration behind a served name or alias (loaded or not)."""
        return self._configs[self._served(name)]

    def loaded(self, name: str) -> ModelEntry | None:
        """The entry of a served name or alias if that model is loaded now (no lease)."""
        served = self._names.get(name)
        return self._entries.get(served) if served is not None else None

    def __iter__(self) -> Iterable[ModelEntry]:
        return iter([self._entries[n] for n in self._order if n in self._entries])

    def entries(self) -> list[ModelEntry]:
        return list(self.__iter__())

    def served_names(self) -> list[str]:
        """Every name the current client may use: served names, then aliases."""
        names = [n for n in self._order if self.visible(n)]
        names += [a for c in self.configs if self.visible(c.served_name) for a in c.aliases]
        return names

    def all_names(self) -> list[str]:
        """Every served name and alias, whoever asks (the keys file is checked against it)."""
        return list(self._names)

    # ------------------------------------------------------------ lookups

    async def resolve(self, name: str) -> ModelEntry:
        """The model `name` names, loaded (pool.py) and leased to the current request."""
        served = self._served(name)
        if self.pool is not None:
            return await self.pool.acquire(served)
        entry = self._entries.get(served)
        if entry is None:
            raise ServiceUnavailable(f"Model {name!r} is not loaded.", code="model_not_loaded")
        return entry

    async def require(self, name: str, capability: Capability) -> ModelEntry:
        """The model for `name`, which must be able to do `capability` (else 400)."""
        return self.check(await self.resolve(name), name, capability)

    def check(self, entry: ModelEntry, name: str, capability: Capability) -> ModelEntry:
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
        infinity's without `model`): `chosen` (--default-model), else the first loaded model
        that can, a real cross-encoder before an embedding model's cosine ranking. Once, when
        the eager models are loaded; a chosen name that is not served, or a loaded one that
        cannot, stops start-up (a lazy one's abilities are checked when it loads). A
        capability no eager model has is found among the lazy models on first use
        (`default`)."""
        defaults: dict[str, str] = {}
        for capability, name in chosen.items():
            try:
                self.config(name)
                if (entry := self.loaded(name)) is not None:
                    self.check(entry, name, capability)  # type: ignore[arg-type]
            except (ModelNotFound, BadRequest) as exc:
                raise EngineFailure(f"--default-model {capability}={name}: {exc.message}") from exc
            defaults[capability] = name
        for capability in _VERB:
            best = _best(self.entries(), capability)  # type: ignore[arg-type]
            if best is not None:
                defaults.setdefault(capability, best)
        self._defaults = defaults

    async def default(self, capability: Capability, *, or_first: bool = False) -> ModelEntry:
        """The model for requests that name none (see choose_defaults); with `or_first`, the
        first served model when none can (tokenizing needs only a tokenizer)."""
        name = self._defaults.get(capability) or await self._discover(capability)
        if name is None and or_first and self._order:
            return await self.resolve(self._order[0])
        if name is None:
            raise BadRequest(
                f"No served model can {_VERB[capability]}.",
                param="model",
                code="model_not_supported",
            )
        return await self.require(name, capability)

    async def _discover(self, capability: Capability) -> str | None:
        """A default for a capability no eager model has, from the configuration: the best
        of the models seen able at a load (loaded now or before), else the first model in
        config order never loaded yet that turns out able once loaded (each one looked at
        and unable is given back). Kept as the default from then on."""
        seen = [self._seen[n] for n in self._order if n in self._seen]
        name = _best(seen, capability)
        for candidate in [] if name is not None else self._order:
            if candidate in self._seen:
                continue  # its abilities are known: it cannot
            entry = await self.resolve(candidate)  # the only way to learn what it can do
            if capability in entry.capabilities:
                name = candidate
                break
            if self.pool is not None:
                self.pool.give_back(candidate)
        if name is not None:
            name = self._defaults.setdefault(capability, name)
        return name

    async def by_index(
        self, index: int | None, capability: Capability, position: int
    ) -> ModelEntry:
        """The tutorial's routes pick models by position in the configured list. Without an
        index, the tutorial's `position` for the capability (configs/production.toml's
        order) when the model there can; else this server's default for the capability, so
        the routes work on any server (the default one serves a single text model)."""
        param = "model_index"
        if index is None:
            at = self._order[position] if position < len(self._order) else None
            if at is not None:
                entry = await self.resolve(at)
                if capability in entry.capabilities:
                    return entry
                if self.pool is not None:  # not this one: it must not hold room for the next
                    self.pool.give_back(entry.name)
            if capability in self._defaults or await self._discover(capability):
                return await self.default(capability)
            raise BadRequest(
                f"No served model can {_VERB[capability]}. The tutorial's routes expect its "
                f"model list (configs/production.toml: {TUTORIAL_ORDER}); this server serves "
                f"{self._listing()}.",
                param=param,
                code="model_not_supported",
            )
        if not 0 <= index < len(self._order):
            raise BadRequest(
                f"{param} {index} is out of range: {len(self._order)} model(s) are served "
                f"({self._listing()}). The tutorial's indices follow configs/production.toml: "
                f"{TUTORIAL_ORDER}.",
                param=param,
                code="invalid_model_index",
            )
        return await self.require(self._order[index], capability)

    def _listing(self) -> str:
        return ", ".join(f"{i}={n}" for i, n in enumerate(self._order))


def _best(entries: Sequence[ModelEntry], capability: Capability) -> str | None:
    """The default among `entries` (config order) for a capability: for rerank a real
    cross-encoder, then MaxSim, then sparse, then cosine ranking; for embed a one-vector
    model before a multi-vector one."""
    able = [e for e in entries if capability in e.capabilities]
    if capability == "rerank":  # stable sorts: config order otherwise
        able.sort(key=lambda e: (e.cosine_rerank, e.sparse, e.multivector))
    elif capability == "embed":
        able.sort(key=lambda e: e.multivector)
    return able[0].name if able else None


# The tutorial's model positions (configs/production.toml), named in its routes' errors.
TUTORIAL_ORDER = "0 CLIP, 1 text embeddings, 2 reranker, 3 classifier"

_VERB: dict[str, str] = {
    "embed": "embed text",
    "sparse": "make sparse vectors",
    "rerank": "rerank documents",
    "classify": "classify text",
    "image": "embed images",
    "audio": "embed audio",
}
