"""Wire types: requests, responses and errors. Imports no engine.

Responses are documented here for the OpenAPI schema; the hot paths serialise plain dicts and
numpy arrays with orjson instead of validating large float arrays through pydantic.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
)

from openai_compat.frame.model_config import KeepAlive

# Integers a JSON answer can carry exactly (orjson writes 64-bit integers, signed or not).
_INT_RANGE = (-(2**63), 2**64 - 1)


def check_echoable(value: Any, where: str = "", depth: int = 0) -> None:
    """A client's JSON value that we send back as given (a document object, say) must be one
    we can write back unchanged: integers within 64 bits, finite floats. ValueError names the
    first that is not (a 400), instead of a 500 or a silent null in the answer."""
    if depth > 64:
        raise ValueError(f"{where or 'value'} is nested more than 64 levels deep")
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, int):
        if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            raise ValueError(f"{where or 'value'}: integer {value} does not fit in 64 bits")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where or 'value'}: {value} is not a finite number")
    elif isinstance(value, dict):
        for key, item in value.items():
            check_echoable(item, f"{where}.{key}" if where else str(key), depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_echoable(item, f"{where}[{i}]", depth + 1)


# ---------------------------------------------------------------- errors


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


ERROR_STATUSES: dict[int, str] = {
    400: "Invalid request",
    401: "Missing or wrong API key",
    404: "Unknown model",
    413: "Request body too large",
    429: "Too much queued work; retry after the Retry-After header",
    503: "Not ready or shutting down",
}


def error_responses(
    model: type[BaseModel], statuses: dict[int, str] = ERROR_STATUSES
) -> dict[int | str, dict[str, object]]:
    """OpenAPI `responses` for an API family's error body."""
    return {status: {"model": model, "description": text} for status, text in statuses.items()}


ERROR_RESPONSES = error_responses(ErrorResponse)

# ---------------------------------------------------------------- models


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    root: str = Field(description="The served name this id resolves to (itself for a name).")
    capabilities: list[str] | None = Field(
        None, description="embed, rerank, classify, image, audio (once the model has loaded)."
    )
    modalities: list[str] | None = Field(
        None,
        description="Extension: what its inputs may be: text, image, audio (once the model has "
        "loaded).",
    )
    state: Literal["unloaded", "loading", "loaded", "unloading", "failed"] | None = Field(
        None, description="Extension: whether the model is in memory now (lazy models load on use)."
    )
    load: Literal["eager", "lazy"] | None = Field(None, description="Extension: its load setting.")
    dimensions: int | None = Field(None, description="Embedding size, for models that embed.")
    multivector: bool | None = Field(
        None,
        description="Extension: true for a model that gives a vector per token (ColBERT, "
        "ColPali): its embeddings carry a `shape`; absent otherwise.",
    )
    max_input_tokens: int | None = None
    prompts: dict[str, str] | None = Field(
        None, description="Named prompts (prefixes) a request can choose; absent if none."
    )
    default_prompt: str | None = Field(None, description="The prompt used when none is named.")
    matryoshka_dimensions: list[int] | None = Field(
        None,
        description="The sizes `dimensions` may take (configured); absent: any up to `dimensions`.",
    )
    outputs: list[str] | None = Field(
        None,
        description="What `output_types` may ask of a model with several outputs (BGE-M3: "
        "dense, sparse, multivector); absent: the model's one kind of vector.",
    )
    score_modes: list[str] | None = Field(
        None,
        description="What rerank's `score_mode` may be (BGE-M3: dense, sparse, colbert, hybrid).",
    )
    modes: list[str] | None = Field(
        None,
        description="A multi-vector model that embeds queries and documents apart: the sides "
        "(`input_type` query-like values pick 'query', anything else 'document'); absent "
        "otherwise.",
    )
    quantization_range: float | None = Field(
        None,
        description="The |value| that int8 embeddings map to 127 (x ~ int8 * range / 127).",
    )
    dtype: str | None = Field(
        None, description="Extension: the precision its weights run in (float32, bfloat16...)."
    )
    device: str | None = Field(None, description="Extension: cpu, cuda or mps.")
    precision: dict[str, Any] | None = Field(
        None,
        description="Extension: why that dtype (the device's policy, a configured dtype) and "
        "the quality check's figures against float32 where it ran (min_cosine, agreement).",
    )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# ---------------------------------------------------------------- embeddings

TokenIds = list[StrictInt]
# Tried left to right, token ids before strings: a long id array tried as strings first would
# collect one error per id (seconds for a few hundred thousand ids).


class ContentItem(BaseModel):
    """Jina's input item (jina-embeddings-v4, jina-clip): a text, an image (an http(s) URL, a
    data: URI or bare base64), or both (one vector for the pair, on a model that renders
    messages)."""

    model_config = ConfigDict(extra="forbid")

    text: StrictStr | None = None
    image: StrictStr | None = None


EmbeddingInput = Annotated[
    StrictStr
    | TokenIds
    | list[StrictStr]
    | list[TokenIds]
    | list[Annotated[StrictStr | ContentItem, Field(union_mode="left_to_right")]],
    Field(union_mode="left_to_right"),
]


# infinity-emb's model name when a request names none (its routes, and our bare /embeddings).
UNNAMED = "default/not-specified"


class EmbeddingRequest(BaseModel):
    """OpenAI's embeddings request, plus `modality` for image and audio models."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr
    keep_alive: KeepAlive = None
    input: EmbeddingInput = Field(
        description="A string, an array of strings, an array of token ids, or an array of "
        "arrays of token ids (OpenAI cl100k_base ids unless the model says otherwise)."
    )
    encoding_format: Literal["float", "base64"] | None = Field(
        None, description="'float' (default) or 'base64' (little-endian float32 bytes)."
    )
    dimensions: StrictInt | None = Field(
        None, description="Cut each vector to its first N values and L2-normalise again."
    )
    user: StrictStr | None = None
    output_dimension: StrictInt | None = Field(
        None, description="Mistral's name for `dimensions` (send one of the two)."
    )
    output_dtype: Literal["float", "int8", "uint8", "binary", "ubinary"] | None = Field(
        None,
        description="Mistral's compact types: int8/uint8 scaled with the model's range, "
        "binary/ubinary packed sign bits (base64: the bytes of that type).",
    )
    modality: Literal["text", "image", "audio"] | None = Field(
        None,
        description="Extension: 'image' or 'audio' reads each input as an http(s) URL or a "
        "data: URI (send through the openai SDK's extra_body).",
    )
    input_type: StrictStr | None = Field(
        None,
        description="Extension: the prompt to embed with: a prompt name of the model, or "
        "search_query / search_document / classification / clustering (Cohere's names).",
    )
    prompt_name: StrictStr | None = Field(None, description="Extension: TEI's name for it.")
    long_input: Literal["error", "truncate", "mean", "chunks", "late"] | None = Field(
        None,
        description="Extension: what a text longer than the model's window gets: 'error' "
        "(400), 'truncate', 'mean' (its windows' vectors averaged by tokens) or 'chunks' (one "
        "vector per window with character offsets, in data[i].chunks, beside the mean); "
        "'late': late chunking of a document that fits the window (chunk_spans/chunk_tokens).",
    )
    chunk_spans: list[list[tuple[StrictInt, StrictInt]]] | None = Field(
        None, description="Extension (long_input 'late'): [start, end) character spans per input."
    )
    chunk_tokens: StrictInt | None = Field(
        None, ge=1, description="Extension (long_input 'late'): chunks of this many tokens."
    )
    task: StrictStr | None = Field(
        None, description="Extension: Jina's name for it (retrieval.query, retrieval.passage...)."
    )
    top_k: StrictInt | None = Field(
        None, description="Sparse models: keep only the k largest weights of each vector."
    )
    min_weight: StrictFloat | StrictInt | None = Field(
        None, description="Sparse models: keep only weights >= this."
    )
    output_types: list[StrictStr] | None = Field(
        None,
        description="Extension (SIE's name): which of a model's outputs to answer: 'dense', "
        "'sparse', 'multivector'; BGE-M3 gives any of them from one pass (several: each item "
        "carries `embedding`, `sparse_embedding` and `multivector`, those asked).",
    )
    return_tokens: StrictBool | None = Field(
        None, description="Sparse models: also return each index's vocabulary entry (`tokens`)."
    )

    @field_validator("min_weight")
    @classmethod
    def _finite_weight(cls, value: float | None) -> float | None:
        if value is None:
            return None
        try:
            weight = float(value)
        except OverflowError:  # an int beyond any float (10**400)
            raise ValueError("must be a finite number") from None
        if not math.isfinite(weight):
            raise ValueError("must be a finite number")
        return weight


class SparseEmbedding(BaseModel):
    indices: list[int] | str = Field(
        description="Vocabulary ids, ascending; base64: little-endian uint32 bytes."
    )
    values: list[float] | str = Field(
        description="Their weights; base64: little-endian float32 bytes."
    )
    tokens: list[str] | None = Field(None, description="With return_tokens: the entries.")


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str | list[list[float]] | SparseEmbedding = Field(
        description="float: a list of floats (a list of vectors for multi-vector models); "
        "base64: little-endian float32 bytes, rows concatenated for multi-vector models; "
        "sparse models: {indices, values} (Qdrant's and Milvus's sparse vector)."
    )
    shape: list[int] | None = Field(
        None, description="Only for multi-vector models: [vectors, dimensions]."
    )


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: Usage


# ---------------------------------------------------------------- health


class HealthResponse(BaseModel):
    unix: float = Field(
        description="The server's clock, seconds since the epoch (infinity-emb's body)."
    )


class BatchRunnerStatus(BaseModel):
    state: Literal["idle", "running", "restarting", "waiting_for_data_dir"]
    restarts: int
    pending_other_models: int = Field(
        description="Open batches left pending: their lines need models this server does not "
        "serve (each says which in its pending_reason)."
    )
    error: str | None = None


class ReadyResponse(BaseModel):
    status: Literal["ready"] = "ready"
    models: list[str]
    batch_runner: BatchRunnerStatus = Field(
        description="Whether Batch API jobs are being run; 'restarting' after a crash (with "
        "the error), 'waiting_for_data_dir' while another process holds the data dir. Live "
        "traffic does not depend on it, so /ready stays 200."
    )
    cpus: dict[str, Any] | None = Field(
        None,
        description="The CPUs this process may use (affinity, cgroup quota) and the thread "
        "pools sized to them.",
    )


# ---------------------------------------------------------------- classify


class ClassifyRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr
    input: StrictStr | list[StrictStr]
    raw_scores: bool | None = Field(
        None, description="Return the model's raw logits instead of probabilities."
    )
    keep_alive: KeepAlive = None


class LabelScore(BaseModel):
    label: str
    score: float


class Classification(BaseModel):
    object: Literal["classification"] = "classification"
    index: int
    label: str = Field(description="The best label.")
    score: float = Field(description="The best label's score.")
    labels: list[LabelScore] = Field(description="Every label, best first.")


class ClassifyResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Classification]
    model: str
    usage: Usage
