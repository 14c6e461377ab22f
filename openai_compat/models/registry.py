"""Served names and aliases -> one loaded model each (entry.py), with what it can do. Strict
lookups, within the current key's scope; the defaults for requests that name no model."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from openai_compat.frame.settings import ModelConfig, check_unique_names
from openai_compat.ground.errors import (
    BadRequest,
    ModelNotFound,
    NotFound,
    ServiceUnavailable,
)
from openai_compat.models.cache import EmbeddingCache
from openai_compat.models.entry import Capability, ModelEntry, owned_by
from openai_compat.tenants.limits import current as current_caller

if TYPE_CHECKING:
    from openai_compat.models.pool import ModelPool

__all__ = ["Capability", "EngineFailure", "ModelEntry", "Registry", "owned_by"]


class EngineFailure(RuntimeError):
    """A model could not be loaded or started; stops the server."""


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

    def dead(self) -> list[str]:
        """The loaded models whose engine has died (the health probe's answer)."""
        return [e.name for e in self.entries() if not e.alive()]

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

    async def require_dense(self, name: str, holds: str) -> ModelEntry:
        """The embedding model `name`, for a dialect whose answer (`holds`: what it holds, in
        its words) has one dense vector per input: a multi-vector or sparse model is a 400."""
        entry = await self.require(name, "embed")
        if entry.multivector or entry.sparse:
            kind = "one vector per token" if entry.multivector else "sparse vectors"
            raise BadRequest(
                f"Model {name!r} gives {kind}; {holds}. Use /v1/embeddings.",
                param="model",
                code="model_not_supported",
            )
        return entry

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

    async def first(self) -> ModelEntry:
        """The first served model the caller can see, loaded and leased (TEI's POST / and
        /info serve "the" model); 404 when the caller's scope holds none."""
        visible = [n for n in self._order if self.visible(n)]
        if not visible:
            raise NotFound("This key may use no served model.", code="model_not_found")
        return await self.resolve(visible[0])

    async def default(self, capability: Capability, *, or_first: bool = False) -> ModelEntry:
        """The model for requests that name none (see choose_defaults), among the models the
        caller can see: the server's default when it is in the caller's scope, else the best
        able model in it; with `or_first`, the first such model when none can (tokenizing
        needs only a tokenizer)."""
        name = self._defaults.get(capability)
        if name is None or not self.visible(name):
            name = await self._discover(capability)
        if name is None and or_first:
            return await self.first()
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
        visible = [n for n in self._order if self.visible(n)]
        seen = [self._seen[n] for n in visible if n in self._seen]
        name = _best(seen, capability)
        for candidate in [] if name is not None else visible:
            if candidate in self._seen:
                continue  # its abilities are known: it cannot
            entry = await self.resolve(candidate)  # the only way to learn what it can do
            if capability in entry.capabilities:
                name = candidate
                break
            if self.pool is not None:
                self.pool.give_back(candidate)
        if name is not None and len(visible) == len(self._order):  # not one key's view
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
            if at is not None and self.visible(at):
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
        """The positions and names the caller may see (another key's models stay unnamed)."""
        shown = [f"{i}={n}" for i, n in enumerate(self._order) if self.visible(n)]
        return ", ".join(shown) or "no model this key may use"


def _best(entries: Sequence[ModelEntry], capability: Capability) -> str | None:
    """The default among `entries` (config order) for a capability: for rerank a real
    cross-encoder, then BGE-M3's hybrid, then MaxSim, then sparse, then cosine ranking; for
    embed a one-vector model before a multi-vector one."""
    able = [e for e in entries if capability in e.capabilities]
    if capability == "rerank":  # stable sorts: config order otherwise
        able.sort(key=lambda e: (e.cosine_rerank, e.sparse, e.multivector, bool(e.outputs)))
    elif capability == "embed":
        able.sort(key=lambda e: e.multivector)
    elif capability == "sparse":  # a SPLADE model before BGE-M3's lexical weights
        able.sort(key=lambda e: bool(e.outputs))
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
