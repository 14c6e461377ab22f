"""Cohere-style rerank: /v1/rerank (Cohere v1 and Jina shapes), /v2/rerank (Cohere v2)."""

from __future__ import annotations

import math
import uuid
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_compat.api.cohere.protocol import (
    COHERE_ERROR_RESPONSES,
    RerankRequest,
    RerankRequestV2,
    RerankResponse,
)
from openai_compat.api.items import image_documents
from openai_compat.api.request import (
    body_openapi,
    media_of,
    note,
    read_body,
    ready_registry,
    settings_of,
)
from openai_compat.api.voyage.protocol import VOYAGE_HINT
from openai_compat.formats.encoding import orjson_response
from openai_compat.ground.errors import BadRequest
from openai_compat.inference.page_rerank import rerank_documents
from openai_compat.inference.scoring import RerankResult, check_top_n, document_texts, rerank_texts

router = APIRouter(tags=["rerank"])

# Cohere bills one search unit per query and up to 100 documents.
_DOCS_PER_SEARCH_UNIT = 100


def rerank_payload(
    body: RerankRequest, result: RerankResult, texts: list[str], version: str
) -> dict[str, Any]:
    ranked = result.ranked[: body.top_n] if body.top_n else result.ranked
    results = []
    for r in ranked:
        item: dict[str, Any] = {"index": r.index, "relevance_score": r.score}
        if body.return_documents:
            doc = body.documents[r.index]
            item["document"] = {"text": texts[r.index]} if isinstance(doc, str) else doc
        results.append(item)
    return {
        "id": str(uuid.uuid4()),
        "results": results,
        "meta": {
            "api_version": {"version": version},
            "billed_units": {"search_units": max(1, math.ceil(len(texts) / _DOCS_PER_SEARCH_UNIT))},
            "tokens": {"input_tokens": result.tokens, "output_tokens": 0},
        },
        "model": body.model,
        "usage": {"prompt_tokens": result.tokens, "total_tokens": result.tokens},
    }


async def _rerank(request: Request, model: type[RerankRequest], version: str) -> Response:
    registry, settings = ready_registry(request), settings_of(request)
    body = await read_body(request, model)
    if "top_k" in body.model_fields_set:  # the voyageai SDK at the wrong base URL
        raise BadRequest(f"{request.url.path} is Cohere's rerank; {VOYAGE_HINT}", param="top_k")
    entry = await registry.require(body.model, "rerank")
    check_top_n(body.top_n)
    pages = image_documents(entry, body.documents, body.rank_fields)
    if pages is not None:  # images among the documents: the model's own way to score them
        result = await rerank_documents(entry, body.query, pages, settings, media_of(request))
        texts = [d.text or "" for d in pages]
    else:
        texts = document_texts(body.documents, body.rank_fields)
        result = await rerank_texts(
            entry,
            body.query,
            texts,
            settings,
            max_tokens_per_doc=body.max_tokens_per_doc,
            score_mode=body.score_mode,
        )
    note(request, entry.name, len(texts), result.tokens)
    return orjson_response(rerank_payload(body, result, texts, version))


@router.post(
    "/v1/rerank",
    response_model=RerankResponse,
    response_model_exclude_none=True,
    responses=COHERE_ERROR_RESPONSES,
    openapi_extra=body_openapi(RerankRequest),
)
async def rerank_v1(request: Request) -> Response:
    """Rank documents by relevance to the query (Cohere v1 / Jina request shape)."""
    return await _rerank(request, RerankRequest, "1")


@router.post(
    "/v2/rerank",
    response_model=RerankResponse,
    response_model_exclude_none=True,
    responses=COHERE_ERROR_RESPONSES,
    openapi_extra=body_openapi(RerankRequestV2),
)
async def rerank_v2(request: Request) -> Response:
    """Rank documents by relevance to the query (Cohere v2 request shape)."""
    return await _rerank(request, RerankRequestV2, "2")
