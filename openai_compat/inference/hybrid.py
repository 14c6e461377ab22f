"""Rerank on a BGE-M3 model: each document scored from one pass over the query and the
documents, as FlagEmbedding's `compute_score` scores a pair: `dense` (dot product of the unit
vectors), `sparse` (the lexical weights' product over shared tokens), `colbert` (the mean over
the query's vectors of the best dot product with the document's) or `hybrid` (their weighted
mean, 0.4 / 0.2 / 0.4 unless the model's `hybrid_weights` say otherwise). Scores are on
FlagEmbedding's scale (no mapping to [0, 1]); the forward computes only what the mode needs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from openai_compat.engine import bge_m3
from openai_compat.formats.tokens import Names
from openai_compat.frame.settings import Settings
from openai_compat.ground.errors import BadRequest
from openai_compat.inference.embed import embed_texts
from openai_compat.models.registry import ModelEntry

_NEEDS = {
    "dense": frozenset({"dense"}),
    "sparse": frozenset({"sparse"}),
    "colbert": frozenset({"multivector"}),
    "hybrid": frozenset(bge_m3.OUTPUTS),
}


def check_score_mode(entry: ModelEntry, score_mode: str | None) -> str | None:
    """The request's score_mode, refused (400) where the model has no such choice."""
    if score_mode is None:
        return None
    if not entry.outputs:
        raise BadRequest(
            f"'score_mode' applies to models with several outputs (BGE-M3); {entry.name!r} "
            "scores one way.",
            param="score_mode",
            code="unsupported_parameter",
        )
    if score_mode not in _NEEDS:
        raise BadRequest(
            f"'score_mode' is one of {', '.join(bge_m3.SCORE_MODES)}; got {score_mode!r}.",
            param="score_mode",
            code="invalid_value",
        )
    return score_mode


async def hybrid_scores(
    entry: ModelEntry,
    query: str,
    docs: Sequence[str],
    settings: Settings,
    names: Names,
    score_mode: str | None,
) -> tuple[np.ndarray, int]:
    """Each document's score in `score_mode` (default hybrid), and the tokens of the pass."""
    mode = score_mode or "hybrid"
    result = await embed_texts(entry, [query, *docs], settings, names, outputs=_NEEDS[mode])
    q, *outputs = result.vectors
    weights = tuple(entry.config.hybrid_weights or bge_m3.HYBRID_WEIGHTS)
    if mode == "hybrid":
        scores = [bge_m3.hybrid_score(q, d, weights) for d in outputs]
    elif mode == "dense":
        scores = [bge_m3.dense_score(q.dense, d.dense) for d in outputs]
    elif mode == "sparse":
        scores = [bge_m3.sparse_score(q.sparse, d.sparse) for d in outputs]
    else:
        scores = [bge_m3.colbert_score(q.multivector, d.multivector) for d in outputs]
    return np.asarray(scores, dtype=np.float64), result.tokens
