"""create_app(settings, registry=None): the FastAPI app, its routers, and engine start/stop."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import importlib
import logging
import re
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

from openai_compat import __version__
from openai_compat.api import admin, azure, docs, ollama, playground, probes, shared, vllm
from openai_compat.api.cohere import embed as cohere_embed
from openai_compat.api.cohere import rerank
from openai_compat.api.gemini import routes as gemini
from openai_compat.api.infinity import routes as infinity_routes
from openai_compat.api.openai import classify, embeddings, models
from openai_compat.api.request import DOCUMENTED_BODIES
from openai_compat.api.tei import routes as tei_routes
from openai_compat.api.tutorial import routes as tutorial
from openai_compat.api.voyage import routes as voyage
from openai_compat.batch import routes as batch_routes
from openai_compat.batch.service import BatchService
from openai_compat.engine.build import engine_package
from openai_compat.formats.media import MediaFetcher
from openai_compat.frame.settings import Settings
from openai_compat.ground import cpus, logs
from openai_compat.ground.bodies import BodyParser
from openai_compat.ground.errors import APIError, install_error_handlers
from openai_compat.ground.families import family_of
from openai_compat.ground.lifecycle import Lifecycle, in_daemon_thread
from openai_compat.models import memory
from openai_compat.models.cache import EmbeddingCache
from openai_compat.models.loading import ModelLoader, stop_engines, unload_entry
from openai_compat.models.metrics import Metrics
from openai_compat.models.pool import ModelPool
from openai_compat.models.registry import EngineFailure, ModelEntry, Registry
from openai_compat.tenants import Tenants
from openai_compat.web.base_urls import BaseUrlHints
from openai_compat.web.fastpath import FastPathMiddleware, fast_path_table
from openai_compat.web.metrics_port import MetricsListener
from openai_compat.web.middleware import GatewayMiddleware

logger = logging.getLogger("openai_compat")


async def _load(registry: Registry, lifecycle: Lifecycle, settings: Settings) -> None:
    """The eager models, in order (lazy ones load on first use; models/pool.py); then ready."""
    assert registry.pool is not None
    try:
        # Import the engine (torch: seconds) off the event loop, then undo its logging setup.
        package = engine_package(c.engine for c in registry.configs)
        await in_daemon_thread(importlib.import_module, package, name="import")
        logs.reclaim_root()
        count, source = cpus.available()
        cpus.apply_to_torch(count)
        lifecycle.cpus = cpus.report(count, source)
        logger.info("CPUs: %s", lifecycle.cpus)
        memory.freeze_imports()  # before any model: unloads collect only what came after
        for config in registry.configs:
            if config.load == "eager":
                await registry.pool.load(config.served_name)
        registry.choose_defaults(settings.default_models())
    except EngineFailure as exc:
        lifecycle.fail(str(exc))
    except APIError as exc:  # an eager model larger than the memory budget
        lifecycle.fail(exc.message)
    except Exception as exc:  # the loader must never die silently
        logger.exception("model loading crashed")
        lifecycle.fail(f"model loading crashed: {type(exc).__name__}: {exc}")
    else:
        lifecycle.ready()
        logger.info("%s", ready_line(settings, registry))


def ready_line(settings: Settings, registry: Registry) -> str:
    """The one line that says the server is ready: where, and what it serves (TEI and vLLM
    print one too)."""
    host = settings.host
    shown = "localhost" if host in ("0.0.0.0", "::", "") else host
    shown = f"[{shown}]" if ":" in shown else shown
    url = f"http://{shown}:{settings.port}"
    lazy = [c.served_name for c in registry.configs if c.load == "lazy"]
    models = ", ".join(c.served_name for c in registry.configs if c.load != "lazy") or "none"
    models += f" (lazy: {', '.join(lazy)})" if lazy else ""
    metrics = ""
    if settings.metrics_port is not None:
        metrics = f"; metrics alone on http://{shown}:{settings.metrics_port}/metrics"
    return (
        f"ready on {url} (OpenAI base_url {url}/v1); playground {url}/playground, API docs "
        f"{url}/docs{metrics}; models: {models}"
    )


def _loaded(registry: Registry, entry: ModelEntry) -> None:
    """A model the pool loaded: served, and its card kept for when it is unloaded."""
    registry.add(entry)
    assert registry.pool is not None
    registry.pool.slots[entry.name].card = models.card(entry, entry.name)


def create_app(
    settings: Settings, registry: Registry | None = None, *, batch_runner: bool = True
) -> FastAPI:
    """The app. Models load in the background after start-up, so probes answer meanwhile.

    A `registry` that is already complete (tests, embedding in another app) is served as is.
    `batch_runner=False`: this process never runs Batch API jobs (a Ray Serve ingress, whose
    Batch API requests go to the one BatchServer that owns the data dir).
    """
    registry = registry if registry is not None else Registry(settings.served_models())
    settings.check_model_pool(registry.configs)
    if registry.pool is None and not registry.complete:
        registry.pool = ModelPool(
            registry.configs,
            ModelLoader(registry, settings.exports(), settings.max_multivector_values),
            partial(unload_entry, registry),
            max_loaded=settings.max_loaded_models,
            budget=settings.memory_budget,
            max_waiters=settings.max_load_waiters,
            wait_timeout=settings.load_wait_timeout,
            on_loaded=partial(_loaded, registry),
        )
    if settings.cache_bytes and registry.cache is None:
        registry.cache = EmbeddingCache(settings.cache_bytes, per_key=settings.cache_scope == "key")
    settings.default_models()  # a malformed --default-model stops start-up here
    lifecycle = Lifecycle()
    bodies = BodyParser()
    media = MediaFetcher(
        allow_private=settings.allow_private_media_urls,
        max_bytes=settings.max_media_bytes,
        timeout=settings.media_fetch_timeout,
        max_pixels=settings.max_media_pixels,
        max_request_pixels=settings.max_request_pixels,
        max_audio_seconds=settings.max_audio_seconds,
    )

    # The keys in force (a keys file that cannot be used stops start-up: KeysFileError)
    tenants = Tenants(settings.api_key, settings.keys_file, served=registry.all_names)
    tenants.limiter.parked = lifecycle.park  # a batch line waiting for budget holds no drain
    batches = BatchService(settings, lifecycle, tenants)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loader = None
        if registry.complete:
            memory.resume_collection()
            registry.choose_defaults(settings.default_models())
            lifecycle.ready()
        else:
            loader = asyncio.create_task(_load(registry, lifecycle, settings), name="load-models")
        if batch_runner and settings.batch_api:
            batches.start(app)
        watcher = asyncio.create_task(tenants.watch(), name="keys-file")
        try:
            yield
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            lifecycle.drain()
            await batches.stop()
            if loader is not None and not loader.done():
                loader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await loader
            if registry.pool is not None:
                await registry.pool.close()
            await media.close()
            bodies.close()
            await stop_engines(registry)

    app = FastAPI(
        title="openai-compat",
        version=__version__,
        summary="OpenAI- and Cohere-compatible embeddings, rerank and classify server.",
        lifespan=lifespan,
        # /docs and /redoc are ours (api/docs.py): FastAPI's load their code from a CDN
        docs_url=None,
        redoc_url=None,
        telemetry=None if settings.otel else {"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    app.state.registry = registry
    app.state.lifecycle = lifecycle
    app.state.media = media
    app.state.bodies = bodies
    app.state.batches = batches
    app.state.tenants = tenants
    metrics = Metrics(registry, process=True)
    app.state.metrics = metrics
    install_error_handlers(app)

    # (router, prefix, in OpenAPI): the /v1 routes also answer without /v1 for clients
    # configured with a bare base URL; the tutorial's /classify also takes /v1/classify's body.
    mounted = [
        (probes.router, "", True),
        (admin.router, "", True),
        (playground.router, "", False),
        (docs.router, "", False),
        (rerank.router, "", True),
        (cohere_embed.router, "", True),
        (models.router, "/v1", True),
        (embeddings.router, "/v1", True),
        (classify.router, "/v1", True),
        (batch_routes.router, "/v1", True),
        (batch_routes.router, "", False),
        (infinity_routes.router, "", True),  # before the bare /models: infinity's shape
        (models.router, "", False),
        (tutorial.router, "", True),
        (shared.router, "", True),
        (tei_routes.router, "", True),
        (vllm.router, "", True),
        (voyage.router, "", True),  # /voyage/v1/...: Voyage AI's API
        (ollama.router, "", True),  # /api/...: Ollama's
        (azure.router, "", True),  # /openai/deployments/...: Azure OpenAI's
        (models.router, "/openai/v1", False),  # Azure OpenAI's v1 API: OpenAI's own routes
        (embeddings.router, "/openai/v1", False),
        (gemini.router, "", True),  # /v1beta/models/{model}:embedContent...: Gemini's
    ]
    if not settings.batch_api:  # another process owns the jobs (a batch pod): no routes
        mounted = [m for m in mounted if m[0] is not batch_routes.router]
    for router, prefix, documented in mounted:
        app.include_router(router, prefix=prefix, include_in_schema=documented)
    routes = [
        (prefix + route.path, route)
        for router, prefix, _ in mounted
        for route in router.routes
        if isinstance(route, APIRoute)
    ]
    served = {  # as the schema names them: {model_id}, not {model_id:path}
        (re.sub(r"\{(\w+):\w+\}", r"{\1}", path), m.lower())
        for path, route in routes
        for m in route.methods or ()
    }
    app.openapi = lambda: custom_openapi(app, served)  # type: ignore[method-assign]
    # Every POST handler takes only the Request, so it is served straight from the fast path
    # (checked here); GETs (probes, models, docs) go through the normal router.
    fast = fast_path_table(routes)
    app.add_middleware(FastPathMiddleware, routes=fast, metrics=metrics)
    app.add_middleware(BaseUrlHints)  # a client at the wrong base URL told the right one
    known = frozenset(path for path, _ in routes) | {"/docs", "/redoc", "/openapi.json"}
    app.add_middleware(  # outermost of ours: ids, auth, limits, draining, metrics, access log
        GatewayMiddleware,
        settings=settings,
        lifecycle=lifecycle,
        metrics=metrics,
        known_paths=known,
        tenants=tenants,
    )
    if settings.metrics_port is not None:  # its own port: /metrics alone, no key
        app.add_middleware(MetricsListener, port=settings.metrics_port, metrics=metrics)
    return app


def _document_bare_twins(schema: dict[str, Any], served: set[tuple[str, str]]) -> None:
    """The /v1 operations also served without /v1 (for clients given a bare base URL) are
    documented there too, where no other dialect documents that path (bare GET /models is
    infinity's own). `served`: every (path, method) the app answers."""
    paths = schema.setdefault("paths", {})
    for path, item in list(paths.items()):
        if not path.startswith("/v1/"):
            continue
        bare = path.removeprefix("/v1")
        for method, operation in item.items():
            if (bare, method) not in served or method in paths.get(bare, {}):
                continue
            twin = copy.deepcopy(operation)
            twin["operationId"] = f"{operation.get('operationId', method)}_bare"
            if family_of(bare) == "infinity":  # bare /embeddings: infinity's 422 bodies
                twin["responses"]["422"] = {
                    "description": "Invalid request body (infinity's)",
                    "content": {
                        "application/json": {
                            "schema": {"$ref": "#/components/schemas/InfinityValidationError"}
                        }
                    },
                }
            paths.setdefault(bare, {})[method] = twin


def custom_openapi(app: FastAPI, served: set[tuple[str, str]]) -> dict[str, Any]:
    """FastAPI's schema plus the request models that routes parse themselves (read_body)."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, summary=app.summary, routes=app.routes
    )
    _document_bare_twins(schema, served)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    # every body a route documents (api.request.body_openapi), so no $ref dangles
    for model in DOCUMENTED_BODIES.values():
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        components[model.__name__] = body
    app.openapi_schema = schema
    return schema
