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
from openai_compat.api.items import check_image
from openai_compat.api.request import (
    body_openapi,
    media_of,
    note,
    read_body,
    ready_registry,
    settings_of,
)
from openai_compat.formats.compact import check_types, encode
from openai_compat.formats.encoding import as_matrix, orjson_response, truncate_dimensions
from openai_compat.ground.errors import BadRequest
from openai_compat.inference.embed import (
    check_count,
)
from openai_compat.inference.plan import EmbedPlan, check, run
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
        self.images: list[str | tuple[str, str]] = []  # (image, text): one content list's
        self.image_at: list[int] = []
        self.count = 0

    def add_text(self, text: str) -> None:
        self.texts.append(text)
        self.text_at.append(self.count)
        self.count += 1

    def add_image(self, url: str | tuple[str, str]) -> None:
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
            if len(images) > 1 or not (texts or images):
                raise BadRequest(
                    f"inputs[{i}]: each input is text parts and at most one image (one vector "
                    "per content list).",
                    param=f"inputs[{i}]",
                    code="unsupported_input",
                )
            text = " ".join(t for t in texts if t is not None)
            if images:  # with text parts: one vector for the pair, whatever their order
                inputs.add_image((images[0], text) if texts else images[0])
            else:
                inputs.add_text(text)
    return inputs


async def _entry(registry: Registry, body: EmbedRequestV1, inputs: _Inputs) -> ModelEntry:
    entry = await registry.require(body.model, "embed" if inputs.texts else "image")
    if inputs.texts and inputs.images:
        registry.check(entry, body.model, "image")
    for image, at in zip(inputs.images, inputs.image_at, strict=True):
        label = f"{inputs.param}[{at}]"
        check_image(entry, label, label, paired=isinstance(image, tuple))
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
    dimensions = body.output_dimension if isinstance(body, EmbedRequestV2) else None
    max_tokens = body.max_tokens if isinstance(body, EmbedRequestV2) else None
    fit = body.truncate is not None or max_tokens is not None  # the client chose the cut
    plan = EmbedPlan(
        texts=inputs.texts or None,
        text_at=inputs.text_at,
        names=inputs.text_names,
        media=inputs.images or None,
        media_at=inputs.image_at,
        media_names=inputs.image_names,
        param=inputs.param,
        input_type=body.input_type,
        own_truncation=fit,
        fit=fit,
        keep=_KEEP[body.truncate or "END"],
        max_tokens=max_tokens,
        dimensions=dimensions,
        dimensions_param="output_dimension",
    )
    check(entry, plan)  # output_dimension before the types that depend on it
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
    done = await run(entry, plan, settings, media_of(request))
    matrix = truncate_dimensions(as_matrix(done.vectors), dimensions)
    note(request, entry.name, inputs.count, done.tokens)

    billed: dict[str, int] = {"input_tokens": done.tokens}
    if inputs.images:
        billed["images"] = len(inputs.images)
    out: dict[str, Any] = {"id": str(uuid.uuid4())}
    if types is None:
        out |= {"response_type": "embeddings_floats", "embeddings": list(matrix)}
    else:
        by_type = {t: encode(matrix, t, entry.quantizer) for t in dict.fromkeys(types)}  # type: ignore[arg-type]
        out |= {"response_type": "embeddings_by_type", "embeddings": by_type}
    out["texts"] = inputs.texts
    if done.media is not None:
        out["images"] = done.media
    out["meta"] = {"api_version": {"version": version}, "billed_units": billed}
    return orjson_response(out)


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
