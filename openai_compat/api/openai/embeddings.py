"""POST /v1/embeddings: OpenAI's contract (four input forms, float/base64, dimensions), plus
`modality` for image (CLIP) and audio (CLAP) inputs."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_compat.api.request import (
    body_openapi,
    media_of,
    note,
    read_body,
    ready_registry,
    settings_of,
)
from openai_compat.engine.usage import TokenIds
from openai_compat.errors import BadRequest, InputTooLong
from openai_compat.formats.encoding import embedding_payload, orjson_response
from openai_compat.formats.sparse import check_options, embedding_object
from openai_compat.formats.tokens import input_names
from openai_compat.inference.embed import (
    EmbedResult,
    check_dimensions,
    embed_media,
    embed_texts,
    texts_from_input,
    truncate_for,
)
from openai_compat.inference.long_inputs import embed_late, embed_long, long_payload
from openai_compat.models.registry import ModelEntry
from openai_compat.protocol import ERROR_RESPONSES, EmbeddingRequest, EmbeddingResponse
from openai_compat.settings import Settings

router = APIRouter(tags=["embeddings"])

_LONG_HINT = (
    "send long_input: 'truncate' (the first window), 'mean' (every window, averaged) or "
    "'chunks' (a vector per window); a model's long_input setting changes the default."
)


@router.post(
    "/embeddings",
    response_model=EmbeddingResponse,
    responses=ERROR_RESPONSES,
    openapi_extra=body_openapi(EmbeddingRequest),
)
async def create_embeddings(request: Request) -> Response:
    """Embed text (or, with `modality`, images and audio) with the named model."""
    ready_registry(request)
    body = await read_body(request, EmbeddingRequest)
    return await serve_embeddings(request, body, body.dimensions)


async def serve_embeddings(
    request: Request,
    body: EmbeddingRequest,
    dimensions: int | None,
    *,
    renormalize: bool = True,
    truncate_default: bool = False,
) -> Response:
    """The embeddings answer for a parsed body (also behind infinity's bare /embeddings,
    which cuts `dimensions` without renormalising and truncates long texts, as infinity does).
    A text past the window with no long_input or truncate setting anywhere is a 400, as
    OpenAI answers one past its 8,192 tokens."""
    registry, settings = ready_registry(request), settings_of(request)
    modality = body.modality or "text"
    capability = "embed" if modality == "text" else modality
    named = await registry.resolve(body.model)
    if named.sparse and modality == "text":
        return await _sparse(request, body, named, dimensions, truncate_default)
    if body.top_k is not None or body.min_weight is not None or body.return_tokens:
        param = "top_k" if body.top_k is not None else "min_weight"
        param = "return_tokens" if body.return_tokens else param
        raise BadRequest(
            f"'{param}' applies to sparse models only; {body.model!r} is not one.",
            param=param,
            code="unsupported_parameter",
        )
    entry = registry.check(named, body.model, capability)
    check_dimensions(dimensions, entry)
    result: EmbedResult
    if modality == "text":
        prompt = entry.prompts.choose(
            entry.name, input_type=body.input_type, prompt_name=body.prompt_name, task=body.task
        )
        texts = await texts_from_input(body.input, entry, settings)
        mode = body.long_input or entry.config.long_input
        if mode in ("mean", "chunks", "late") and not isinstance(texts[0], TokenIds):
            if mode == "late":
                long = await embed_late(
                    entry,
                    texts,
                    settings,
                    input_names,
                    prompt=prompt,
                    spans=body.chunk_spans,
                    chunk_tokens=body.chunk_tokens,
                )
            else:
                long = await embed_long(entry, texts, settings, input_names, prompt=prompt)
            note(request, entry.name, len(texts), long.tokens)
            fmt = body.encoding_format or "float"
            shape: Literal["mean", "chunks"] = "mean" if mode == "mean" else "chunks"
            payload = long_payload(
                long, mode=shape, fmt=fmt, dimensions=dimensions, model=body.model
            )
            return Response(payload, media_type="application/json")
        truncate = _truncate(mode, entry, settings, truncate_default)
        try:
            result = await embed_texts(entry, texts, settings, prompt=prompt, truncate=truncate)
        except InputTooLong as exc:  # the remedies this route has
            raise exc.advising(_LONG_HINT) from None
    else:
        items = [body.input] if isinstance(body.input, str) else body.input
        if not all(isinstance(i, str) for i in items):
            raise BadRequest(
                f"With modality '{modality}', input must be URLs or data: URIs (strings).",
                param="input",
            )
        result = await embed_media(entry, items, modality, settings, media_of(request))  # type: ignore[arg-type]
    note(request, entry.name, len(result.vectors), result.tokens)
    payload = embedding_payload(
        result.vectors,
        fmt=body.encoding_format or "float",
        dimensions=dimensions,
        model=body.model,
        prompt_tokens=result.tokens,
        renormalize=renormalize,
    )
    return Response(payload, media_type="application/json")


def _truncate(mode: str | None, entry: ModelEntry, settings: Settings, route_default: bool) -> bool:
    """Whether a text past the window is cut (else refused): the request's or the model's
    long_input, else the model's or the server's truncate, else the route's default."""
    return truncate_for(entry, settings, route_default) if mode is None else mode == "truncate"


async def _sparse(
    request: Request,
    body: EmbeddingRequest,
    entry: ModelEntry,
    dimensions: int | None,
    truncate_default: bool,
) -> Response:
    """A sparse (SPLADE) model: per input {"indices", "values"} (see formats/sparse.py)."""
    settings = settings_of(request)
    if dimensions is not None:
        raise BadRequest(
            f"'dimensions' does not apply to sparse model {entry.name!r}; use top_k to keep "
            "fewer weights.",
            param="dimensions",
            code="unsupported_parameter",
        )
    check_options(body.top_k, body.min_weight)
    prompt = entry.prompts.choose(
        entry.name, input_type=body.input_type, prompt_name=body.prompt_name, task=body.task
    )
    mode = body.long_input or entry.config.long_input
    if mode in ("mean", "chunks", "late"):
        raise BadRequest(
            f"long_input {mode!r} applies to dense models; {entry.name!r} is sparse (use "
            "'truncate' or 'error').",
            param="long_input",
            code="unsupported_parameter",
        )
    texts = await texts_from_input(body.input, entry, settings)
    truncate = _truncate(mode, entry, settings, truncate_default)
    result = await embed_texts(entry, texts, settings, prompt=prompt, truncate=truncate)
    note(request, entry.name, len(result.vectors), result.tokens)
    token_of = entry.tokenizer("return_tokens").token if body.return_tokens else None
    fmt = body.encoding_format or "float"
    data = [
        embedding_object(v.select(body.top_k, body.min_weight), i, fmt=fmt, token_of=token_of)
        for i, v in enumerate(result.vectors)
    ]
    usage = {"prompt_tokens": result.tokens, "total_tokens": result.tokens}
    return orjson_response({"object": "list", "data": data, "model": body.model, "usage": usage})
