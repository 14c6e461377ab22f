"""infinity-emb 0.0.78's request bodies where they differ from ours."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from openai_compat.protocol import UNNAMED, EmbeddingRequest


class InfinityRerankRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    query: StrictStr
    documents: list[StrictStr]
    return_documents: StrictBool = False
    raw_scores: StrictBool = False
    model: StrictStr = UNNAMED
    top_n: StrictInt | None = Field(None, gt=0)


class InfinityClassifyRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input: list[StrictStr] | StrictStr
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
    clients send "default/not-specified" or nothing): the default model answers."""

    model: StrictStr = UNNAMED
