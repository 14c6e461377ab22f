"""POST /v1/classify: label distributions from a sequence-classification model."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_compat.api.protocol import ERROR_RESPONSES, ClassifyRequest, ClassifyResponse
from openai_compat.api.request import body_openapi, note, read_body, ready_registry, settings_of
from openai_compat.formats.encoding import orjson_response
from openai_compat.inference.scoring import ClassifyResult, classify_texts

router = APIRouter(tags=["classify"])


def classify_payload(result: ClassifyResult, model: str) -> dict[str, object]:
    data = []
    for i, labels in enumerate(result.labels):
        best_label, best_score = labels[0]
        data.append(
            {
                "object": "classification",
                "index": i,
                "label": best_label,
                "score": best_score,
                "labels": [{"label": label, "score": score} for label, score in labels],
            }
        )
    usage = {"prompt_tokens": result.tokens, "total_tokens": result.tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


@router.post(
    "/classify",
    response_model=ClassifyResponse,
    responses=ERROR_RESPONSES,
    openapi_extra=body_openapi(ClassifyRequest),
)
async def classify(request: Request) -> Response:
    """Classify each input: the best label and score, and every label's score, best first."""
    registry, settings = ready_registry(request), settings_of(request)
    body = await read_body(request, ClassifyRequest)
    entry = await registry.require(body.model, "classify")
    texts = [body.input] if isinstance(body.input, str) else body.input
    result = await classify_texts(entry, texts, settings, raw_scores=bool(body.raw_scores))
    note(request, entry.name, len(texts), result.tokens)
    return orjson_response(classify_payload(result, body.model))
