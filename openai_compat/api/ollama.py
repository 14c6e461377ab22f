"""Ollama's API on its own paths: POST /api/embed and the older /api/embeddings, GET /api/tags,
POST /api/show, GET /api/ps and GET /api/version, answered as Ollama's server answers them
(its field names, durations in nanoseconds, `{"error": ...}` bodies), so the tools that speak
only Ollama (its SDKs, LangChain's OllamaEmbeddings, Open WebUI...) list and use our models.

A model is named as served, or Ollama-style with a tag (`name:latest`). `keep_alive` is the
model pool's (docs/models.md; a keys-file key needs `set_keep_alive`). Ollama has no rerank.
"""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from starlette.responses import Response

from openai_compat import __version__
from openai_compat.api.openai.models import card as model_card
from openai_compat.api.protocol import error_responses
from openai_compat.api.request import body_openapi, note, read_body, ready_registry, settings_of
from openai_compat.engine import folders
from openai_compat.formats.encoding import as_matrix, orjson_response, truncate_dimensions
from openai_compat.frame.model_config import KeepAlive
from openai_compat.ground.errors import BadRequest, InputTooLong, ModelNotFound, NotFound
from openai_compat.inference.plan import EmbedPlan, run
from openai_compat.models.registry import ModelEntry, Registry

router = APIRouter(prefix="/api", tags=["ollama"])
# The Ollama release whose API this follows (its /api/version; clients check it is recent).
OLLAMA_VERSION = "0.13.0"
_STARTED = datetime.now(UTC).isoformat()


class OllamaError(BaseModel):
    error: str


OLLAMA_ERROR_RESPONSES = error_responses(OllamaError)


class EmbedRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr
    input: StrictStr | list[StrictStr]
    truncate: StrictBool | None = Field(True, description="false: past the window is a 400.")
    dimensions: StrictInt | None = None
    keep_alive: KeepAlive = None
    options: dict[str, Any] | None = Field(
        None, description="Accepted; model options are the config's."
    )


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr
    prompt: StrictStr
    keep_alive: KeepAlive = None
    options: dict[str, Any] | None = None


class ShowRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = None
    name: StrictStr | None = None  # the older field
    verbose: StrictBool | None = None


def _served(registry: Registry, name: str) -> str:
    """The served name for an Ollama model name: `name`, or `name:latest` (the one tag a
    served model has; any other is a 404, as Ollama answers a tag it does not have)."""
    try:
        return registry.config(name).served_name
    except ModelNotFound:
        base, _, tag = name.partition(":")
        if tag == "latest" and base:
            return registry.config(base).served_name
        raise


def _facts(registry: Registry, served: str) -> dict[str, Any]:
    """What a model said of itself (its /v1/models card): loaded now, or when it last was;
    {} for a lazy model never loaded. Reading it never loads or evicts a model."""
    entry = registry.loaded(served)
    if entry is not None:
        return model_card(entry, served)
    slot = registry.pool.slots.get(served) if registry.pool is not None else None
    return dict(slot.card) if slot is not None and slot.card else {}


def _embeds(facts: dict[str, Any]) -> bool:
    """Whether /api/embed serves the model (one dense vector an input); a model never loaded
    is listed: what it is is known only once it loads."""
    if not facts:
        return True
    return "embed" in facts.get("capabilities", []) and not facts.get("multivector")


async def _embed(
    request: Request, model: str, texts: Any, truncate: bool, dims: int | None
) -> tuple[ModelEntry, Any]:
    registry = ready_registry(request)
    entry = await registry.require(_served(registry, model), "embed")
    if entry.multivector or entry.sparse:
        raise BadRequest(
            f"Model {model!r} does not give one dense vector per input.", param="model"
        )
    plan = EmbedPlan(texts=texts, own_truncation=True, truncate=truncate, dimensions=dims)
    try:
        done = await run(entry, plan, settings_of(request))
    except InputTooLong as exc:  # Ollama's words for it, and its own switch
        advised = exc.advising("send truncate: true (Ollama's default) to cut it to the window.")
        raise BadRequest(
            f"the input length exceeds the context length: {advised.message}", param="input"
        ) from None
    note(request, entry.name, done.count, done.tokens)
    return entry, done


@router.post("/embed", responses=OLLAMA_ERROR_RESPONSES, openapi_extra=body_openapi(EmbedRequest))
async def embed(request: Request) -> Response:
    """Ollama's embed: unit vectors, `truncate`, `dimensions`; durations in nanoseconds."""
    started = time.perf_counter_ns()
    body = await read_body(request, EmbedRequest)
    _, done = await _embed(
        request, body.model, body.input, body.truncate is not False, body.dimensions
    )
    matrix = truncate_dimensions(as_matrix(done.vectors), body.dimensions)
    return orjson_response(
        {
            "model": body.model,
            "embeddings": list(matrix),
            "total_duration": time.perf_counter_ns() - started,
            "load_duration": 0,
            "prompt_eval_count": done.tokens,
        }
    )


@router.post(
    "/embeddings", responses=OLLAMA_ERROR_RESPONSES, openapi_extra=body_openapi(EmbeddingsRequest)
)
async def embeddings(request: Request) -> Response:
    """Ollama's older embeddings: one prompt, one vector."""
    body = await read_body(request, EmbeddingsRequest)
    _, done = await _embed(request, body.model, [body.prompt], True, None)
    return orjson_response({"embedding": as_matrix(done.vectors)[0]})


def _details(registry: Registry, served: str) -> dict[str, Any]:
    config = registry.config(served)
    family = folders.model_family(config.source, config.revision) or "unknown"
    return {
        "parent_model": "",
        "format": "safetensors",
        "family": family,
        "families": [family],
        "parameter_size": "",
        "quantization_level": config.dtype.upper().replace("FLOAT", "F"),
    }


def _card(registry: Registry, served: str) -> dict[str, Any]:
    size = 0
    if registry.pool is not None:
        described = registry.pool.describe(served)
        size = int(described.get("resident_bytes") or described.get("file_bytes") or 0)
    digest = hashlib.sha256(f"{served}\0{registry.config(served).source}".encode()).hexdigest()
    return {
        "name": f"{served}:latest",
        "model": f"{served}:latest",
        "modified_at": _STARTED,
        "size": size,
        "digest": digest,
        "details": _details(registry, served),
    }


@router.get("/tags", responses=OLLAMA_ERROR_RESPONSES)
async def tags(request: Request) -> Response:
    """The models this key may use, as Ollama lists its local models."""
    registry = ready_registry(request)
    served = [c.served_name for c in registry.configs if registry.visible(c.served_name)]
    listed = [s for s in served if _embeds(_facts(registry, s))]  # what /api/embed serves
    return orjson_response({"models": [_card(registry, s) for s in listed]})


@router.get("/ps", responses=OLLAMA_ERROR_RESPONSES)
async def ps(request: Request) -> Response:
    """The models loaded now, with when an idle one is unloaded (keep_alive)."""
    registry = ready_registry(request)
    out = []
    for config in registry.configs:
        served = config.served_name
        if not registry.visible(served) or registry.loaded(served) is None:
            continue
        card = _card(registry, served)
        left = registry.pool.describe(served).get("idle_unload_in") if registry.pool else None
        expires = datetime.fromtimestamp(time.time() + left, UTC) if left is not None else None
        card |= {
            "expires_at": (expires or datetime(2318, 1, 1, tzinfo=UTC)).isoformat(),
            "size_vram": 0,
        }
        out.append(card)
    return orjson_response({"models": out})


@router.post("/show", responses=OLLAMA_ERROR_RESPONSES, openapi_extra=body_openapi(ShowRequest))
async def show(request: Request) -> Response:
    """One model's details and what it can do (Ollama's capabilities: embedding)."""
    registry = ready_registry(request)
    body = await read_body(request, ShowRequest)
    name = body.model or body.name
    if not name:
        raise BadRequest("model is required", param="model")
    served = _served(registry, name)  # outside the key's scope: as if it did not exist
    facts = _facts(registry, served)  # a metadata read: no load, no eviction
    details = _details(registry, served)
    arch = details["family"]
    info: dict[str, Any] = {"general.architecture": arch}
    if facts.get("dimensions"):
        info[f"{arch}.embedding_length"] = facts["dimensions"]
    if facts.get("max_input_tokens"):
        info[f"{arch}.context_length"] = facts["max_input_tokens"]
    capabilities = ["embedding"] if facts and _embeds(facts) else []
    capabilities += ["vision"] if "image" in facts.get("modalities", []) else []
    return orjson_response(
        {
            "modelfile": "",
            "parameters": "",
            "template": "",
            "details": details,
            "model_info": info,
            "capabilities": capabilities,
            "modified_at": _STARTED,
        }
    )


class PullRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = None
    name: StrictStr | None = None  # the older field


@router.post("/pull", responses=OLLAMA_ERROR_RESPONSES, openapi_extra=body_openapi(PullRequest))
async def pull(request: Request) -> Response:
    """Nothing is pulled: models are the server's configuration. A served model answers as
    Ollama answers a model already present; any other is a 404 that says so."""
    registry = ready_registry(request)
    body = await read_body(request, PullRequest)
    name = body.model or body.name
    if not name:
        raise BadRequest("model is required", param="model")
    try:
        _served(registry, name)
    except ModelNotFound:
        raise NotFound(
            f"model '{name}' is not served, and nothing is pulled here: models come from the "
            "server's configuration (--config, --model).",
            param="model",
            code="model_not_found",
        ) from None
    return orjson_response({"status": "success"})


@router.get("/version")
async def version() -> Response:
    """The Ollama API version this server follows (and ours, as an extension)."""
    return orjson_response({"version": OLLAMA_VERSION, "openai_compat": __version__})
