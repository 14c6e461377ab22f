"""The bare paths several APIs define: one route each, dispatched on the body's dialect.

`/v1/...` and `/v2/...` speak OpenAI, Cohere and Jina. The bare paths speak infinity-emb's
API where infinity defines the path (it serves without a prefix), TEI's where TEI defines it,
and the original tutorial's where the tutorial does. Where several define the same path, the
body's required key says which one the client speaks (SHARED_PATHS, one table); a body with
none of them is a 400 that names the key each dialect expects.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

from openai_compat.api.infinity.protocol import (
    INFINITY_ERROR_RESPONSES,
    InfinityClassifyRequest,
    InfinityRerankRequest,
)
from openai_compat.api.infinity.routes import infinity_classify, infinity_rerank
from openai_compat.api.protocol import ERROR_RESPONSES
from openai_compat.api.request import body_openapi, read_body
from openai_compat.api.tei.protocol import (
    TEI_ERROR_RESPONSES,
    TeiEmbedRequest,
    TeiRerankRequest,
    TeiTokenizeRequest,
)
from openai_compat.api.tei.routes import tei_embed, tei_rerank, tei_tokenize
from openai_compat.api.tutorial import routes as tutorial
from openai_compat.api.tutorial.protocol import (
    TutorialClassifyRequest,
    TutorialEmbedRequest,
    TutorialRerankRequest,
)
from openai_compat.api.vllm import VllmTokenizeRequest, vllm_tokenize
from openai_compat.ground.bodies import Chooser
from openai_compat.ground.errors import BadRequest
from openai_compat.ground.families import SHARED_KEYS, ErrorFamily, set_family

# path -> (the key that marks a dialect, the dialect, its request model), first match wins.
SHARED_PATHS: dict[str, tuple[tuple[str, str, type[BaseModel]], ...]] = {
    "/embed": (
        ("sentences", "tutorial", TutorialEmbedRequest),
        ("inputs", "tei", TeiEmbedRequest),
    ),
    "/rerank": (
        ("docs", "tutorial", TutorialRerankRequest),
        ("documents", "infinity", InfinityRerankRequest),
        ("texts", "tei", TeiRerankRequest),
    ),
    "/classify": (
        ("sentences", "tutorial", TutorialClassifyRequest),
        ("input", "infinity", InfinityClassifyRequest),
    ),
    "/tokenize": (
        ("prompt", "vllm", VllmTokenizeRequest),
        ("inputs", "tei", TeiTokenizeRequest),
    ),
}


class NoDialect(BaseModel):
    """A body that matches no dialect of its path (kept whole, for the error message)."""

    model_config = ConfigDict(extra="allow")


def chooser(path: str) -> Chooser:
    """The body-model chooser for a shared path (picklable: bodies may be parsed in the
    worker processes)."""
    return functools.partial(_choose, path)


def _choose(path: str, data: Any) -> type[BaseModel]:
    if isinstance(data, dict):
        for key, _, model in SHARED_PATHS[path]:
            if key in data:
                return model
    return NoDialect


def _loads(raw: bytes) -> Any:
    try:
        return orjson.loads(raw or b"null")
    except orjson.JSONDecodeError:
        return None


def no_dialect(path: str) -> BadRequest:
    expected = "; ".join(f"'{key}' ({dialect})" for key, dialect, _ in SHARED_PATHS[path])
    return BadRequest(
        f"POST {path} is shared by several APIs and this body matches none: send {expected}.",
        param=SHARED_PATHS[path][0][0],
        code="unknown_dialect",
    )


router = APIRouter(tags=["shared bare paths"])
# Errors come in the body's dialect's shape: OpenAI's, infinity's (its 422), or TEI's (with
# TEI's status codes).
_RESPONSES: dict[int | str, dict[str, object]] = {
    code: {"description": f"{spec['description']} ({family} body)"}
    for family, table in (
        ("OpenAI", ERROR_RESPONSES),
        ("infinity", INFINITY_ERROR_RESPONSES),
        ("TEI", TEI_ERROR_RESPONSES),
    )
    for code, spec in table.items()
}


# Each dialect's request model -> the handler that serves it.
_HANDLERS: dict[type[BaseModel], Callable[[Request, Any], Awaitable[Response]]] = {
    TutorialEmbedRequest: tutorial.embed,
    TutorialRerankRequest: tutorial.rerank,
    TutorialClassifyRequest: tutorial.classify,
    TeiEmbedRequest: tei_embed,
    TeiRerankRequest: tei_rerank,
    TeiTokenizeRequest: tei_tokenize,
    InfinityRerankRequest: infinity_rerank,
    InfinityClassifyRequest: infinity_classify,
    VllmTokenizeRequest: vllm_tokenize,
}


def _documented(path: str) -> dict[str, object]:
    return body_openapi(*(model for _, _, model in SHARED_PATHS[path]))


# The gateway's table (errors.SHARED_KEYS: each dialect key's error family, for errors
# answered before a body is parsed) must name the same keys, in the same order, as this one.
if {p: [k for k, _, _ in rows] for p, rows in SHARED_PATHS.items()} != {
    p: [k for k, _ in rows] for p, rows in SHARED_KEYS.items()
}:
    raise RuntimeError("errors.SHARED_KEYS and api.shared.SHARED_PATHS name different keys")


def family_of_body(path: str, model: type[BaseModel]) -> ErrorFamily:
    """The error family of the dialect whose request model `model` is (errors.SHARED_KEYS)."""
    for (_, _, candidate), (_, family) in zip(SHARED_PATHS[path], SHARED_KEYS[path], strict=True):
        if candidate is model:
            return family
    return "openai"


async def _dispatch(request: Request, path: str) -> Response:
    try:
        body: BaseModel = await read_body(request, chooser(path))
    except RequestValidationError:
        # the body's dialect answers in its own error shape (TEI's, infinity's 422)
        raw = await request.body()
        data = await asyncio.to_thread(_loads, raw) if len(raw) > 65536 else _loads(raw)
        set_family(request, family_of_body(path, _choose(path, data)))
        raise
    set_family(request, family_of_body(path, type(body)))
    handler = _HANDLERS.get(type(body))
    if handler is None:
        raise no_dialect(path)
    return await handler(request, body)


@router.post("/embed", responses=_RESPONSES, openapi_extra=_documented("/embed"))
async def embed(request: Request) -> Response:
    """The tutorial's embed (`sentences`) or TEI's (`inputs`)."""
    return await _dispatch(request, "/embed")


@router.post("/rerank", responses=_RESPONSES, openapi_extra=_documented("/rerank"))
async def rerank(request: Request) -> Response:
    """The tutorial's rerank (`docs`), infinity's (`documents`) or TEI's (`texts`)."""
    return await _dispatch(request, "/rerank")


@router.post("/classify", responses=_RESPONSES, openapi_extra=_documented("/classify"))
async def classify(request: Request) -> Response:
    """The tutorial's classify (`sentences`) or infinity's (`input`)."""
    return await _dispatch(request, "/classify")


@router.post("/tokenize", responses=_RESPONSES, openapi_extra=_documented("/tokenize"))
async def tokenize(request: Request) -> Response:
    """vLLM's tokenize (`prompt`) or TEI's (`inputs`)."""
    return await _dispatch(request, "/tokenize")
