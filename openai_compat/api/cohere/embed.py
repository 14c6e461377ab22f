"""Cohere's embed API: POST /v1/embed and /v2/embed (texts, images, v2 content inputs).

Errors on these paths use Cohere's body ({"message": ...}; see errors.family_of), so the
cohere SDK raises its BadRequestError / NotFoundError / ... with the message it expects.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Literal

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_compat.api.cohere.protocol import (
    COHERE_ERROR_RESPONSES,
    EmbedByTypeResponse,
    EmbedFloatsResponse,
    EmbedRequestV1,
    EmbedRequestV2,
)
from openai_compat.api.request import (
    body_openapi,
    media_of,
    note,
    read_body,
    ready_registry,
    settings_of,
)
from openai_compat.errors import BadRequest
from openai_compat.formats.compact import check_types, encode
from openai_compat.formats.encoding import as_matrix, orjson_response, truncate_dimensions
from openai_compat.inference.embed import (
    check_count,
    check_dimensions,
    embed_fitted,
    embed_media,
    embed_texts,
)
from openai_compat.inference.long_inputs import embed_by_setting
from openai_compat.models.registry import ModelEntry, Registry

router = APIRouter(tags=["cohere"])

# Cohere's truncate -> which part of an over-long text to keep (None: refuse it).
_KEEP: dict[str, Literal["start", "end"] | None] = {"END": "start", "START": "end", "NONE": None}


class _Inputs:
    """What a request asks to embed, split into texts and images, in the client's order."""

    def __init__(self, param: str) -> None:
        self.param = param
        self.texts: list[str] = []
        self.text_at: list[int] = []  # client index of each text
        self.images: list[str] = []
        self.image_at: list[int] = []
        self.count = 0

    def add_text(self, text: str) -> None:
        self.texts.append(text)
        self.text_at.append(self.count)
        self.count += 1

    def add_image(self, url: str) -> None:
        self.images.append(url)
        self.image_at.append(self.count)
        self.count += 1

    def text_names(self, i: int) -> tuple[str, str]:
        return self.param, f"{self.param}[{self.text_at[i]}]"

    def image_names(self, i: int) -> tuple[str, str]:
        return self.param, f"{self.param}[{self.image_at[i]}]"


def _inputs(body: EmbedRequestV1) -> _Inputs:
    given = [p for p in ("texts", "images", "inputs") if getattr(body, p, None) is not None]
    if len(given) != 1:
        raise BadRequest(
            "Send exactly one of 'texts', 'images' or 'inputs'"
            + (f" (got {', '.join(given)})." if given else "."),
            param=given[-1] if given else "texts",
            code="invalid_inputs",
        )
    inputs = _Inputs(given[0])
    if body.texts is not None:
        for text in body.texts:
            inputs.add_text(text)
    elif body.images is not None:
        for url in body.images:
            inputs.add_image(url)
    else:
        assert isinstance(body, EmbedRequestV2) and body.inputs is not None
        for i, item in enumerate(body.inputs):
            texts = [p.text for p in item.content if p.type == "text"]
            images = [p.image_url.url for p in item.content if p.image_url is not None]
            if any(t is None for t in texts) or len(images) != sum(
                p.type == "image_url" for p in item.content
            ):
                raise BadRequest(
                    f"inputs[{i}]: a text part needs 'text' and an image_url part 'image_url.url'.",
                    param=f"inputs[{i}]",
                )
            if (images and (texts or len(images) > 1)) or not (texts or images):
                raise BadRequest(
                    f"inputs[{i}]: each input must be text parts or exactly one image; this "
                    "server does not fuse text and images into one vector.",
                    param=f"inputs[{i}]",
                    code="unsupported_input",
                )
            if images:
                inputs.add_image(images[0])
            else:
                inputs.add_text(" ".join(t for t in texts if t is not None))
    return inputs


async def _entry(registry: Registry, body: EmbedRequestV1, inputs: _Inputs) -> ModelEntry:
    entry = await registry.require(body.model, "embed" if inputs.texts else "image")
    if inputs.texts and inputs.images:
        registry.check(entry, body.model, "image")
    if entry.multivector:
        raise BadRequest(
            f"Model {entry.name!r} gives one vector per token; Cohere's embed response holds "
            "one vector per input. Use /v1/embeddings.",
            param="model",
            code="model_not_supported",
        )
    return entry


# Cohere's EmbedInputType
COHERE_INPUT_TYPES = frozenset(
    {"search_document", "search_query", "classification", "clustering", "image"}
)


async def _embed(request: Request, model: type[EmbedRequestV1], version: str) -> Response:
    registry, settings = ready_registry(request), settings_of(request)
    body = await read_body(request, model)
    v2 = isinstance(body, EmbedRequestV2)
    inputs = _inputs(body)
    check_count(inputs.count, settings.max_inputs_per_request, inputs.param)
    if inputs.images:
        check_count(len(inputs.images), settings.max_media_items, inputs.param, "images")
    entry = await _entry(registry, body, inputs)
    dimensions = _output_dimension(body, entry) if v2 else None
    types: Sequence[str] | None = body.embedding_types or None
    if types is None and v2:
        types = ["float"]
    if types is not None:
        check_types(types, dimensions or entry.dimensions, "embedding_types")
    if (
        body.input_type is not None
        and body.input_type not in COHERE_INPUT_TYPES
        and body.input_type not in entry.prompts.prompts
    ):  # Cohere's enum (EmbedInputType), or one of the model's own prompt names
        raise BadRequest(
            f"'input_type' must be one of {', '.join(sorted(COHERE_INPUT_TYPES))} or a prompt "
            f"name of model {entry.name!r}; got {body.input_type!r}.",
            param="input_type",
            code="invalid_input_type",
        )
    prompt = entry.prompts.choose(entry.name, input_type=body.input_type)

    parts: list[tuple[list[int], list[Any]]] = []
    tokens = 0
    if inputs.texts:
        max_tokens = body.max_tokens if isinstance(body, EmbedRequestV2) else None
        by_setting = None
        if body.truncate is None and max_tokens is None:  # the model's own setting
            by_setting = await embed_by_setting(
                entry, inputs.texts, settings, inputs.text_names, prompt=prompt
            )
        if by_setting is not None:
            result = by_setting
        elif body.truncate is None and max_tokens is None:
            result = await embed_texts(
                entry, inputs.texts, settings, inputs.text_names, prompt=prompt
            )
        else:
            result = await embed_fitted(
                entry,
                inputs.texts,
                settings,
                inputs.text_names,
                prompt=prompt,
                keep=_KEEP[body.truncate or "END"],
                max_tokens=max_tokens,
            )
        parts.append((inputs.text_at, result.vectors))
        tokens += result.tokens
    images_meta = None
    if inputs.images:
        media = await embed_media(
            entry, inputs.images, "image", settings, media_of(request), inputs.image_names
        )
        parts.append((inputs.image_at, media.vectors))
        images_meta = media.media
    ordered: list[Any] = [None] * inputs.count
    for at, vectors in parts:
        for i, v in zip(at, vectors, strict=True):
            ordered[i] = v
    matrix = truncate_dimensions(as_matrix(ordered), dimensions)
    note(request, entry.name, inputs.count, tokens)

    billed: dict[str, int] = {"input_tokens": tokens}
    if inputs.images:
        billed["images"] = len(inputs.images)
    out: dict[str, Any] = {"id": str(uuid.uuid4())}
    if types is None:
        out |= {"response_type": "embeddings_floats", "embeddings": list(matrix)}
    else:
        by_type = {t: encode(matrix, t, entry.quantizer) for t in dict.fromkeys(types)}  # type: ignore[arg-type]
        out |= {"response_type": "embeddings_by_type", "embeddings": by_type}
    out["texts"] = inputs.texts
    if images_meta is not None:
        out["images"] = images_meta
    out["meta"] = {"api_version": {"version": version}, "billed_units": billed}
    return orjson_response(out)


def _output_dimension(body: EmbedRequestV1, entry: ModelEntry) -> int | None:
    wanted = body.output_dimension if isinstance(body, EmbedRequestV2) else None
    if wanted is None:
        return None
    check_dimensions(wanted, entry, "output_dimension")
    return wanted


@router.post(
    "/v1/embed",
    response_model=EmbedFloatsResponse | EmbedByTypeResponse,
    responses=COHERE_ERROR_RESPONSES,
    openapi_extra=body_openapi(EmbedRequestV1),
)
async def embed_v1(request: Request) -> Response:
    """Embed texts or images (Cohere v1): float lists, or the requested embedding types."""
    return await _embed(request, EmbedRequestV1, "1")


@router.post(
    "/v2/embed",
    response_model=EmbedByTypeResponse,
    responses=COHERE_ERROR_RESPONSES,
    openapi_extra=body_openapi(EmbedRequestV2),
)
async def embed_v2(request: Request) -> Response:
    """Embed texts, images or content inputs (Cohere v2), keyed by embedding type."""
    return await _embed(request, EmbedRequestV2, "2")
