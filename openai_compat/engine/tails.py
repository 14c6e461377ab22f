"""What the native engine makes of a cross-encoder's raw scores: a reranker's activation (as
CrossEncoder.predict applies it) and a classifier's labelled probabilities."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class RerankScore:
    """One document's score (the fields inference/scoring.py reads of any engine's rerank)."""

    index: int
    relevance_score: float
    document: str


def activation(model: Any, logits: np.ndarray) -> np.ndarray:
    """The model's own activation_fn of its logits (sigmoid for one label), where it has one."""
    import torch

    fn = getattr(model, "activation_fn", None)
    if fn is None:
        return logits
    # in float64: a confident pair's sigmoid stays invertible (TEI's raw_scores takes
    # the logit back; float32 rounds sigmoid(16) to 1 - 1e-7 and loses it)
    with torch.inference_mode():
        return fn(torch.from_numpy(np.asarray(logits, dtype=np.float64))).numpy()


def labelled(row: np.ndarray, labels: dict[int, str], *, softmax: bool) -> list[dict[str, Any]]:
    """Every label's score: its probability (softmax of the logits) or its logit."""
    values = row.astype(np.float64)
    if softmax:
        values = np.exp(values - values.max())
        values = values / values.sum()
    return [{"label": labels.get(i, f"LABEL_{i}"), "score": float(v)} for i, v in enumerate(values)]
