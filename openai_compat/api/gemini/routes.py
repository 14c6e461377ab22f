"""Gemini's routes: POST /v1beta/models/{model}:embedContent and :batchEmbedContents (and the
same under /v1), for google-genai's `Client(http_options=HttpOptions(base_url=...))`,
LangChain's `GoogleGenerativeAIEmbeddings` on it, and REST callers. Keys come as
`x-goog-api-key` or `?key=` (web/middleware.py); errors in Google's body (ground/families.py).

Each request of a batch may carry its own taskType and title: requests asking for the same
prompt run as one plan, the plans concurrently (the scheduler batches them together)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_compat.api.gemini.protocol import (
    GOOGLE_ERROR_RESPONSES,
    BatchEmbedContentsRequest,
    EmbedContentRequest,
)
from openai_compat.api.request import (
    body_openapi,
    note,
    path_openapi,
    read_body,
    ready_registry,
    settings_of,
)
from openai_compat.formats.encoding import orjson_response
from openai_compat.ground.errors import BadRequest, NotFound
from openai_compat.inference.embed import check_count, check_dimensions
from openai_compat.inference.plan import Embedded, EmbedPlan, run
from openai_compat.models.registry import ModelEntry

router = APIRouter(tags=["gemini"])

METHODS = ("embedContent", "batchEmbedContents")
_HOLDS = "Gemini's embeddings hold one dense vector per content"


def model_name(given: str) -> str:
    """Gemini's `models/{name}` as our name (a name may hold slashes of its own)."""
    return given.removeprefix("models/")


def _text(req: EmbedContentRequest) -> str:
    return " ".join(part.text or "" for part in req.content.parts)


async def _embed(
    request: Request, entry: ModelEntry, reqs: list[EmbedContentRequest]
) -> list[np.ndarray]:
    """Each request's vector, in order: one plan per (taskType, title), run concurrently."""
    settings = settings_of(request)
    check_count(len(reqs), settings.max_inputs_per_request, "requests")
    groups: dict[tuple[str | None, str | None], list[int]] = {}
    for i, req in enumerate(reqs):
        check_dimensions(req.outputDimensionality, entry, _param(reqs, i, "outputDimensionality"))
        task = None if req.taskType == "TASK_TYPE_UNSPECIFIED" else req.taskType
        groups.setdefault((task, req.title), []).append(i)
    plans = [
        EmbedPlan(
            texts=[_text(reqs[i]) for i in members],
            param="content",
            input_type=task,
            title=title,
            truncate=True,  # Gemini's autoTruncate default: a text past the window is cut
        )
        for (task, title), members in groups.items()
    ]
    done: list[Embedded] = await asyncio.gather(*(run(entry, plan, settings) for plan in plans))
    note(request, entry.name, len(reqs), sum(d.tokens for d in done))
    vectors: list[Any] = [None] * len(reqs)
    for members, result in zip(groups.values(), done, strict=True):
        for i, vector in zip(members, result.vectors, strict=True):
            vectors[i] = vector[: reqs[i].outputDimensionality]  # Gemini's cut: not renormalised
    return vectors


def _param(reqs: list[EmbedContentRequest], i: int, field: str) -> str:
    return f"requests[{i}].{field}" if len(reqs) > 1 else field


def _values(vector: np.ndarray) -> dict[str, Any]:
    return {"values": np.asarray(vector, dtype="<f4")}


@router.post(
    "/v1beta/models/{target:path}",
    responses=GOOGLE_ERROR_RESPONSES,
    openapi_extra={
        **body_openapi(BatchEmbedContentsRequest, EmbedContentRequest),
        **path_openapi("target", "{model}:batchEmbedContents or {model}:embedContent"),
    },
    summary="Gemini embedContent / batchEmbedContents",
)
@router.post("/v1/models/{target:path}", include_in_schema=False)
async def call_model(request: Request) -> Response:
    """`{model}:embedContent` (one content -> `embedding`) or `{model}:batchEmbedContents`
    (requests -> `embeddings`), each vector as `{"values": [...]}`."""
    target = request.path_params["target"]
    name, _, method = target.rpartition(":")
    if method not in METHODS or not name:
        raise NotFound(
            f"Unknown method {target!r}: this server answers models/{{model}}:embedContent "
            "and :batchEmbedContents."
        )
    name = model_name(name)
    if method == "embedContent":
        one = await read_body(request, EmbedContentRequest)
        _same_model(one.model, name, "model")
        entry = await ready_registry(request).require_dense(name, _HOLDS)
        (vector,) = await _embed(request, entry, [one])
        return orjson_response({"embedding": _values(vector)})
    body = await read_body(request, BatchEmbedContentsRequest)
    for i, req in enumerate(body.requests):
        _same_model(req.model, name, f"requests[{i}].model")
    entry = await ready_registry(request).require_dense(name, _HOLDS)
    vectors = await _embed(request, entry, body.requests)
    return orjson_response({"embeddings": [_values(v) for v in vectors]})


def _same_model(given: str | None, name: str, param: str) -> None:
    """A request's model must be the URL's, as Gemini requires."""
    if given is not None and model_name(given) != name:
        raise BadRequest(
            f"{param} is {given!r}, but the URL names models/{name}; a batch embeds with the "
            "URL's model.",
            param=param,
        )
