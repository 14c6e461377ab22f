"""The original tutorial's wire types (its /embed, /embed_image, /rerank and /classify).

Models are picked by position in the configured list. Without `model_index`, the tutorial's
position (0 CLIP, 1 text embeddings, 2 reranker, 3 classifier, as in configs/production.toml)
when the model there can do the work, else the server's default model for it.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, StrictInt, StrictStr

from openai_compat.api.protocol import LabelScore

_INDEX = (
    "Position in the configured model list (default: the tutorial's, else the server's "
    "default model)."
)


class TutorialEmbedRequest(BaseModel):
    sentences: list[StrictStr]
    model_index: StrictInt | None = Field(None, description=_INDEX)
    input_type: StrictStr | None = Field(None, description="The prompt to embed with.")
    prompt_name: StrictStr | None = None


class TutorialImageEmbedRequest(BaseModel):
    image_urls: list[StrictStr] = Field(description="http(s) URLs or data: URIs.")
    model_index: StrictInt | None = Field(None, description=_INDEX)


class TutorialRerankRequest(BaseModel):
    query: StrictStr
    docs: list[StrictStr]
    model_index: StrictInt | None = Field(None, description=_INDEX)


class TutorialClassifyRequest(BaseModel):
    sentences: list[StrictStr]
    model_index: StrictInt | None = Field(None, description=_INDEX)


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
