"""One small router per API family; each handler resolves the model, calls the engine, answers.

Handlers take the raw `Request` and use the plain helpers below instead of FastAPI's
dependency injection: on the hot path that machinery (and its thread hops for sync
dependencies) cost more than the work itself. Request bodies are read as JSON whatever the
Content-Type says (curl's `-d` sends a form type) and validated by pydantic-core straight
from the bytes; their schemas reach OpenAPI through `body_openapi`.
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel

from openai_compat.formats.media import MediaFetcher
from openai_compat.frame.settings import Settings
from openai_compat.ground.bodies import BodyParser, Chooser
from openai_compat.ground.errors import ServiceUnavailable
from openai_compat.ground.lifecycle import Lifecycle
from openai_compat.models.registry import Registry
from openai_compat.models.slots import set_keep_alive

M = TypeVar("M", bound=BaseModel)


def settings_of(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def media_of(request: Request) -> MediaFetcher:
    fetcher: MediaFetcher = request.app.state.media
    return fetcher


def ready_registry(request: Request) -> Registry:
    """The registry, once every model is loaded; 503 before that and while shutting down."""
    lifecycle: Lifecycle = request.app.state.lifecycle
    if lifecycle.phase != "ready":
        raise ServiceUnavailable(
            lifecycle.unavailable_message(), code=lifecycle.phase, headers={"Retry-After": "1"}
        )
    registry: Registry = request.app.state.registry
    return registry


async def read_body(request: Request, model: type[M] | Chooser) -> M:
    """The request body parsed into `model` (or the model `model(data)` picks); errors become
    the 400 envelope. Big bodies are parsed off the event loop (see bodies.py)."""
    parser: BodyParser = request.app.state.bodies
    parsed: M = await parser.parse(await request.body(), model)
    set_keep_alive(getattr(parsed, "keep_alive", None))  # bodies that declare the extension
    return parsed


# Every request model a route documents with body_openapi, in order: app.custom_openapi
# publishes their schemas, so no $ref the routes make can dangle. Filled as routes are
# declared (import time), read when the schema is built.
DOCUMENTED_BODIES: dict[str, type[BaseModel]] = {}


def body_openapi(*models: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` documenting a body read by read_body (see app.custom_openapi)."""
    for model in models:
        DOCUMENTED_BODIES.setdefault(model.__name__, model)
    refs = [{"$ref": f"#/components/schemas/{m.__name__}"} for m in models]
    schema = refs[0] if len(refs) == 1 else {"oneOf": refs}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def path_openapi(name: str, description: str) -> dict[str, Any]:
    """`openapi_extra` documenting a path parameter a fast-path handler reads itself
    (`request.path_params`): it declares none, so FastAPI's schema would lack it."""
    schema = {"type": "string"}
    param = {"name": name, "in": "path", "required": True, "schema": schema}
    return {"parameters": [{**param, "description": description}]}


def note(request: Request, model: str, inputs: int, tokens: int) -> None:
    """What a request did, for the gateway's metrics and access log."""
    state = request.state
    state.model = model
    state.inputs = inputs
    state.tokens = tokens
