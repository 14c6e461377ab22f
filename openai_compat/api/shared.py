"""The bare paths several APIs define: one route each, dispatched on the body (dialects.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_compat.api.infinity.protocol import InfinityClassifyRequest, InfinityRerankRequest
from openai_compat.api.infinity.routes import infinity_classify, infinity_rerank
from openai_compat.api.tei.protocol import (
    TEI_ERROR_RESPONSES,
    TeiEmbedRequest,
    TeiRerankRequest,
    TeiTokenizeRequest,
)
from openai_compat.api.tei.routes import tei_embed, tei_rerank, tei_tokenize
from openai_compat.api.vllm import VllmTokenizeRequest, vllm_tokenize
from openai_compat.dialects import SHARED_PATHS, chooser, no_dialect
from openai_compat.protocol import (
    ERROR_RESPONSES,
    TutorialClassifyRequest,
    TutorialEmbedRequest,
    TutorialRerankRequest,
)
from openai_compat.routes import body_openapi, read_body, tutorial

router = APIRouter(tags=["shared bare paths"])
# Errors come in the body's dialect's shape: OpenAI's, or TEI's (with TEI's status codes).
_RESPONSES: dict[int | str, dict[str, object]] = {
    code: {"description": f"{spec['description']} ({family} body)"}
    for family, table in (("OpenAI", ERROR_RESPONSES), ("TEI", TEI_ERROR_RESPONSES))
    for code, spec in table.items()
}


def _documented(path: str) -> dict[str, object]:
    return body_openapi(*(model for _, _, model in SHARED_PATHS[path]))


@router.post("/embed", responses=_RESPONSES, openapi_extra=_documented("/embed"))
async def embed(request: Request) -> Response:
    """The tutorial's embed (`sentences`) or TEI's (`inputs`)."""
    body = await read_body(request, chooser("/embed"))
    if isinstance(body, TutorialEmbedRequest):
        return await tutorial.embed(request, body)
    if isinstance(body, TeiEmbedRequest):
        return await tei_embed(request, body)
    raise no_dialect("/embed")


@router.post("/rerank", responses=_RESPONSES, openapi_extra=_documented("/rerank"))
async def rerank(request: Request) -> Response:
    """The tutorial's rerank (`docs`), infinity's (`documents`) or TEI's (`texts`)."""
    body = await read_body(request, chooser("/rerank"))
    if isinstance(body, TutorialRerankRequest):
        return await tutorial.rerank(request, body)
    if isinstance(body, InfinityRerankRequest):
        return await infinity_rerank(request, body)
    if isinstance(body, TeiRerankRequest):
        return await tei_rerank(request, body)
    raise no_dialect("/rerank")


@router.post("/classify", responses=_RESPONSES, openapi_extra=_documented("/classify"))
async def classify(request: Request) -> Response:
    """The tutorial's classify (`sentences`) or infinity's (`input`)."""
    body = await read_body(request, chooser("/classify"))
    if isinstance(body, TutorialClassifyRequest):
        return await tutorial.classify(request, body)
    if isinstance(body, InfinityClassifyRequest):
        return await infinity_classify(request, body)
    raise no_dialect("/classify")


@router.post("/tokenize", responses=_RESPONSES, openapi_extra=_documented("/tokenize"))
async def tokenize(request: Request) -> Response:
    """vLLM's tokenize (`prompt`) or TEI's (`inputs`)."""
    body = await read_body(request, chooser("/tokenize"))
    if isinstance(body, VllmTokenizeRequest):
        return await vllm_tokenize(request, body)
    if isinstance(body, TeiTokenizeRequest):
        return await tei_tokenize(request, body)
    raise no_dialect("/tokenize")
