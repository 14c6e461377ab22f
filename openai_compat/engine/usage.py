"""What the engine reports with its vectors: token counts and pre-normalisation norms
(engine/adapter.py's count_tokens_in_engine attaches them), and the usage infinity-emb
reports where it does not tokenise."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class TokenCountedArray(np.ndarray):
    """An embedding that carries how many tokens the model saw for it (specials included,
    after truncation): read from the attention mask of the engine's own tokenisation; and,
    where the engine's L2 normalisation was moved here, the norm the model's output had."""

    tokens: int = 0
    norm: float | None = None


def raw_vectors(vectors: Sequence[Any]) -> list[np.ndarray] | None:
    """The model's own output before the engine's L2 normalisation; None where the norms were
    not kept (count_tokens_in_engine not installed, or the engine normalises elsewhere)."""
    raw = []
    for v in vectors:
        if not isinstance(v, TokenCountedArray) or v.norm is None:
            return None
        raw.append(np.asarray(v) * np.float32(v.norm))
    return raw


def length_estimate(texts: Sequence[str]) -> int:
    """The usage infinity-emb reports where it does not tokenise (lengths_via_tokenize off):
    the inputs' character lengths."""
    return sum(len(t) for t in texts)


def engine_token_count(vectors: Sequence[Any]) -> int | None:
    """Tokens the engine counted for these embeddings; None if it did not count them."""
    total = 0
    for v in vectors:
        tokens = getattr(v, "tokens", None)  # TokenCountedArray, SparseVector
        if tokens is None:
            return None
        total += tokens
    return total
