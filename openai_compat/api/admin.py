"""The admin API (--admin-key; off without one): which models are loaded, load and unload.

    GET  /admin/models                    every configured model: state, sizes, use
    POST /admin/models/{name}/load        load it now (unloading idle ones to make room)
    POST /admin/models/{name}/unload      after its in-flight work; ?force=true cancels that
The gateway (middleware.py) checks the admin key before any of these runs.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_compat.api.protocol import ERROR_RESPONSES
from openai_compat.api.request import ready_registry
from openai_compat.formats.encoding import orjson_response
from openai_compat.ground.errors import BadRequest
from openai_compat.models import memory
from openai_compat.models.pool import ModelPool
from openai_compat.models.registry import Registry

router = APIRouter(prefix="/admin", tags=["admin"])


def _pool(request: Request) -> tuple[Registry, ModelPool]:
    registry = ready_registry(request)
    if registry.pool is None:
        raise BadRequest("This server's models are fixed (it was built without a model pool).")
    return registry, registry.pool


def _served(registry: Registry, name: str) -> str:
    return registry.config(name).served_name  # 404 naming the served models


@router.get("/models", responses=ERROR_RESPONSES)
async def list_models(request: Request) -> Response:
    """Every configured model's state, measured size and use (an admin key with `models`:
    those in its scope); the limits and the process RSS."""
    registry, pool = _pool(request)
    models = [
        pool.describe(c.served_name) for c in registry.configs if registry.visible(c.served_name)
    ]
    return orjson_response(
        {
            "object": "list",
            "data": models,
            "loaded": pool.loaded_count(),
            "max_loaded_models": pool.max_loaded or None,
            "memory_budget": pool.budget or None,
            "resident_bytes": sum(
                m["resident_bytes"] or 0 for m in models if m["state"] == "loaded"
            ),
            "process_rss_bytes": memory.rss(),
        }
    )


@router.post("/models/{name:path}/load", responses=ERROR_RESPONSES)
async def load_model(name: str, request: Request) -> Response:
    """Load the model now; answers once it is loaded (or why it could not be)."""
    registry, pool = _pool(request)
    served = _served(registry, name)
    await pool.load(served, for_client=True, detail=True)  # the admin sees why
    return orjson_response(pool.describe(served))


@router.post("/models/{name:path}/unload", responses=ERROR_RESPONSES)
async def unload_model(name: str, request: Request, force: bool = False) -> Response:
    """Unload the model once its in-flight requests finish (`force=true`: cancel them, 503
    to their clients); answers once it is unloaded."""
    registry, pool = _pool(request)
    served = _served(registry, name)
    await pool.unload(served, force=force)
    return orjson_response(pool.describe(served))
