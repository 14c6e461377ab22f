"""GET /v1/models and /v1/models/{id} (ids may contain '/', raw or percent-encoded)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_compat.api.protocol import ERROR_RESPONSES, ModelCard, ModelList
from openai_compat.api.request import ready_registry
from openai_compat.engine.bge_m3 import SCORE_MODES
from openai_compat.formats.encoding import orjson_response
from openai_compat.models.registry import ModelEntry, Registry, owned_by

_STARTED = int(time.time())

router = APIRouter(tags=["models"])


def card(entry: ModelEntry, id: str) -> dict[str, Any]:
    return ModelCard(
        id=id,
        created=entry.created,
        owned_by=entry.owned_by,
        root=entry.name,
        capabilities=sorted(entry.capabilities),
        modalities=[m for m in ("text", "image", "audio") if m in entry.modalities],
        dimensions=entry.dimensions,
        multivector=entry.multivector or None,
        matryoshka_dimensions=entry.config.matryoshka_dimensions,
        outputs=list(entry.outputs) or None,
        score_modes=list(SCORE_MODES) if entry.outputs else None,
        max_input_tokens=entry.max_length,
        **(entry.prompts.describe() or {}),
        quantization_range=entry.quantizer.range(entry.dimensions or 0)
        if entry.quantizer
        else None,
        **_precision(entry.precision),
    ).model_dump(exclude_none=True)


def _precision(verdict: dict[str, Any] | None) -> dict[str, Any]:
    """dtype and device as fields of their own; why, and the check's figures, beside them."""
    if not verdict:
        return {}
    why = {
        "reason": verdict["reason"],
        **({"check": verdict["check"]} if "check" in verdict else {}),
    }
    return {"dtype": verdict["dtype"], "device": verdict["device"], "precision": why}


def _listed(registry: Registry, id: str) -> dict[str, Any]:
    """A served name's card: what the loaded model says of itself, else what its config says;
    with its state and load setting (extensions)."""
    config = registry.config(id)
    entry = registry.loaded(id)
    if entry is not None:
        listed = card(entry, id)
    elif registry.pool is not None and (known := registry.pool.slots[config.served_name].card):
        listed = {**known, "id": id}  # what it said of itself when it was last loaded
    else:
        listed = ModelCard(
            id=id, created=_STARTED, owned_by=owned_by(config.model), root=config.served_name
        ).model_dump(exclude_none=True)
    pool = registry.pool
    listed["state"] = pool.slots[config.served_name].state if pool else "loaded"
    listed["load"] = config.load
    return listed


def model_cards(registry: Registry) -> list[tuple[dict[str, Any], ModelEntry | None]]:
    """A card for every served name and alias, with the model it names if it is loaded."""
    return [
        (_listed(registry, id), registry.loaded(id))
        for config in registry.configs
        if registry.visible(config.served_name)
        for id in (config.served_name, *config.aliases)
    ]


@router.get("/models", response_model=ModelList, responses=ERROR_RESPONSES)
async def list_models(request: Request) -> Response:
    """Every served name and alias, with each model's capabilities and state."""
    cards = [listed for listed, _ in model_cards(ready_registry(request))]
    return orjson_response({"object": "list", "data": cards})


@router.get("/models/{model_id:path}", response_model=ModelCard, responses=ERROR_RESPONSES)
async def retrieve_model(model_id: str, request: Request) -> Response:
    return orjson_response(_listed(ready_registry(request), model_id))
