"""One small router per API family; each handler resolves the model, calls the engine, answers.

Request bodies are read as JSON whatever the Content-Type says (curl's `-d` sends a form type)
and validated by pydantic-core straight from the bytes: one pass, no intermediate dict.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from openai_compat.errors import ServiceUnavailable
from openai_compat.lifecycle import Lifecycle
from openai_compat.media import MediaFetcher
from openai_compat.registry import Registry
from openai_compat.settings import Settings

M = TypeVar("M", bound=BaseModel)


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _ready_registry(request: Request) -> Registry:
    """The registry, once every model is loaded; 503 before that and while shutting down."""
    lifecycle: Lifecycle = request.app.state.lifecycle
    if lifecycle.phase != "ready":
        raise ServiceUnavailable(
            lifecycle.unavailable_message(), code=lifecycle.phase, headers={"Retry-After": "1"}
        )
    registry: Registry = request.app.state.registry
    return registry


def _media(request: Request) -> MediaFetcher:
    fetcher: MediaFetcher = request.app.state.media
    return fetcher


SettingsDep = Annotated[Settings, Depends(_settings)]
MediaDep = Annotated[MediaFetcher, Depends(_media)]
RegistryDep = Annotated[Registry, Depends(_ready_registry)]


def json_body(model: type[M]) -> Callable[[Request], Awaitable[M]]:
    """A dependency that parses the request body into `model` (errors -> 400 envelope)."""

    async def parse(request: Request) -> M:
        raw = await request.body()
        try:
            return model.model_validate_json(raw or b"null")
        except ValidationError as exc:
            raise validation_failure(exc) from None

    return parse


def validation_failure(exc: ValidationError) -> RequestValidationError:
    """A body's pydantic errors as FastAPI's, so the one handler renders them (400)."""
    errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
    return RequestValidationError(errors)


def body_openapi(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` documenting a body read by json_body (see app.custom_openapi)."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
            },
        }
    }
