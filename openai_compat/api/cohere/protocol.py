"""Cohere's wire types (embed and rerank, v1 and v2), as the cohere SDK sends and parses them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator

from openai_compat.api.protocol import Usage, check_echoable, error_responses
from openai_compat.frame.model_config import KeepAlive

Truncate = Literal["NONE", "START", "END"]


class CohereError(BaseModel):
    message: str


COHERE_ERROR_RESPONSES = error_responses(CohereError)


class EmbedRequestV1(BaseModel):
    """Cohere's v1 embed request. `null` means "not given" (the SDK omits unset fields)."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr
    texts: list[StrictStr] | None = Field(None, description="Texts to embed.")
    images: list[StrictStr] | None = Field(
        None, description="Images as data: URIs (for image models)."
    )
    input_type: StrictStr | None = Field(
        None,
        description="search_query, search_document, classification, clustering, image, or a "
        "prompt name of the model; picks the model's prompt (ignored by models without any).",
    )
    embedding_types: list[StrictStr] | None = Field(
        None, description="float, int8, uint8, binary, ubinary, base64 (see the README)."
    )
    truncate: Truncate | None = Field(
        None,
        description="END (default) drops the end of over-long input, START its beginning, "
        "NONE refuses it (400).",
    )


class ImageUrl(BaseModel):
    model_config = ConfigDict(extra="ignore")

    url: StrictStr


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "image_url"]
    text: StrictStr | None = None
    image_url: ImageUrl | None = None


class EmbedInput(BaseModel):
    model_config = ConfigDict(extra="ignore")

    content: list[ContentPart]


class EmbedRequestV2(EmbedRequestV1):
    """Cohere's v2 embed request."""

    inputs: list[EmbedInput] | None = Field(
        None,
        description="Content lists; each input is text parts (joined by a space) or one image.",
    )
    max_tokens: StrictInt | None = Field(
        None, description="Tokens per input as the model sees them (prompt included)."
    )
    output_dimension: StrictInt | None = Field(
        None, description="Cut each vector to its first N values and L2-normalise again."
    )
    priority: StrictInt | None = Field(
        None, description="Accepted for compatibility; every request is handled alike."
    )


class ImageMeta(BaseModel):
    width: int
    height: int
    format: str
    bit_depth: int


class EmbedMeta(BaseModel):
    api_version: dict[str, Any]
    billed_units: dict[str, int]


class EmbedByTypeResponse(BaseModel):
    id: str
    response_type: Literal["embeddings_by_type"] = "embeddings_by_type"
    embeddings: dict[str, list[Any]] = Field(description="One list per requested type.")
    texts: list[str] | None = None
    images: list[ImageMeta] | None = None
    meta: EmbedMeta


class EmbedFloatsResponse(BaseModel):
    id: str
    response_type: Literal["embeddings_floats"] = "embeddings_floats"
    embeddings: list[list[float]]
    texts: list[str]
    images: list[ImageMeta] | None = None
    meta: EmbedMeta


# ---------------------------------------------------------------- rerank

RerankDocument = StrictStr | dict[str, Any]


class RerankRequest(BaseModel):
    """Cohere v1's rerank request, which Jina's also fits. `null` means "not given"."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr
    keep_alive: KeepAlive = None
    query: StrictStr
    documents: list[RerankDocument] = Field(
        description="Strings, {'text': ...} objects, or objects ranked on `rank_fields`."
    )
    top_n: StrictInt | None = Field(None, description="Return the best N (default: all).")
    top_k: Any = Field(
        None,
        description="Voyage AI's name for top_n, which the voyageai SDK sends: refused with a "
        "400 (Cohere's body) naming the Voyage base URL (/voyage/v1), whose answer that SDK "
        "reads.",
    )
    return_documents: bool | None = Field(
        None, description="Include each document in its result (default false)."
    )
    rank_fields: list[StrictStr] | None = Field(
        None, description="Fields of object documents to rank on, in order (default: text)."
    )
    max_chunks_per_doc: StrictInt | None = Field(
        None,
        description="Accepted for compatibility; documents longer than the model's maximum "
        "are truncated, not chunked.",
    )
    max_tokens_per_doc: StrictInt | None = Field(
        None, description="Truncate each document to this many tokens first."
    )
    score_mode: StrictStr | None = Field(
        None,
        description="Extension, BGE-M3 models: 'hybrid' (default), 'dense', 'sparse' or "
        "'colbert' (FlagEmbedding's compute_score).",
    )

    @field_validator("documents")
    @classmethod
    def _echoable(cls, documents: list[Any]) -> list[Any]:
        for i, doc in enumerate(documents):
            if isinstance(doc, dict):  # sent back as given with return_documents
                check_echoable(doc, f"[{i}]")
        return documents


class RerankRequestV2(RerankRequest):
    """Cohere v2's rerank request."""


class RerankDocumentText(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    relevance_score: float = Field(description="In [0, 1]; higher is more relevant.")
    document: RerankDocumentText | dict[str, Any] | None = Field(
        None, description="Only when return_documents is true; absent otherwise."
    )


class ApiVersion(BaseModel):
    version: str


class BilledUnits(BaseModel):
    search_units: int


class TokensMeta(BaseModel):
    input_tokens: int
    output_tokens: int


class RerankMeta(BaseModel):
    api_version: ApiVersion
    billed_units: BilledUnits
    tokens: TokensMeta


class RerankResponse(BaseModel):
    id: str
    results: list[RerankResult]
    meta: RerankMeta
    model: str
    usage: Usage
