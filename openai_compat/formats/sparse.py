"""Sparse (SPLADE) vectors: one weight per vocabulary entry, most of them zero.

A masked-LM model's weight for vocabulary entry j is max over the input's tokens of
log(1 + relu(logit_j)), padding masked (SPLADE's max pooling). engine/infinity/splade.py computes it
inside infinity-emb's own batching; this module holds the vectors and what the API does with
them: keep the top-k / the weights above a floor, dot products for
rerank, and the wire format (Qdrant's and Milvus's `{"indices", "values"}`, indices
ascending; base64: indices as little-endian uint32 bytes, values as little-endian float32).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from openai_compat.ground.errors import BadRequest, ModelOutputError


@dataclass(frozen=True, slots=True)
class SparseVector:
    """The non-zero weights of one input: `indices` ascending (uint32), `values` float32;
    `tokens`: how many tokens the model saw for it (specials included, after truncation)."""

    indices: np.ndarray
    values: np.ndarray
    tokens: int = 0

    @property
    def nbytes(self) -> int:  # what the exact cache counts it as
        return int(self.indices.nbytes + self.values.nbytes)

    @classmethod
    def from_dense(cls, row: np.ndarray, tokens: int = 0) -> SparseVector:
        indices = np.flatnonzero(row).astype("<u4")
        return cls(indices, np.ascontiguousarray(row[indices], dtype="<f4"), tokens)

    def select(self, top_k: int | None, min_weight: float | None) -> SparseVector:
        """Only the weights >= min_weight, then only the top_k largest (ties: lower index
        first); indices stay ascending."""
        keep = np.ones(self.indices.size, dtype=bool)
        if min_weight is not None:
            keep &= self.values >= min_weight
        indices, values = self.indices[keep], self.values[keep]
        if top_k is not None and values.size > top_k:
            order = np.lexsort((indices, -values))[:top_k]
            order.sort()  # positions in ascending index order
            indices, values = indices[order], values[order]
        return SparseVector(indices, values, self.tokens)

    def dot(self, other: SparseVector) -> float:
        _, mine, theirs = np.intersect1d(
            self.indices, other.indices, assume_unique=True, return_indices=True
        )
        return float(np.dot(self.values[mine].astype(np.float64), other.values[theirs]))


def check_options(top_k: int | None, min_weight: float | None) -> None:
    if top_k is not None and top_k < 1:
        raise BadRequest(f"'top_k' must be at least 1, got {top_k}.", param="top_k")
    if min_weight is not None and not (np.isfinite(min_weight) and min_weight >= 0):
        raise BadRequest(
            f"'min_weight' must be a finite number >= 0, got {min_weight}.", param="min_weight"
        )


def check_finite(vectors: Sequence[SparseVector]) -> None:
    if not all(np.isfinite(v.values).all() for v in vectors):
        raise ModelOutputError(
            "The model produced non-finite numbers (NaN or infinity) for this request; its "
            "weights or dtype may be broken."
        )


def embedding_object(
    vector: SparseVector,
    index: int,
    *,
    fmt: str,
    token_of: Callable[[int], str] | None = None,
) -> dict[str, Any]:
    """One item of /v1/embeddings' `data` for a sparse model."""
    body: dict[str, Any]
    if fmt == "base64":
        body = {
            "indices": base64.b64encode(vector.indices.astype("<u4").tobytes()).decode(),
            "values": base64.b64encode(vector.values.astype("<f4").tobytes()).decode(),
        }
    else:
        body = {"indices": vector.indices, "values": vector.values}
    if token_of is not None:
        body["tokens"] = [token_of(int(i)) for i in vector.indices]
    return {"object": "embedding", "index": index, "embedding": body}


def decode_base64(body: dict[str, str]) -> SparseVector:
    """The inverse of embedding_object's base64 form (for clients and tests)."""
    indices = np.frombuffer(base64.b64decode(body["indices"]), dtype="<u4")
    values = np.frombuffer(base64.b64decode(body["values"]), dtype="<f4")
    return SparseVector(indices, values)
