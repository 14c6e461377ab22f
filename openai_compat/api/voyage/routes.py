"""Voyage AI's routes: POST /voyage/v1/embeddings, /contextualizedembeddings, /rerank and
/multimodalembeddings (`voyageai.Client(base_url=".../voyage/v1")`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_compat.api.items import item_plan
from openai_compat.api.protocol import ContentItem
from openai_compat.api.request import (
    body_openapi,
    media_of,
    note,
    read_body,
    ready_registry,
    settings_of,
)
from openai_compat.api.voyage.protocol import (
    VOYAGE_ERROR_RESPONSES,
    ContextualizedRequest,
    EmbedRequest,
    MultimodalRequest,
    RerankRequest,
)
from openai_compat.formats.compact import encode_as
from openai_compat.formats.encoding import as_matrix, orjson_response, truncate_dimensions
from openai_compat.formats.tokens import field_names
from openai_compat.ground.errors import BadRequest, InputTooLong
from openai_compat.inference.embed import check_count
from openai_compat.inference.plan import EmbedPlan, run
from openai_compat.inference.scoring import check_top_n, rerank_texts

router = APIRouter(prefix="/voyage/v1", tags=["voyage"])
_HOLDS = "Voyage's embeddings hold one dense vector per input"


def _answer(data: list[Any], model: str, usage: dict[str, int]) -> Response:
    """Voyage's answer: a list object with the model and the usage."""
    return orjson_response({"object": "list", "data": data, "model": model, "usage": usage})


def _embedding_list(rows: list[Any]) -> list[dict[str, Any]]:
    return [{"object": "embedding", "embedding": r, "index": i} for i, r in enumerate(rows)]


# Voyage's own switch for text past the window (its default cuts it)
_LONG_HINT = "send truncation=true (Voyage's default) to cut it to the window."


async def _run(entry: Any, plan: EmbedPlan, settings: Any, media: Any = None) -> Any:
    """plan.run with this dialect's remedy for an over-long input."""
    try:
        return await run(entry, plan, settings, media)
    except InputTooLong as exc:
        raise exc.advising(_LONG_HINT) from None


@router.post(
    "/embeddings", responses=VOYAGE_ERROR_RESPONSES, openapi_extra=body_openapi(EmbedRequest)
)
async def embeddings(request: Request) -> Response:
    """Voyage's embed: input_type picks the model's prompt, truncation, output_dimension,
    output_dtype and base64 as its SDK asks for them."""
    registry, settings = ready_registry(request), settings_of(request)
    body = await read_body(request, EmbedRequest)
    entry = await registry.require_dense(body.model, _HOLDS)
    plan = EmbedPlan(
        texts=body.input,
        input_type=body.input_type,
        own_truncation=True,
        truncate=body.truncation is not False,
        dimensions=body.output_dimension,
        dimensions_param="output_dimension",
    )
    done = await _run(entry, plan, settings)
    note(request, entry.name, done.count, done.tokens)
    matrix = truncate_dimensions(as_matrix(done.vectors), body.output_dimension)
    rows = encode_as(matrix, body.output_dtype, entry.quantizer, body.encoding_format == "base64")
    return _answer(_embedding_list(rows), body.model, {"total_tokens": done.tokens})


@router.post(
    "/contextualizedembeddings",
    responses=VOYAGE_ERROR_RESPONSES,
    openapi_extra=body_openapi(ContextualizedRequest),
)
async def contextualized(request: Request) -> Response:
    """Voyage's contextualized chunk embeddings: each document (its chunks joined with one
    space) in one forward pass, each chunk's vector pooled from that pass's token vectors of
    its own characters (late chunking at the chunks' spans), normalised; a one-chunk
    document's vector is the plain embedding of its text."""
    registry, settings = ready_registry(request), settings_of(request)
    body = await read_body(request, ContextualizedRequest)
    entry = await registry.require_dense(body.model, _HOLDS)
    texts, spans = [], []
    for i, chunks in enumerate(body.inputs):
        if not chunks:
            raise BadRequest(f"inputs[{i}] has no chunks.", param=f"inputs[{i}]")
        at, cut = 0, []
        for chunk in chunks:
            cut.append((at, at + len(chunk)))
            at += len(chunk) + 1
        texts.append(" ".join(chunks))
        spans.append(cut)
    plan = EmbedPlan(
        texts=texts,
        param="inputs",
        names=field_names("inputs"),
        input_type=body.input_type,
        long_input="late",
        chunk_spans=spans,
        dimensions=body.output_dimension,
        dimensions_param="output_dimension",
    )
    try:
        done = await run(entry, plan, settings)
    except InputTooLong as exc:
        raise exc.advising(
            "split it into shorter documents: contextualized chunk embeddings read the whole "
            "document in one window of the model."
        ) from None
    assert done.long is not None
    note(request, entry.name, sum(len(c) for c in body.inputs), done.tokens)
    data = []
    for i, (pooled, document) in enumerate(zip(done.long.chunks, done.long.vectors, strict=True)):
        vectors = [document] if len(pooled) == 1 else [c.vector for c in pooled]
        matrix = truncate_dimensions(as_matrix(vectors), body.output_dimension)
        rows = encode_as(
            matrix, body.output_dtype, entry.quantizer, body.encoding_format == "base64"
        )
        data.append({"object": "list", "data": _embedding_list(rows), "index": i})
    return _answer(data, body.model, {"total_tokens": done.tokens})


@router.post("/rerank", responses=VOYAGE_ERROR_RESPONSES, openapi_extra=body_openapi(RerankRequest))
async def rerank(request: Request) -> Response:
    """Voyage's rerank: the same scores as Cohere's rerank; top_k, return_documents."""
    registry, settings = ready_registry(request), settings_of(request)
    body = await read_body(request, RerankRequest)
    entry = await registry.require(body.model, "rerank")
    check_top_n(body.top_k, "top_k")
    if body.truncation is False:  # refuse a pair past the window instead of cutting it
        settings = settings.model_copy(update={"truncate": False})
    result = await rerank_texts(entry, body.query, body.documents, settings)
    note(request, entry.name, len(body.documents), result.tokens)
    ranked = result.ranked[: body.top_k] if body.top_k else result.ranked
    data = []
    for r in ranked:
        item: dict[str, Any] = {"relevance_score": r.score, "index": r.index}
        if body.return_documents:
            item["document"] = body.documents[r.index]
        data.append(item)
    return _answer(data, body.model, {"total_tokens": result.tokens})


@router.post(
    "/multimodalembeddings",
    responses=VOYAGE_ERROR_RESPONSES,
    openapi_extra=body_openapi(MultimodalRequest),
)
async def multimodal(request: Request) -> Response:
    """Voyage's multimodal embed on a vision-language model: each input's content list (text,
    image_url and image_base64 parts, at most one image) is one vector."""
    registry, settings = ready_registry(request), settings_of(request)
    body = await read_body(request, MultimodalRequest)
    check_count(len(body.inputs), settings.max_inputs_per_request, "inputs")
    entry = await registry.require_dense(body.model, _HOLDS)
    items = []
    for i, given in enumerate(body.inputs):
        texts = [p.text for p in given.content if p.type == "text"]
        images = [p.image_url or p.image_base64 for p in given.content if p.type != "text"]
        if any(t is None for t in texts) or any(m is None for m in images):
            raise BadRequest(
                f"inputs[{i}]: each part needs the field its type names.", param=f"inputs[{i}]"
            )
        if len(images) > 1:
            raise BadRequest(
                f"inputs[{i}] has {len(images)} images; this server embeds one image (and its "
                "text) per input.",
                param=f"inputs[{i}]",
            )
        text = " ".join(t for t in texts if t is not None) if texts else None
        items.append(ContentItem(text=text, image=images[0] if images else None))
    plan = EmbedPlan(
        **item_plan(entry, items, "inputs"),
        input_type=body.input_type,
        own_truncation=True,
        truncate=body.truncation is not False,
        dimensions=body.output_dimension,
        dimensions_param="output_dimension",
    )
    done = await _run(entry, plan, settings, media_of(request))
    note(request, entry.name, done.count, done.tokens)
    matrix = truncate_dimensions(as_matrix(done.vectors), body.output_dimension)
    rows = encode_as(matrix, body.output_dtype, entry.quantizer, body.output_encoding == "base64")
    pixels = sum(int(m.get("width", 0)) * int(m.get("height", 0)) for m in done.media or [])
    text_parts = [t.text for t in items if t.text is not None]
    counted = (
        await entry.counter.usage(text_parts, truncate=True) if entry.counter and text_parts else 0
    )
    usage = {
        "text_tokens": counted,
        "image_pixels": pixels,
        "video_pixels": 0,
        "total_tokens": done.tokens,
    }
    return _answer(_embedding_list(rows), body.model, usage)
