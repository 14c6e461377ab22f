"""The original tutorial's wire types (its /embed, /embed_image, /rerank and /classify).

Models are picked by position in the configured list; defaults follow the tutorial's order
(0 CLIP, 1 text embeddings, 2 reranker, 3 classifier).
"""

from __future__ import annotations

from pydantic import BaseModel, Field, StrictInt, StrictStr

from openai_compat.protocol import LabelScore


class TutorialEmbedRequest(BaseModel):
    sentences: list[StrictStr]
    model_index: StrictInt = 1
    input_type: StrictStr | None = Field(None, description="The prompt to embed with.")
    prompt_name: StrictStr | None = None


class TutorialImageEmbedRequest(BaseModel):
    image_urls: list[StrictStr] = Field(description="http(s) URLs or data: URIs.")
    model_index: StrictInt = 0


class TutorialRerankRequest(BaseModel):
    query: StrictStr
    docs: list[StrictStr]
    model_index: StrictInt = 2


class TutorialClassifyRequest(BaseModel):
    sentences: list[StrictStr]
    model_index: StrictInt = 3


class TutorialEmbedResponse(BaseModel):
    embeddings: list[list[float]]
    usage: int
    model: str


class TutorialRanking(BaseModel):
    index: int
    relevance_score: float
    document: str


class TutorialRerankResponse(BaseModel):
    rankings: list[TutorialRanking]
    usage: int
    model: str


class TutorialClassifyResponse(BaseModel):
    classifications: list[list[LabelScore]]
    usage: int
    model: str
