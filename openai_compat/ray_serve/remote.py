"""A model served by another process (a Ray Serve model deployment), seen as a local one.

The ingress runs our whole app (every dialect, auth, limits, errors, the exact cache, the
playground) on a registry whose entries look like local ones but whose engine is a
`RemoteEngine`: each engine call is one DeploymentHandle call to the model deployment,
where the real engine and its wave batching (engine/infinity/feeder.py) run, so batching
sees all the traffic of a model replica. What the API layer needs to know about a model
(capabilities, window, prompts, int8 ranges, its tokenizer for counting and truncating) comes
once from the deployment's `describe()`; the tokenizer is rebuilt here from its JSON.

Vectors cross the wire as plain arrays plus their token counts and norms (`pack`/`unpack`):
numpy's pickling drops the attributes of TokenCountedArray.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from openai_compat.engine.bge_m3 import M3Output
from openai_compat.engine.build import engine_package
from openai_compat.engine.priority import in_background
from openai_compat.engine.usage import TokenCountedArray
from openai_compat.formats.sparse import SparseVector
from openai_compat.formats.token_ids import Cl100kDecoder, ModelTokenIdDecoder
from openai_compat.formats.tokens import TokenCounter
from openai_compat.frame.settings import ModelConfig, Settings
from openai_compat.ground import logs
from openai_compat.ground.errors import ServiceUnavailable
from openai_compat.models.registry import ModelEntry, Registry
from openai_compat.ray_serve.metrics import RayMetricsExport

# Ray's errors that mean "this replica is gone or cannot take the call now": the request is
# answered 503 with Retry-After (clients and SDKs retry), never a hang or a 500.
_UNAVAILABLE = (
    "ActorDiedError",
    "ActorUnavailableError",
    "RayActorError",
    "BackPressureError",
    "DeploymentUnavailableError",
    "ObjectLostError",
    "OwnerDiedError",
    "WorkerCrashedError",
    "NodeDiedError",
)


def pack(vectors: Sequence[Any]) -> dict[str, Any]:
    """Embeddings -> a picklable dict keeping each one's token count and raw norm."""
    if vectors and isinstance(vectors[0], SparseVector):
        return {"sparse": [(v.indices, v.values, v.tokens) for v in vectors]}
    if any(isinstance(v, M3Output) for v in vectors):  # BGE-M3's asked outputs, as they are
        return {"objects": list(vectors)}
    return {
        "arrays": [np.asarray(v) for v in vectors],
        "tokens": [getattr(v, "tokens", None) for v in vectors],
        "norms": [getattr(v, "norm", None) for v in vectors],
    }


def unpack(packed: dict[str, Any]) -> list[Any]:
    if "sparse" in packed:
        return [SparseVector(i, v, t) for i, v, t in packed["sparse"]]
    if "objects" in packed:
        return list(packed["objects"])
    out: list[Any] = []
    for array, tokens, norm in zip(
        packed["arrays"], packed["tokens"], packed["norms"], strict=True
    ):
        if tokens is None:
            out.append(array)
            continue
        v = np.asarray(array).view(TokenCountedArray)
        v.tokens, v.norm = tokens, norm
        out.append(v)
    return out


@dataclass
class Ranked:
    """infinity-emb's rerank result, as the scoring code reads it."""

    index: int
    relevance_score: float


class RemoteEngine:
    """The engine calls the API layer makes, each forwarded to the model deployment."""

    is_running = True  # replicas are Ray's to replace (ModelServer.check_health)

    def __init__(self, handle: Any, name: str, description: dict[str, Any]) -> None:
        self.handle, self.name = handle, name
        self.capabilities = set(description["native"])
        self._labels: dict[str, str] = description.get("id2label") or {}
        self._pooling: str | None = description.get("pooling_mode")

    async def _call(self, method: str, *args: Any, **options: Any) -> Any:
        """One call to the deployment; a Batch API line's (inside priority.background()) says
        so, and the model replica runs it after live requests."""
        call: Callable[..., Awaitable[Any]] = getattr(self.handle, method).remote
        try:
            return await call(*args, background=in_background(), **options)
        except Exception as exc:
            if any(t.__name__ in _UNAVAILABLE for t in type(exc).__mro__):
                raise ServiceUnavailable(
                    f"Model {self.name!r}: its replica is unavailable ({type(exc).__name__}); "
                    "retry shortly.",
                    code="model_replica_unavailable",
                    headers={"Retry-After": "1"},
                ) from exc
            raise

    async def embed(
        self,
        sentences: Sequence[str],
        task: str | None = None,
        prompt: str | None = None,
        outputs: frozenset[str] | None = None,
    ) -> tuple[list[Any], int]:
        args: tuple[Any, ...] = (list(sentences),) if task is None else (list(sentences), task)
        options: dict[str, Any] = {"prompt": prompt} if prompt else {}
        if outputs:
            options["outputs"] = sorted(outputs)
        packed, usage = await self._call("embed", *args, **options)
        return unpack(packed), usage

    async def image_embed(
        self, *, images: Sequence[Any], prompt: str | None = None
    ) -> tuple[list[Any], int]:
        options = {"prompt": prompt} if prompt else {}
        packed, usage = await self._call("image_embed", list(images), **options)
        return unpack(packed), usage

    async def audio_embed(self, *, audios: Sequence[Any]) -> tuple[list[Any], int]:
        packed, usage = await self._call("audio_embed", list(audios))
        return unpack(packed), usage

    async def rerank(self, *, query: str, docs: Sequence[str]) -> tuple[list[Ranked], int]:
        rows, usage = await self._call("rerank", query, list(docs))
        return [Ranked(i, s) for i, s in rows], usage

    async def classify(self, *, sentences: Sequence[Any]) -> tuple[list[Any], int]:
        result: tuple[list[Any], int] = await self._call("classify", list(sentences))
        return result

    async def token_vectors(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        result: list[tuple[np.ndarray, np.ndarray]] = await self._call("token_vectors", texts)
        return result

    async def astart(self) -> None:
        """The deployment starts the engine: nothing to start here."""

    async def astop(self) -> None:
        """The deployment owns the engine: nothing to stop here."""

    # What contract.Engine's questions the ingress asks, answered from the description (the
    # ingress builds its entry from it, not from these: ModelServer.describe).
    kind = "other"
    sampling_rate = None
    modes = messages = False
    modalities: frozenset[str] = frozenset({"text"})

    def labels(self) -> dict[str, str]:
        return self._labels

    def pooling_mode(self) -> str | None:
        return self._pooling

    def late_runner(self) -> RemoteEngine:
        return self  # the deployment's late runner gives the token vectors

    def close(self) -> None:
        """As a late runner: the deployment's own closes with its model."""

    def queue_length(self) -> int:
        return 0  # queued in the deployment (Ray Serve's own queue metrics)

    def batch_stats(self) -> None:
        return None

    def torch_modules(self) -> list[Any]:
        return []  # the weights are in the deployment's process

    def contract_problems(self) -> list[str]:
        return []


class RemoteLogits:
    """infinity/hooks.LogitsRunner's interface (raw classification logits), on the deployment."""

    def __init__(self, engine: RemoteEngine) -> None:
        self.engine = engine

    async def logits(self, texts: Sequence[Any]) -> list[list[dict[str, Any]]]:
        result: list[list[dict[str, Any]]] = await self.engine._call("logits", list(texts))
        return result

    def close(self) -> None:
        pass


def remote_entry(
    description: dict[str, Any], handle: Any, cl100k: Cl100kDecoder | None
) -> ModelEntry:
    """The ingress's entry for a model a deployment serves (see ModelServer.describe)."""
    config = description["config"]
    engine = RemoteEngine(handle, config.served_name, description)
    counter: TokenCounter | None = None
    decoder: Any = None
    if description["tokenizer"] is not None:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_str(description["tokenizer"])
        counter = TokenCounter(tokenizer, description["max_length"])
        if config.token_ids == "model":
            decoder = ModelTokenIdDecoder(tokenizer)
    if config.token_ids == "cl100k_base":
        decoder = cl100k
    fields = {k: description[k] for k in ENTRY_FIELDS}
    return ModelEntry(
        config=config,
        engine=engine,
        capabilities=frozenset(description["capabilities"]),
        counter=counter,
        token_decoder=decoder,
        logits=cast(Any, RemoteLogits(engine)) if description["logits"] else None,
        **fields,
    )


# The ModelEntry fields a description carries as they are.
ENTRY_FIELDS = (
    "dimensions",
    "outputs",
    "max_length",
    "multivector",
    "modes",
    "engine_counts",
    "raw_output",
    "exact_token_ids",
    "sparse",
    "image_tokens",
    "image_side",
    "precision",
    "sampling_rate",
    "cosine_rerank",
    "modalities",
    "messages",
    "prompts",
    "quantizer",
    "created",
    "load_seconds",
)


async def worker_start(settings: Settings) -> None:
    """The start of every replica (model, ingress, batch server): import the package of the
    configured models' engine off the loop (the request path needs its exception types: not
    seconds into the first request; infinity-emb only where a model runs on it), then our
    logging, as a Ray worker is not started by our CLI. infinity-emb's import installs its Rich
    console handler, hence after it; onto the process's own stderr (Ray's worker log), which
    Serve may have swapped for its logger."""
    package = engine_package(c.engine for c in settings.served_models())
    await asyncio.to_thread(importlib.import_module, package)
    logs.configure(settings.log_level, settings.log_format, sys.__stderr__)


async def _describe(handle: Any, config: ModelConfig, limit: float = 600.0) -> dict[str, Any]:
    """A model deployment's description, from a replica running `config`: during a rollout
    a call may still reach an old replica, whose model is configured otherwise."""
    deadline = time.monotonic() + limit
    while True:
        description: dict[str, Any] = await handle.describe.remote()
        if description["config"] == config:
            return description
        if time.monotonic() > deadline:  # Serve retries the constructor
            raise RuntimeError(f"model {config.served_name!r}: no replica runs this config")
        await asyncio.sleep(1.0)


async def remote_registry(settings: Settings, names: list[str], handles: Any) -> Registry:
    """A registry of remote entries, one per model deployment (the ingress's and the batch
    server's), described by replicas that run the current config."""
    from openai_compat.models.cache import EmbeddingCache

    configs = {c.served_name: c for c in settings.served_models()}
    descriptions = await asyncio.gather(
        *(_describe(h, configs[n]) for n, h in zip(names, handles, strict=True))
    )
    cl100k = await asyncio.to_thread(Cl100kDecoder)
    registry = Registry(settings.served_models())
    if settings.cache_bytes:
        registry.cache = EmbeddingCache(settings.cache_bytes, per_key=settings.cache_scope == "key")
    for name, description, handle in zip(names, descriptions, handles, strict=True):
        assert description["config"].served_name == name
        registry.add(remote_entry(description, handle, cl100k))
    return registry


async def remote_app(
    settings: Settings, names: list[str], handles: Any, *, batch_runner: bool
) -> tuple[Any, RayMetricsExport]:
    """Our app on a registry of remote entries (the ingress's, the batch server's), and the
    export of its metrics to Ray (ray_serve/metrics.py)."""
    from openai_compat.web.app import create_app

    await worker_start(settings)
    registry = await remote_registry(settings, names, handles)
    app = create_app(settings, registry, batch_runner=batch_runner)
    return app, RayMetricsExport.running(app.state.metrics.registry)
