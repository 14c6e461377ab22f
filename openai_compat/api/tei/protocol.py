"""TEI's request bodies, as text-embeddings-inference documents them (its openapi.json)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from openai_compat.api.protocol import error_responses

TokenIds = list[StrictInt]
TeiInputs = Annotated[
    StrictStr | TokenIds | list[StrictStr] | list[TokenIds], Field(union_mode="left_to_right")
]
Direction = Literal["Right", "Left", "right", "left"]


class TeiBody(BaseModel):
    """TEI's bodies; huggingface_hub's InferenceClient nests the options in `parameters`
    ({"inputs": ..., "parameters": {"normalize": ...}}), which count as top-level keys."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _lift_parameters(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("parameters"), dict):
            lifted = {k: v for k, v in data["parameters"].items() if v is not None}
            return {**lifted, **{k: v for k, v in data.items() if k != "parameters"}}
        return data


class TeiEmbedRequest(TeiBody):
    inputs: TeiInputs = Field(description="A string, a list of strings, or token ids.")
    normalize: StrictBool = Field(
        True,
        description="false: the model's own output, as sentence-transformers' "
        "encode(normalize_embeddings=False) gives it (still unit length where the model "
        "ends in a Normalize module).",
    )
    truncate: StrictBool | None = Field(
        None, description="Truncate over-long inputs (default: the model's truncate setting)."
    )
    truncation_direction: Direction = Field(
        "Right", description="Right drops the end of an over-long input, Left its beginning."
    )
    prompt_name: StrictStr | None = Field(None, description="One of the model's prompts.")
    dimensions: StrictInt | None = Field(None, description="Cut + L2-normalise to N values.")


class TeiEmbedSparseRequest(TeiBody):
    inputs: TeiInputs = Field(description="A string, a list of strings, or token ids.")
    truncate: StrictBool | None = Field(
        None, description="Truncate over-long inputs (default: the model's truncate setting)."
    )
    truncation_direction: Direction = Field(
        "Right", description="Right drops the end of an over-long input, Left its beginning."
    )
    prompt_name: StrictStr | None = Field(None, description="One of the model's prompts.")


class TeiRerankRequest(TeiBody):
    query: StrictStr
    texts: list[StrictStr]
    raw_scores: StrictBool = False
    return_text: StrictBool = False
    truncate: StrictBool | None = None
    truncation_direction: Direction = "Right"
    score_mode: StrictStr | None = Field(
        None,
        description="Extension, BGE-M3 models: 'hybrid' (default), 'dense', 'sparse' or "
        "'colbert' (FlagEmbedding's compute_score).",
    )


class TeiPredictRequest(TeiBody):
    inputs: StrictStr | list[StrictStr] | list[list[StrictStr]] = Field(
        description="A text, a [text, text] pair, or a list of texts or pairs."
    )
    raw_scores: StrictBool = False
    truncate: StrictBool | None = None
    truncation_direction: Direction = "Right"


class TeiTokenizeRequest(TeiBody):
    inputs: StrictStr | list[StrictStr]
    add_special_tokens: StrictBool = True
    prompt_name: StrictStr | None = None


class TeiDecodeRequest(TeiBody):
    ids: TokenIds | list[TokenIds]
    skip_special_tokens: StrictBool = True


class TeiError(BaseModel):
    error: str
    error_type: str


TEI_ERROR_RESPONSES = error_responses(
    TeiError,
    {
        400: "Empty input (TEI's Empty)",
        401: "Missing or wrong API key",
        413: "Input too long, or too many inputs",
        422: "Invalid request",
        424: "The model failed",
        429: "Too much queued work; retry after the Retry-After header",
        503: "Not ready or shutting down",
    },
)
