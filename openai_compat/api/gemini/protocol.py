"""Gemini's wire types, as google-genai (1.x, 2.x) and REST users send them: camelCase fields
(its JSON), `models/` before every model name."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, model_validator

from openai_compat.api.protocol import error_responses

# Gemini's taskType values; each maps to the model's prompt for it (formats/prompts.py)
TaskType = Literal[
    "TASK_TYPE_UNSPECIFIED",
    "RETRIEVAL_QUERY",
    "RETRIEVAL_DOCUMENT",
    "SEMANTIC_SIMILARITY",
    "CLASSIFICATION",
    "CLUSTERING",
    "QUESTION_ANSWERING",
    "FACT_VERIFICATION",
    "CODE_RETRIEVAL_QUERY",
]


class GoogleErrorDetail(BaseModel):
    code: int
    message: str
    status: str = Field(description="The google.rpc.Code name: INVALID_ARGUMENT, NOT_FOUND...")


class GoogleError(BaseModel):
    error: GoogleErrorDetail


GOOGLE_ERROR_RESPONSES = error_responses(GoogleError)


class Part(BaseModel):
    # an image or file part is refused by name, never dropped: text parts only
    model_config = ConfigDict(extra="allow")

    text: StrictStr | None = None

    @model_validator(mode="after")
    def _text_only(self) -> Part:
        other = sorted(self.model_extra or ())
        if other:
            raise ValueError(f"only text parts are embedded here; this part has {other[0]}")
        if self.text is None:
            raise ValueError("a part needs its text")
        return self


class Content(BaseModel):
    model_config = ConfigDict(extra="forbid")

    parts: list[Part] = Field(min_length=1, description="Text parts, joined with one space.")
    role: StrictStr | None = None


class EmbedContentRequest(BaseModel):
    """One content (`:embedContent`; each of `:batchEmbedContents`' requests)."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr | None = Field(
        None, description="models/{name}; in a batch, the URL's model (the only one allowed)."
    )
    content: Content
    taskType: TaskType | None = Field(
        None, description="The model's prompt for the task (queries, documents...)."
    )
    title: StrictStr | None = Field(
        None, description="RETRIEVAL_DOCUMENT: the document's title, where the prompt has one."
    )
    outputDimensionality: StrictInt | None = Field(
        None, description="Keep the first N values (not renormalised, as Gemini does)."
    )


class BatchEmbedContentsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    requests: list[EmbedContentRequest] = Field(min_length=1)
