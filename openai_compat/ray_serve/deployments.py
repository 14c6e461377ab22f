"""The Ray Serve deployments: `ModelServer` (one model's engine and its wave batching, one
deployment per configured model) and `Ingress` (our whole FastAPI app, calling the models
through DeploymentHandles; ray_serve/remote.py)."""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from typing import Any

from openai_compat import cpus, logs, memory
from openai_compat.engine import adapter, late
from openai_compat.errors import APIError, api_error_response, family_of
from openai_compat.loading import ModelLoader, stop_engines
from openai_compat.ray_serve.remote import ENTRY_FIELDS, pack, remote_entry
from openai_compat.registry import ModelEntry, Registry
from openai_compat.settings import ModelConfig, RayOptions, Settings
from openai_compat.tokens import Cl100kDecoder

logger = logging.getLogger("openai_compat")

# The Batch API keeps its jobs in one process's data dir; on Ray its lines run with
# `openai-compat batch --ray` (Ray Data) instead.
BATCH_PATHS = ("/v1/files", "/v1/batches", "/files", "/batches")


class ModelServer:
    """One model, loaded as the single-process server loads it (engine, warm-up, int8
    calibration, wave batching); each method is one engine call from an ingress."""

    async def __init__(self, settings: Settings, name: str) -> None:  # type: ignore[misc]
        (config,) = [c for c in settings.served_models() if c.served_name == name]
        await asyncio.to_thread(importlib.import_module, "infinity_emb")
        logs.reclaim_root()
        threads = cpus.engine_threads()  # Ray sets OMP_NUM_THREADS to the replica's num_cpus
        cpus.apply_to_torch(threads)
        memory.freeze_imports()
        self.registry = Registry([config])
        self.entry: ModelEntry = await ModelLoader(self.registry, settings.exports())(config)
        self.registry.add(self.entry)
        logger.info("replica of %r ready (%d threads)", name, threads)

    def describe(self) -> dict[str, Any]:
        entry = self.entry
        replica = adapter.replica_of(entry.engine)
        tokenizer = adapter.backend_tokenizer(replica)
        return {
            "config": entry.config,
            "capabilities": sorted(entry.capabilities),
            "native": sorted(entry.engine.capabilities),
            "tokenizer": tokenizer.to_str() if entry.counter and tokenizer else None,
            "logits": entry.logits is not None,
            "id2label": adapter.id2label(replica),
            "pooling_mode": late.pooling_mode(replica),
            **{field: getattr(entry, field) for field in ENTRY_FIELDS},
        }

    async def embed(self, texts: list[str]) -> tuple[dict[str, Any], int]:
        vectors, usage = await self.entry.embed(texts)
        return pack(vectors), usage

    async def image_embed(self, images: list[Any]) -> tuple[dict[str, Any], int]:
        vectors, usage = await self.entry.engine.image_embed(images=images)
        return pack(vectors), usage

    async def audio_embed(self, audios: list[Any]) -> tuple[dict[str, Any], int]:
        vectors, usage = await self.entry.engine.audio_embed(audios=audios)
        return pack(vectors), usage

    async def rerank(self, query: str, docs: list[str]) -> tuple[list[tuple[int, float]], int]:
        results, usage = await self.entry.engine.rerank(query=query, docs=docs)
        return [(int(r.index), float(r.relevance_score)) for r in results], usage

    async def classify(self, sentences: list[Any]) -> tuple[list[Any], int]:
        result: tuple[list[Any], int] = await self.entry.engine.classify(sentences=sentences)
        return result

    async def logits(self, texts: list[Any]) -> list[list[dict[str, Any]]]:
        assert self.entry.logits is not None
        return await self.entry.logits.logits(texts)

    async def token_vectors(self, texts: list[str]) -> list[Any]:
        return await late.token_vectors(adapter.replica_of(self.entry.engine), texts)

    def check_health(self) -> None:
        """Ray's health check: a replica whose engine died is replaced."""
        if not self.entry.alive():
            raise RuntimeError(f"the engine of {self.entry.name!r} stopped")

    async def __del__(self) -> None:
        await stop_engines(self.registry)


class BatchNotServed(APIError):
    status = 501
    type = "invalid_request_error"
    default_code = "not_served_on_ray"


def without_batch_api(app: Any) -> Any:
    """The app, with the Batch API's routes answered 501 and a pointer to its Ray path."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and path.startswith(BATCH_PATHS):
            error = BatchNotServed(
                "The Batch API is not served by `openai-compat serve --ray`: its job state "
                "lives in one process. Run batch files on the cluster with `openai-compat "
                "batch INPUT -o OUTPUT --ray` (Ray Data), or on a single-process server.",
                param=None,
            )
            await api_error_response(error, family_of(path))(scope, receive, send)
            return
        await app(scope, receive, send)

    return wrapped


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


class Ingress:
    """Our whole app on a registry of remote entries, one per model deployment."""

    async def __init__(  # type: ignore[misc]
        self, settings: Settings, names: list[str], *handles: Any
    ) -> None:
        from openai_compat.app import create_app
        from openai_compat.cache import EmbeddingCache

        configs = {c.served_name: c for c in settings.served_models()}
        descriptions = await asyncio.gather(
            *(_describe(h, configs[n]) for n, h in zip(names, handles, strict=True))
        )
        cl100k = await asyncio.to_thread(Cl100kDecoder)
        registry = Registry(settings.served_models())
        if settings.cache_bytes:
            registry.cache = EmbeddingCache(settings.cache_bytes)
        for name, description, handle in zip(names, descriptions, handles, strict=True):
            assert description["config"].served_name == name
            registry.add(remote_entry(description, handle, cl100k))
        self.asgi = without_batch_api(create_app(settings, registry))

    def __serve_build_asgi_app__(self) -> Any:
        return self.asgi


def _scaling(options: RayOptions) -> dict[str, Any]:
    extra: dict[str, Any] = (
        {"autoscaling_config": options.autoscaling_config}
        if options.autoscaling_config
        else {"num_replicas": options.num_replicas}
    )
    if options.max_replicas_per_node is not None:
        extra["max_replicas_per_node"] = options.max_replicas_per_node
    return extra


def model_deployment(settings: Settings, name: str) -> Any:
    """The bound ModelServer deployment of one configured model, with its [models.ray]."""
    (config,) = [c for c in settings.served_models() if c.served_name == name]
    options = config.ray
    extra = _scaling(options)
    return (
        _deployment(ModelServer)
        .options(
            name=deployment_name(name),
            ray_actor_options=options.ray_actor_options,
            max_ongoing_requests=options.max_ongoing_requests or 64,
            graceful_shutdown_timeout_s=settings.graceful_timeout,
            health_check_period_s=5,
            **extra,
        )
        .bind(settings, name)
    )


def _deployment(cls: type) -> Any:
    from ray import serve  # the `ray` extra: imported only where Ray Serve runs

    made: Any = serve.deployment(cls)
    return made


def deployment_name(model: str) -> str:
    return "model-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in model)


def application(settings: Settings) -> Any:
    """The Ray Serve application: the ingress and one deployment per configured model."""
    names = [c.served_name for c in settings.served_models()]
    models = [model_deployment(settings, name) for name in names]
    options = settings.ray_ingress
    extra = _scaling(options)
    from ray import serve

    ingress = _deployment(serve.ingress()(Ingress))
    return ingress.options(
        name="ingress",
        ray_actor_options=options.ray_actor_options,
        max_ongoing_requests=options.max_ongoing_requests or 512,
        graceful_shutdown_timeout_s=settings.graceful_timeout,
        **extra,
    ).bind(settings, names, *models)
