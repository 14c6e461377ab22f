"""`output_types` on /v1/embeddings (SIE's name): which of a model's outputs a request wants.

A model has one output (a dense vector, a SPLADE model's sparse one, a ColBERT model's token
vectors) or, BGE-M3, three from the same forward pass. A request naming the model's one output
is an ordinary request; on BGE-M3:
- one type: `embedding` in that type's usual form (sparse: `{"indices", "values"}` with
  `top_k`, `min_weight`, `return_tokens`; multivector: the vectors with `shape`);
- several: each item carries `embedding` (dense, when asked), `sparse_embedding` and
  `multivector` (with `multivector_shape`), only those asked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from starlette.responses import Response

from openai_compat.engine.bge_m3 import OUTPUTS, parse_outputs
from openai_compat.formats.encoding import (
    as_matrix,
    encode_multivector,
    encode_rows,
    finite,
    orjson_response,
    response_id,
    truncate_dimensions,
)
from openai_compat.formats.sparse import SparseVector, embedding_object
from openai_compat.ground.errors import BadRequest
from openai_compat.models.registry import ModelEntry

# a single type's names for its part: its usual wire form
_SINGLE = {
    "sparse_embedding": "embedding",
    "multivector": "embedding",
    "multivector_shape": "shape",
}


def asked_outputs(entry: ModelEntry, given: Sequence[str] | None) -> frozenset[str] | None:
    """What the request asks of the model's forward: None for its usual answer (no
    `output_types`, or the model's one output alone), else the types (BGE-M3); 400 for a
    list that is not one or more of OUTPUTS."""
    if given is None:
        return None
    try:
        asked = parse_outputs(given)
    except ValueError as exc:
        raise BadRequest(str(exc), param="output_types", code="invalid_value") from exc
    own = "sparse" if entry.sparse else "multivector" if entry.multivector else "dense"
    if not entry.outputs and asked != {own}:
        raise BadRequest(
            f"Model {entry.name!r} gives {own} vectors only; 'output_types' may name only "
            f"{own!r} (BGE-M3 models give {', '.join(OUTPUTS)}).",
            param="output_types",
            code="unsupported_parameter",
        )
    return None if asked == {"dense"} or not entry.outputs else asked


def answer(
    vectors: Sequence[Any],
    asked: frozenset[str],
    *,
    fmt: str,
    dimensions: int | None,
    top_k: int | None,
    min_weight: float | None,
    token_of: Callable[[int], str] | None,
    model: str,
    tokens: int,
) -> Response:
    """The /v1/embeddings answer from BGE-M3's outputs (bge_m3.M3Output per input)."""
    dense = None
    if "dense" in asked:
        matrix = truncate_dimensions(as_matrix([v.dense for v in vectors]), dimensions)
        dense = encode_rows(finite(matrix), fmt)  # type: ignore[arg-type]
    data = []
    for i, v in enumerate(vectors):
        parts: dict[str, Any] = {}  # the several-output names; one type takes `embedding`
        if dense is not None:
            parts["embedding"] = dense[i]
        if v.sparse is not None:
            parts["sparse_embedding"] = _sparse(v.sparse, i, fmt, top_k, min_weight, token_of)
        if v.multivector is not None:
            parts["multivector"], parts["multivector_shape"] = _many(v.multivector, fmt)
        if len(asked) == 1:  # that type's usual form: `embedding` (and `shape`)
            parts = {_SINGLE.get(k, k): value for k, value in parts.items()}
        data.append({"object": "embedding", "index": i, **parts})
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    answer = {"id": response_id(), "object": "list", "data": data, "model": model}
    return orjson_response({**answer, "usage": usage})


def _sparse(
    vector: SparseVector,
    index: int,
    fmt: str,
    top_k: int | None,
    min_weight: float | None,
    token_of: Callable[[int], str] | None,
) -> dict[str, Any]:
    chosen = vector.select(top_k, min_weight)
    body: dict[str, Any] = embedding_object(chosen, index, fmt=fmt, token_of=token_of)["embedding"]
    return body


def _many(matrix: np.ndarray, fmt: str) -> tuple[Any, list[int]]:
    vectors = np.ascontiguousarray(matrix, dtype="<f4")
    return encode_multivector(vectors, fmt), list(vectors.shape)  # type: ignore[arg-type]
