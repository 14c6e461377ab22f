"""The original tutorial's routes, unchanged for its users: models picked by `model_index`.

They share the engine paths of the /v1 API (inference.py); only the wire shapes differ.
`/classify` also accepts the /v1/classify request (`input` instead of `sentences`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_compat.encoding import as_matrix, orjson_response
from openai_compat.inference import (
    EmbedResult,
    check_count,
    classify_texts,
    embed_media,
    embed_texts,
    rerank_texts,
)
from openai_compat.protocol import (
    ERROR_RESPONSES,
    ClassifyRequest,
    ClassifyResponse,
    TutorialClassifyRequest,
    TutorialClassifyResponse,
    TutorialEmbedRequest,
    TutorialEmbedResponse,
    TutorialImageEmbedRequest,
    TutorialRerankRequest,
    TutorialRerankResponse,
    classify_request_model,
)
from openai_compat.registry import ModelEntry
from openai_compat.routes import (
    body_openapi,
    media_of,
    note,
    read_body,
    ready_registry,
    settings_of,
)
from openai_compat.routes.classify import classify_payload
from openai_compat.tokens import field_names

router = APIRouter(tags=["tutorial"])


def _embeddings(entry: ModelEntry, result: EmbedResult) -> Response:
    embeddings = list(as_matrix(result.vectors))
    return orjson_response({"embeddings": embeddings, "usage": result.tokens, "model": entry.name})


@router.post(
    "/embed",
    response_model=TutorialEmbedResponse,
    responses=ERROR_RESPONSES,
    openapi_extra=body_openapi(TutorialEmbedRequest),
)
async def embed(request: Request) -> Response:
    registry, settings = ready_registry(request), settings_of(request)
    body = await read_body(request, TutorialEmbedRequest)
    entry = registry.by_index(body.model_index, "embed")
    check_count(len(body.sentences), settings.max_inputs_per_request, "sentences", "sentences")
    prompt = entry.prompts.choose(
        entry.name, input_type=body.input_type, prompt_name=body.prompt_name
    )
    result = await embed_texts(
        entry, body.sentences, settings, field_names("sentences"), prompt=prompt
    )
    note(request, entry.name, len(body.sentences), result.tokens)
    return _embeddings(entry, result)


@router.post(
    "/image_embed",
    response_model=TutorialEmbedResponse,
    responses=ERROR_RESPONSES,
    openapi_extra=body_openapi(TutorialImageEmbedRequest),
)
async def image_embed(request: Request) -> Response:
    registry, settings = ready_registry(request), settings_of(request)
    body = await read_body(request, TutorialImageEmbedRequest)
    entry = registry.by_index(body.model_index, "image")
    check_count(len(body.image_urls), settings.max_media_items, "image_urls", "media items")
    result = await embed_media(
        entry, body.image_urls, "image", settings, media_of(request), field_names("image_urls")
    )
    note(request, entry.name, len(body.image_urls), result.tokens)
    return _embeddings(entry, result)


@router.post(
    "/rerank",
    response_model=TutorialRerankResponse,
    responses=ERROR_RESPONSES,
    openapi_extra=body_openapi(TutorialRerankRequest),
)
async def rerank(request: Request) -> Response:
    registry, settings = ready_registry(request), settings_of(request)
    body = await read_body(request, TutorialRerankRequest)
    entry = registry.by_index(body.model_index, "rerank")
    result = await rerank_texts(entry, body.query, body.docs, settings, docs_param="docs")
    note(request, entry.name, len(body.docs), result.tokens)
    rankings = [
        {"index": r.index, "relevance_score": r.score, "document": body.docs[r.index]}
        for r in result.ranked
    ]
    return orjson_response({"rankings": rankings, "usage": result.tokens, "model": entry.name})


@router.post(
    "/classify",
    response_model=TutorialClassifyResponse | ClassifyResponse,
    responses=ERROR_RESPONSES,
    openapi_extra=body_openapi(TutorialClassifyRequest, ClassifyRequest),
)
async def classify(request: Request) -> Response:
    registry, settings = ready_registry(request), settings_of(request)
    body: ClassifyRequest | TutorialClassifyRequest = await read_body(
        request, classify_request_model
    )
    if isinstance(body, ClassifyRequest):
        entry = registry.require(body.model, "classify")
        texts = [body.input] if isinstance(body.input, str) else body.input
        result = await classify_texts(entry, texts, settings, raw_scores=bool(body.raw_scores))
        note(request, entry.name, len(texts), result.tokens)
        return orjson_response(classify_payload(result, body.model))
    entry = registry.by_index(body.model_index, "classify")
    result = await classify_texts(entry, body.sentences, settings, param="sentences")
    note(request, entry.name, len(body.sentences), result.tokens)
    classifications = [
        [{"label": label, "score": score} for label, score in labels] for labels in result.labels
    ]
    return orjson_response(
        {"classifications": classifications, "usage": result.tokens, "model": entry.name}
    )
