"""vLLM's tokenize API: POST /tokenize (prompt -> tokens) and /detokenize (tokens -> prompt)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr
from starlette.responses import Response

from openai_compat.api.protocol import ERROR_RESPONSES
from openai_compat.api.request import body_openapi, read_body, ready_registry, settings_of
from openai_compat.formats.encoding import orjson_response
from openai_compat.inference.embed import detokenize_ids, tokenize_texts
from openai_compat.models.registry import ModelEntry

router = APIRouter(tags=["tokenize"])


class VllmTokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    prompt: StrictStr
    model: StrictStr | None = None
    add_special_tokens: StrictBool = True
    return_token_strs: StrictBool = False


class VllmDetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tokens: list[StrictInt]
    model: StrictStr | None = None


async def vllm_tokenize(request: Request, body: VllmTokenizeRequest) -> Response:
    entry = await _model(request, body.model)
    (row,) = await tokenize_texts(
        entry,
        [body.prompt],
        settings_of(request),
        add_special_tokens=body.add_special_tokens,
        param="prompt",
    )
    ids = [i for i, _, _, _ in row]
    out: dict[str, object] = {"tokens": ids, "count": len(ids), "max_model_len": entry.max_length}
    if body.return_token_strs:  # as vLLM: the tokenizer's strings for the ids ("##ing", "[CLS]")
        out["token_strs"] = [token for _, token, _, _ in row]
    return orjson_response(out)


@router.post(
    "/detokenize", responses=ERROR_RESPONSES, openapi_extra=body_openapi(VllmDetokenizeRequest)
)
async def detokenize(request: Request) -> Response:
    """vLLM: token ids back to text with the model's own tokenizer."""
    body = await read_body(request, VllmDetokenizeRequest)
    entry = await _model(request, body.model)
    (text,) = await detokenize_ids(
        entry, [body.tokens], settings_of(request), skip_special_tokens=True, param="tokens"
    )
    return orjson_response({"prompt": text})


async def _model(request: Request, name: str | None) -> ModelEntry:
    registry = ready_registry(request)
    if name is not None:
        return await registry.resolve(name)
    return await registry.default("embed", or_first=True)
