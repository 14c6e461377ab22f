"""The original tutorial's routes, unchanged for its users: models picked by `model_index`.

They share the engine paths of the /v1 API (inference/embed.py); only the wire shapes differ.
`/embed`, `/rerank` and `/classify` are shared with other APIs: api/shared.py routes a body
here when it carries the tutorial's keys (its SHARED_PATHS table).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_compat.api.protocol import ERROR_RESPONSES
from openai_compat.api.request import (
    body_openapi,
    media_of,
    note,
    read_body,
    ready_registry,
    settings_of,
)
from openai_compat.api.tutorial.protocol import (
    TutorialClassifyRequest,
    TutorialEmbedRequest,
    TutorialEmbedResponse,
    TutorialImageEmbedRequest,
    TutorialRerankRequest,
)
from openai_compat.formats.encoding import as_matrix, orjson_response
from openai_compat.formats.tokens import field_names
from openai_compat.inference.embed import check_count
from openai_compat.inference.plan import Embedded, EmbedPlan, run
from openai_compat.inference.scoring import classify_texts, rerank_texts
from openai_compat.models.registry import ModelEntry

router = APIRouter(tags=["tutorial"])


def _embeddings(entry: ModelEntry, done: Embedded) -> Response:
    embeddings = list(as_matrix(done.vectors))
    return orjson_response({"embeddings": embeddings, "usage": done.tokens, "model": entry.name})


async def embed(request: Request, body: TutorialEmbedRequest) -> Response:
    registry, settings = ready_registry(request), settings_of(request)
    entry = await registry.by_index(body.model_index, "embed", 1)
    check_count(len(body.sentences), settings.max_inputs_per_request, "sentences", "sentences")
    plan = EmbedPlan(
        texts=body.sentences,
        param="sentences",
        names=field_names("sentences"),
        input_type=body.input_type,
        prompt_name=body.prompt_name,
    )
    done = await run(entry, plan, settings)
    note(request, entry.name, done.count, done.tokens)
    return _embeddings(entry, done)


@router.post(
    "/image_embed",
    response_model=TutorialEmbedResponse,
    responses=ERROR_RESPONSES,
    openapi_extra=body_openapi(TutorialImageEmbedRequest),
)
async def image_embed(request: Request) -> Response:
    registry, settings = ready_registry(request), settings_of(request)
    body = await read_body(request, TutorialImageEmbedRequest)
    entry = await registry.by_index(body.model_index, "image", 0)
    check_count(len(body.image_urls), settings.max_media_items, "image_urls", "media items")
    plan = EmbedPlan(media=body.image_urls, media_names=field_names("image_urls"))
    done = await run(entry, plan, settings, media_of(request))
    note(request, entry.name, done.count, done.tokens)
    return _embeddings(entry, done)


async def rerank(request: Request, body: TutorialRerankRequest) -> Response:
    registry, settings = ready_registry(request), settings_of(request)
    entry = await registry.by_index(body.model_index, "rerank", 2)
    result = await rerank_texts(entry, body.query, body.docs, settings, docs_param="docs")
    note(request, entry.name, len(body.docs), result.tokens)
    rankings = [
        {"index": r.index, "relevance_score": r.score, "document": body.docs[r.index]}
        for r in result.ranked
    ]
    return orjson_response({"rankings": rankings, "usage": result.tokens, "model": entry.name})


async def classify(request: Request, body: TutorialClassifyRequest) -> Response:
    registry, settings = ready_registry(request), settings_of(request)
    entry = await registry.by_index(body.model_index, "classify", 3)
    result = await classify_texts(entry, body.sentences, settings, param="sentences")
    note(request, entry.name, len(body.sentences), result.tokens)
    classifications = [
        [{"label": label, "score": score} for label, score in labels] for labels in result.labels
    ]
    return orjson_response(
        {"classifications": classifications, "usage": result.tokens, "model": entry.name}
    )
