"""infinity-emb's API where it differs from ours: bare /embeddings (OpenAI's body with
infinity's defaults), /rerank and /classify (reached through api/shared.py), /embeddings_image
and /embeddings_audio. Errors keep our (OpenAI) envelope, as infinity's do. `model` may be left
out, as infinity allows: the default model then answers."""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_compat.api.infinity.protocol import (
    INFINITY_ERROR_RESPONSES,
    InfinityClassifyRequest,
    InfinityEmbeddingRequest,
    InfinityMediaRequest,
    InfinityRerankRequest,
)
from openai_compat.api.openai.embeddings import serve_embeddings
from openai_compat.api.openai.models import model_cards
from openai_compat.api.protocol import (
    ERROR_RESPONSES,
    UNNAMED,
    EmbeddingResponse,
    ModelList,
)
from openai_compat.api.request import (
    body_openapi,
    media_of,
    note,
    read_body,
    ready_registry,
    settings_of,
)
from openai_compat.formats.encoding import embedding_payload, orjson_response
from openai_compat.formats.media import Modality
from openai_compat.ground.errors import BadRequest
from openai_compat.inference.plan import EmbedPlan, run
from openai_compat.inference.scoring import check_top_n, classify_texts, raw_score, rerank_texts
from openai_compat.models.registry import Capability, ModelEntry

router = APIRouter(tags=["infinity"])


async def _model(request: Request, name: str, capability: Capability) -> ModelEntry:
    registry = ready_registry(request)
    if name == UNNAMED:
        return await registry.default(capability)
    return await registry.require(name, capability)


def _envelope(kind: str, model: str, tokens: int) -> dict[str, Any]:
    return {
        "object": kind,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "id": f"infinity-{uuid.uuid4()}",
        "created": int(time.time()),
    }


async def infinity_rerank(request: Request, body: InfinityRerankRequest) -> Response:
    entry = await _model(request, body.model, "rerank")
    check_top_n(body.top_n)
    result = await rerank_texts(
        entry, body.query, body.documents, settings_of(request), score_mode=body.score_mode
    )
    note(request, entry.name, len(body.documents), result.tokens)
    ranked = result.ranked[: body.top_n] if body.top_n else result.ranked
    results = [
        {
            "relevance_score": raw_score(entry, r.score) if body.raw_scores else r.score,
            "index": r.index,
            "document": body.documents[r.index] if body.return_documents else None,
        }
        for r in ranked
    ]
    return orjson_response({"results": results, **_envelope("rerank", entry.name, result.tokens)})


async def infinity_classify(request: Request, body: InfinityClassifyRequest) -> Response:
    entry = await _model(request, body.model, "classify")
    texts = [body.input] if isinstance(body.input, str) else body.input
    result = await classify_texts(entry, texts, settings_of(request), raw_scores=body.raw_scores)
    note(request, entry.name, len(texts), result.tokens)
    data = [[{"score": s, "label": label} for label, s in labels] for labels in result.labels]
    return orjson_response({"data": data, **_envelope("classify", entry.name, result.tokens)})


async def _media(request: Request, modality: Modality) -> Response:
    body = await read_body(request, InfinityMediaRequest)
    entry = await _model(request, body.model, modality)
    if body.encoding_format not in ("float", "base64"):
        raise BadRequest("'encoding_format' must be 'float' or 'base64'.", param="encoding_format")
    items = [body.input] if isinstance(body.input, str) else body.input
    plan = EmbedPlan(media=items, modality=modality)
    result = await run(entry, plan, settings_of(request), media_of(request))
    note(request, entry.name, len(items), result.tokens)
    payload = embedding_payload(
        result.vectors,
        fmt=body.encoding_format,  # type: ignore[arg-type]
        dimensions=None,
        model=body.model if body.model != UNNAMED else entry.name,
        prompt_tokens=result.tokens,
    )
    return Response(payload, media_type="application/json")


@router.post("/embeddings", include_in_schema=False)  # documented once, as /v1/embeddings
async def bare_embeddings(request: Request) -> Response:
    """infinity: POST /embeddings, OpenAI's body with infinity's defaults: its clients send
    model "default/not-specified" and dimensions 0 (= the model's size) unless told otherwise."""
    registry = ready_registry(request)
    body = await read_body(request, InfinityEmbeddingRequest)
    dimensions = None if body.dimensions == 0 else body.dimensions
    if body.model == UNNAMED:
        modality = body.modality or "text"
        body.model = (await registry.default("embed" if modality == "text" else modality)).name
    # infinity's matryoshka cut keeps the first values as they are (batch_handler.py)
    return await serve_embeddings(
        request, body, dimensions, renormalize=False, truncate_default=True
    )


@router.get("/models", response_model=ModelList, responses=ERROR_RESPONSES)
async def infinity_models(request: Request) -> Response:
    """infinity: GET /models as its server (and generated client) has it: our model cards with
    infinity's `stats` (queue and batch) and `backend`; `owned_by` is "infinity", the only value
    infinity's client accepts. /v1/models is unchanged."""
    settings = settings_of(request)
    data = []
    registry = ready_registry(request)
    for card, entry in model_cards(registry):
        queued = entry.engine_queue() if entry else 0
        limit = settings.max_queued_inputs
        config = registry.config(str(card["id"]))
        stats = {
            "queue_fraction": queued / limit if limit else 0.0,
            "queue_absolute": queued,
            "results_pending": entry.pending if entry else 0,
            "batch_size": config.batch_size,
        }
        card.setdefault("capabilities", [])  # infinity's client needs the list (unloaded: [])
        data.append({**card, "owned_by": "infinity", "backend": config.engine, "stats": stats})
    return orjson_response({"object": "list", "data": data})


@router.post(
    "/embeddings_image",
    response_model=EmbeddingResponse,
    responses=INFINITY_ERROR_RESPONSES,
    openapi_extra=body_openapi(InfinityMediaRequest),
)
async def embeddings_image(request: Request) -> Response:
    """infinity: embed images given as URLs or data: URIs."""
    return await _media(request, "image")


@router.post(
    "/embeddings_audio",
    response_model=EmbeddingResponse,
    responses=INFINITY_ERROR_RESPONSES,
    openapi_extra=body_openapi(InfinityMediaRequest),
)
async def embeddings_audio(request: Request) -> Response:
    """infinity: embed audio given as URLs or data: URIs."""
    return await _media(request, "audio")
