"""Vectors -> response bytes: float lists or base64 (little-endian float32), and `dimensions`.

Everything here is vectorised: no per-float Python work. Float vectors go to orjson as float32
numpy arrays (shortest round-trip repr, serialised in C); base64 is one `tobytes` per matrix.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import orjson
from starlette.responses import Response

from openai_compat.ground.errors import ModelOutputError

EncodingFormat = Literal["float", "base64"]

_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def as_matrix(vectors: Sequence[Any]) -> np.ndarray:
    """One C-contiguous little-endian float32 matrix from the engine's list of 1-D arrays."""
    return finite(np.ascontiguousarray(np.stack(vectors), dtype="<f4"))


def finite(matrix: np.ndarray) -> np.ndarray:
    """Vectors leave the server only as real numbers: orjson would write NaN as null."""
    if not np.isfinite(matrix).all():
        raise ModelOutputError(
            "The model produced non-finite numbers (NaN or infinity) for this request; its "
            "weights or dtype may be broken."
        )
    return matrix


def truncate_dimensions(
    matrix: np.ndarray, dimensions: int | None, *, renormalize: bool = True
) -> np.ndarray:
    """Keep the first `dimensions` values of each row and L2-normalise them again (OpenAI's
    shortened vectors are unit length; infinity-emb's matryoshka cut is not renormalised)."""
    if dimensions is None or dimensions >= matrix.shape[-1]:
        return matrix
    cut = matrix[..., :dimensions]
    if not renormalize:
        return np.ascontiguousarray(cut, dtype="<f4")
    norms = np.linalg.norm(cut, axis=-1, keepdims=True)
    np.maximum(norms, np.finfo(np.float32).tiny, out=norms)
    return np.ascontiguousarray(cut / norms, dtype="<f4")


def encode_rows(matrix: np.ndarray, fmt: EncodingFormat) -> list[Any]:
    """Each row as orjson-ready float32 array, or as base64 of its little-endian float32 bytes."""
    if fmt == "float":
        return list(matrix)
    raw = matrix.tobytes()
    step = matrix.shape[-1] * 4
    b64 = base64.b64encode
    return [b64(raw[i : i + step]).decode("ascii") for i in range(0, len(raw), step)]


def encode_multivector(item: np.ndarray, fmt: EncodingFormat) -> Any:
    """A (vectors x dimensions) item: a list of float rows, or all rows' bytes in one base64."""
    item = finite(np.ascontiguousarray(item, dtype="<f4"))
    if fmt == "float":
        return list(item)
    return base64.b64encode(item.tobytes()).decode("ascii")


def embedding_payload(
    vectors: Sequence[Any],
    *,
    fmt: EncodingFormat,
    dimensions: int | None,
    model: str,
    prompt_tokens: int,
    renormalize: bool = True,
) -> bytes:
    """The OpenAI embeddings response body, as bytes (`renormalize`: see truncate_dimensions),
    with the `id` Mistral's SDK requires (OpenAI's clients ignore it; infinity sends one)."""
    first = np.asarray(vectors[0]) if len(vectors) else np.zeros(0)
    if first.ndim == 2 or any(np.ndim(v) != first.ndim for v in vectors):
        data = []
        for i, v in enumerate(vectors):
            item = truncate_dimensions(
                np.atleast_2d(np.asarray(v, dtype="<f4")), dimensions, renormalize=renormalize
            )
            data.append(
                {
                    "object": "embedding",
                    "index": i,
                    "embedding": encode_multivector(item, fmt),
                    "shape": list(item.shape),
                }
            )
    else:
        matrix = truncate_dimensions(as_matrix(vectors), dimensions, renormalize=renormalize)
        rows = encode_rows(matrix, fmt)
        data = [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)]
    body = {
        "id": response_id(),
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
    return orjson.dumps(body, option=_NUMPY)


def response_id() -> str:
    """An embeddings answer's id, as Mistral writes one ("embd-" and 32 hex digits)."""
    return f"embd-{uuid.uuid4().hex}"


def decode_base64_embedding(value: str) -> np.ndarray:
    """Inverse of the base64 encoding (what the openai SDK does); used by tests and tools."""
    return np.frombuffer(base64.b64decode(value), dtype="<f4")


def orjson_response(body: Any, status: int = 200) -> Response:
    """A JSON response serialised by orjson (numpy arrays included)."""
    return Response(
        orjson.dumps(body, option=_NUMPY), status_code=status, media_type="application/json"
    )
