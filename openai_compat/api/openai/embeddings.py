"""POST /v1/embeddings: OpenAI's contract (four input forms, float/base64, dimensions), plus
`modality` for image (CLIP) and audio (CLAP) inputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_compat.api.items import item_plan
from openai_compat.api.openai.outputs import answer, asked_outputs
from openai_compat.api.protocol import (
    ERROR_RESPONSES,
    ContentItem,
    EmbeddingRequest,
    EmbeddingResponse,
)
from openai_compat.api.request import (
    body_openapi,
    media_of,
    note,
    read_body,
    ready_registry,
    settings_of,
)
from openai_compat.formats.compact import encode_as
from openai_compat.formats.encoding import (
    as_matrix,
    embedding_payload,
    orjson_response,
    response_id,
    truncate_dimensions,
)
from openai_compat.formats.sparse import check_options, embedding_object
from openai_compat.ground.errors import BadRequest, InputTooLong, WholeTextTooLong
from openai_compat.inference.embed import check_count
from openai_compat.inference.long_inputs import long_payload
from openai_compat.inference.plan import Embedded, EmbedPlan, run
from openai_compat.models.registry import ModelEntry

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
    return await serve_embeddings(request, body, dimensions_of(body))


def dimensions_of(body: EmbeddingRequest) -> int | None:
    """`dimensions` (OpenAI's) or `output_dimension` (Mistral's), one or the other."""
    given = body.output_dimension
    if given is not None and body.dimensions is not None and given != body.dimensions:
        raise BadRequest(
            f"'dimensions' ({body.dimensions}) and 'output_dimension' ({given}) differ; send one.",
            param="output_dimension",
            code="conflicting_parameters",
        )
    return body.dimensions if body.dimensions is not None else given


def _check_dtype(body: EmbeddingRequest, entry: ModelEntry) -> bool:
    """Whether the answer is in a compact type (Mistral's output_dtype), refused before any
    work where the vectors are not one dense row per input."""
    if body.output_dtype in (None, "float"):
        return False
    several = body.output_types is not None and set(body.output_types) != {"dense"}
    if entry.sparse or entry.multivector or several or body.long_input in ("chunks", "late"):
        what = "sparse" if entry.sparse else "multi-vector" if entry.multivector else "chunked"
        what = f"those of output_types {body.output_types}" if several else what
        raise BadRequest(
            f"output_dtype {body.output_dtype!r} applies to one dense vector per input; "
            f"this request's vectors are {what}.",
            param="output_dtype",
            code="unsupported_parameter",
        )
    return True


def _compact(
    entry: ModelEntry, body: EmbeddingRequest, done: Embedded, dimensions: int | None
) -> Response:
    """The answer in Mistral's output_dtype: each vector's numbers of that type, or (base64)
    the base64 of their bytes."""
    matrix = truncate_dimensions(as_matrix(done.vectors), dimensions)
    base64_out = body.encoding_format == "base64"
    rows = encode_as(matrix, body.output_dtype, entry.quantizer, base64_out)
    data = [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)]
    usage = {"prompt_tokens": done.tokens, "total_tokens": done.tokens}
    return orjson_response(
        {"id": response_id(), "object": "list", "data": data, "model": body.model, "usage": usage}
    )


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
    registry = ready_registry(request)
    modality = body.modality or "text"
    given = body.input
    if isinstance(given, list) and not (given and isinstance(given[0], int)):
        # counted before anything walks the list (5 million strings took the loop 0.3 s);
        # one list of token ids is one input, counted where it is decoded
        check_count(len(given), settings_of(request).max_inputs_per_request, "input")
    named = await registry.resolve(body.model)
    items = content_items(given)
    if items is not None:  # Jina's items: texts, images and pairs in one request, in order
        if not named.sparse:  # a reranker or classifier: the same 400 as for strings
            named = registry.check(named, body.model, "embed")
        return await _serve_items(request, body, named, items, dimensions, renormalize)
    if not (named.sparse and modality == "text"):
        named = registry.check(named, body.model, "embed" if modality == "text" else modality)
    sparse_only = "return_tokens" if body.return_tokens else None
    sparse_only = sparse_only or next(
        (p for p in ("top_k", "min_weight") if getattr(body, p) is not None), None
    )
    outputs = asked_outputs(named, body.output_types)
    if (named.sparse or (outputs and "sparse" in outputs)) and modality == "text":
        check_options(body.top_k, body.min_weight)
    compact = _check_dtype(body, named)
    plan = EmbedPlan(
        texts=body.input if modality == "text" else None,
        media=_media_items(body.input, modality) if modality != "text" else None,
        modality=modality if modality != "text" else "image",
        input_type=body.input_type,
        prompt_name=body.prompt_name,
        task=body.task,
        choose_long=True,
        long_input=body.long_input,
        truncate_default=truncate_default,
        chunk_spans=body.chunk_spans,
        chunk_tokens=body.chunk_tokens,
        dimensions=dimensions,
        dimensions_param="dimensions" if body.dimensions is not None else "output_dimension",
        sparse_only=sparse_only,
        outputs=outputs,
    )
    try:
        done = await run(named, plan, settings_of(request), media_of(request))
    except InputTooLong as exc:  # the remedies this route has, for a dense model
        if named.sparse or isinstance(exc, WholeTextTooLong):
            raise
        raise exc.advising(_LONG_HINT) from None
    note(request, named.name, done.count, done.tokens)
    if compact:
        return _compact(named, body, done, dimensions)
    fmt = body.encoding_format or "float"
    if done.long is not None:
        shape: Literal["mean", "chunks"] = "mean" if done.mode == "mean" else "chunks"
        payload = long_payload(
            done.long, mode=shape, fmt=fmt, dimensions=dimensions, model=body.model
        )
        return Response(payload, media_type="application/json")
    if named.sparse and modality == "text":
        return _sparse(named, body, done)
    if outputs is not None:
        return answer(
            done.vectors,
            outputs,
            fmt=fmt,
            dimensions=dimensions,
            top_k=body.top_k,
            min_weight=body.min_weight,
            token_of=_token_of(named, body),
            model=body.model,
            tokens=done.tokens,
        )
    payload = embedding_payload(
        done.vectors,
        fmt=fmt,
        dimensions=dimensions,
        model=body.model,
        prompt_tokens=done.tokens,
        renormalize=renormalize,
    )
    return Response(payload, media_type="application/json")


def content_items(given: Any) -> list[ContentItem] | None:
    """Jina's input items, where `input` holds any (plain strings among them are texts)."""
    if not isinstance(given, list) or not any(isinstance(i, ContentItem) for i in given):
        return None
    return [ContentItem(text=i) if isinstance(i, str) else i for i in given]


async def _serve_items(
    request: Request,
    body: EmbeddingRequest,
    entry: ModelEntry,
    items: list[ContentItem],
    dimensions: int | None,
    renormalize: bool,
) -> Response:
    """Texts, images and (image, text) pairs in the client's order, one vector each."""
    compact = _check_dtype(body, entry)
    plan = EmbedPlan(
        **item_plan(entry, items, "input"),
        input_type=body.input_type,
        prompt_name=body.prompt_name,
        task=body.task,
        dimensions=dimensions,
    )
    done = await run(entry, plan, settings_of(request), media_of(request))
    note(request, entry.name, done.count, done.tokens)
    if compact:
        return _compact(entry, body, done, dimensions)
    payload = embedding_payload(
        done.vectors,
        fmt=body.encoding_format or "float",
        dimensions=dimensions,
        model=body.model,
        prompt_tokens=done.tokens,
        renormalize=renormalize,
    )
    return Response(payload, media_type="application/json")


def _media_items(given: Any, modality: str) -> list[str]:
    items = [given] if isinstance(given, str) else given
    if not all(isinstance(i, str) for i in items):
        raise BadRequest(
            f"With modality '{modality}', input must be URLs or data: URIs (strings).",
            param="input",
        )
    return list(items)


def _token_of(entry: ModelEntry, body: EmbeddingRequest) -> Callable[[int], str] | None:
    return entry.tokenizer("return_tokens").token if body.return_tokens else None


def _sparse(entry: ModelEntry, body: EmbeddingRequest, done: Embedded) -> Response:
    """A sparse (SPLADE) model: per input {"indices", "values"} (see formats/sparse.py)."""
    token_of = _token_of(entry, body)
    fmt = body.encoding_format or "float"
    data = [
        embedding_object(v.select(body.top_k, body.min_weight), i, fmt=fmt, token_of=token_of)
        for i, v in enumerate(done.vectors)
    ]
    usage = {"prompt_tokens": done.tokens, "total_tokens": done.tokens}
    answer = {"id": response_id(), "object": "list", "data": data, "model": body.model}
    return orjson_response({**answer, "usage": usage})
