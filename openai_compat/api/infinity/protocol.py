"""infinity-emb 0.0.78's request bodies where they differ from ours."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator

from openai_compat.api.protocol import ERROR_RESPONSES, UNNAMED, EmbeddingRequest

# infinity-emb's own limits on its request bodies (its OpenAPI document): a string over
# MAX_CHARS, or more than MAX_ITEMS items, is its 422.
MAX_CHARS = 122_880
MAX_ITEMS = 2048
Text = Annotated[StrictStr, Field(max_length=MAX_CHARS)]


class InfinityRerankRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    query: Text
    documents: list[Text] = Field(min_length=1, max_length=MAX_ITEMS)
    return_documents: StrictBool = False
    raw_scores: StrictBool = False
    model: StrictStr = UNNAMED
    top_n: StrictInt | None = Field(None, gt=0)
    score_mode: StrictStr | None = Field(
        None,
        description="Extension, BGE-M3 models: 'hybrid' (default), 'dense', 'sparse' or "
        "'colbert' (FlagEmbedding's compute_score).",
    )


class InfinityClassifyRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input: Annotated[list[Text], Field(min_length=1, max_length=MAX_ITEMS)] | Text
    model: StrictStr = UNNAMED
    raw_scores: StrictBool = False


class InfinityMediaRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input: list[StrictStr] | StrictStr = Field(description="http(s) URLs or data: URIs.")
    model: StrictStr = UNNAMED
    encoding_format: str = "float"
    user: StrictStr | None = None


class InfinityEmbeddingRequest(EmbeddingRequest):
    """OpenAI's body as infinity's bare /embeddings reads it: `model` may be left out (its
    clients send "default/not-specified" or nothing): the default model answers; a text over
    infinity's MAX_CHARS is its 422. (Token-id inputs, which infinity refuses, stay ours.)"""

    model: StrictStr = UNNAMED

    @field_validator("input")
    @classmethod
    def _infinity_limits(cls, value: Any) -> Any:
        texts = [value] if isinstance(value, str) else value
        for text in texts:
            if isinstance(text, str) and len(text) > MAX_CHARS:
                raise ValueError(f"String should have at most {MAX_CHARS} characters")
        return value


class InfinityValidationError(BaseModel):
    """FastAPI's 422 body, as infinity-emb's server answers an invalid request body."""

    detail: list[dict[str, Any]]


INFINITY_ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    **ERROR_RESPONSES,
    422: {"model": InfinityValidationError, "description": "Invalid request body (infinity's)"},
}
