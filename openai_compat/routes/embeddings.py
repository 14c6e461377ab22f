"""POST /v1/embeddings: OpenAI's contract (four input forms, float/base64, dimensions), plus
`modality` for image (CLIP) and audio (CLAP) inputs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from starlette.responses import Response

from openai_compat.encoding import embedding_payload
from openai_compat.errors import BadRequest
from openai_compat.inference import (
    EmbedResult,
    check_dimensions,
    embed_media,
    embed_texts,
    texts_from_input,
)
from openai_compat.protocol import ERROR_RESPONSES, EmbeddingRequest, EmbeddingResponse
from openai_compat.routes import MediaDep, RegistryDep, SettingsDep, body_openapi, json_body

router = APIRouter(tags=["embeddings"])


@router.post(
    "/embeddings",
    response_model=EmbeddingResponse,
    responses=ERROR_RESPONSES,
    openapi_extra=body_openapi(EmbeddingRequest),
)
async def create_embeddings(
    body: Annotated[EmbeddingRequest, Depends(json_body(EmbeddingRequest))],
    registry: RegistryDep,
    settings: SettingsDep,
    media: MediaDep,
) -> Response:
    """Embed text (or, with `modality`, images and audio) with the named model."""
    modality = body.modality or "text"
    entry = registry.require(body.model, "embed" if modality == "text" else modality)
    check_dimensions(body.dimensions, entry)
    result: EmbedResult
    if modality == "text":
        texts = texts_from_input(body.input, entry, settings)
        result = await embed_texts(entry, texts, settings)
    else:
        items = [body.input] if isinstance(body.input, str) else body.input
        if not all(isinstance(i, str) for i in items):
            raise BadRequest(
                f"With modality '{modality}', input must be URLs or data: URIs (strings).",
                param="input",
            )
        result = await embed_media(entry, items, modality, settings, media)  # type: ignore[arg-type]
    payload = embedding_payload(
        result.vectors,
        fmt=body.encoding_format or "float",
        dimensions=body.dimensions,
        model=body.model,
        prompt_tokens=result.tokens,
    )
    return Response(payload, media_type="application/json")
