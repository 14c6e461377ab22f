"""Voyage AI's wire types, as the voyageai SDK (0.5) sends them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from openai_compat.api.protocol import error_responses
from openai_compat.frame.model_config import KeepAlive

InputType = Literal["query", "document"]
# Voyage's output_dtype: floats, or Cohere-like compact types (int8/uint8 scaled with the
# model's range, binary/ubinary packed sign bits, binary offset by 128)
OutputDtype = Literal["float", "int8", "uint8", "binary", "ubinary"]

# What the voyageai SDK is told wherever it is found at the wrong base URL (web/base_urls.py,
# Cohere's rerank route)
VOYAGE_HINT = "point the voyageai SDK at base_url=http://HOST:PORT/voyage/v1."


class VoyageError(BaseModel):
    detail: str


VOYAGE_ERROR_RESPONSES = error_responses(VoyageError)


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr
    keep_alive: KeepAlive = None
    input_type: InputType | None = Field(
        None, description="query or document: the model's prompt for that side (none: none)."
    )


class EmbedRequest(_Request):
    input: StrictStr | list[StrictStr] = Field(description="A text or a list of texts.")
    truncation: StrictBool | None = Field(
        True, description="Cut a text past the model's window (false: a 400 instead)."
    )
    output_dimension: StrictInt | None = Field(
        None, description="Cut each vector to its first N values (a Matryoshka size)."
    )
    output_dtype: OutputDtype | None = None  # null (the SDK default): float
    encoding_format: Literal["base64"] | None = Field(
        None, description="base64: each vector as the base64 of its bytes (of output_dtype)."
    )


class ContextualizedRequest(_Request):
    inputs: list[list[StrictStr]] = Field(
        description="Documents, each the list of its chunks; the chunks joined with one space "
        "are the document, and each chunk's vector is pooled from its own tokens of the "
        "document's forward pass."
    )
    output_dimension: StrictInt | None = None
    output_dtype: OutputDtype | None = None  # null (the SDK default): float
    encoding_format: Literal["base64"] | None = None


class RerankRequest(_Request):
    query: StrictStr
    documents: list[StrictStr]
    top_k: StrictInt | None = Field(None, description="Return the best K (default: all).")
    return_documents: StrictBool | None = False
    truncation: StrictBool | None = True


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "image_url", "image_base64"]
    text: StrictStr | None = None
    image_url: StrictStr | None = None
    image_base64: StrictStr | None = None


class MultimodalInput(BaseModel):
    content: list[ContentPart] = Field(min_length=1)


class MultimodalRequest(_Request):
    inputs: list[MultimodalInput]
    truncation: StrictBool | None = True
    output_encoding: Literal["base64"] | None = None
    output_dtype: OutputDtype | None = None  # null (the SDK default): float
    output_dimension: StrictInt | None = None
