"""GET /v1/models and /v1/models/{id} (ids may contain '/', raw or percent-encoded)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_compat.api.request import ready_registry
from openai_compat.encoding import orjson_response
from openai_compat.protocol import ERROR_RESPONSES, ModelCard, ModelList
from openai_compat.registry import ModelEntry, Registry

router = APIRouter(tags=["models"])


def _card(entry: ModelEntry, id: str) -> dict[str, object]:
    return ModelCard(
        id=id,
        created=entry.created,
        owned_by=entry.owned_by,
        root=entry.name,
        capabilities=sorted(entry.capabilities),
        dimensions=entry.dimensions,
        max_input_tokens=entry.max_length,
        **(entry.prompts.describe() or {}),
        quantization_range=entry.quantizer.range(entry.dimensions or 0)
        if entry.quantizer
        else None,
    ).model_dump(exclude_none=True)


def model_cards(registry: Registry) -> list[tuple[dict[str, object], ModelEntry]]:
    """A card for every served name and alias, with the model it names."""
    cards = []
    for entry in registry.entries():
        for id in (entry.name, *entry.config.aliases):
            cards.append((_card(entry, id), entry))
    return cards


@router.get("/models", response_model=ModelList, responses=ERROR_RESPONSES)
async def list_models(request: Request) -> Response:
    """Every served name and alias, with each model's capabilities."""
    cards = [card for card, _ in model_cards(ready_registry(request))]
    return orjson_response({"object": "list", "data": cards})


@router.get("/models/{model_id:path}", response_model=ModelCard, responses=ERROR_RESPONSES)
async def retrieve_model(model_id: str, request: Request) -> Response:
    return orjson_response(_card(ready_registry(request).resolve(model_id), model_id))
