"""What the engine reports with its vectors: token counts and pre-normalisation norms (the
native engine's own; infinity/hooks.py attaches them to infinity-emb's), and the usage
infinity-emb reports where it does not tokenise."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class TokenIds(str):
    """An input given as the model's own token ids (token_ids = "model"): the engine embeds
    exactly `ids` (its features built from them, no tokenizer); the string
    is their decoded text, for logs and length estimates."""

    ids: tuple[int, ...]

    def __new__(cls, text: str, ids: Sequence[int]) -> TokenIds:
        made = super().__new__(cls, text)
        made.ids = tuple(int(i) for i in ids)
        return made


class TokenCountedArray(np.ndarray):
    """An embedding that carries how many tokens the model saw for it (specials included,
    after truncation): read from the attention mask of the engine's own tokenisation; and,
    where the engine's L2 normalisation was moved here, the norm the model's output had."""

    tokens: int = 0
    norm: float | None = None

    @classmethod
    def of(cls, vector: Any, tokens: int, norm: float | None = None) -> TokenCountedArray:
        array = np.asarray(vector).view(cls)
        array.tokens, array.norm = int(tokens), norm
        return array


def unit_rows(matrix: Any) -> tuple[np.ndarray, np.ndarray]:
    """Rows L2-normalised (as sentence-transformers' normalize does) and their norms before."""
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.maximum(norms, 1e-12), norms[:, 0]


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


def features_from_ids(replica: Any, sentences: list[str]) -> dict[str, Any]:
    """The batch's features as sentence-transformers' tokenize makes them, with TokenIds
    rows taken as given (no special tokens added, no tokenizer) and text rows tokenized."""
    import torch

    tokenizer = replica.tokenizer  # sentence-transformers' own (public) attributes

    rows: list[list[int]] = [list(s.ids) if isinstance(s, TokenIds) else [] for s in sentences]
    texts = [i for i, s in enumerate(sentences) if not isinstance(s, TokenIds)]
    if texts:
        limit = replica.max_seq_length
        encoded = tokenizer([sentences[i] for i in texts], truncation=True, max_length=limit)
        for i, ids in zip(texts, encoded["input_ids"], strict=True):
            rows[i] = list(ids)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id or 0
    features = {
        "input_ids": torch.tensor([r + [pad] * (width - len(r)) for r in rows]),
        "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
    }
    if "token_type_ids" in tokenizer.model_input_names:
        features["token_type_ids"] = torch.zeros_like(features["input_ids"])
    return features
