"""Late chunking: one forward pass over a whole document, then each span's token vectors
mean-pooled (Günther et al., "Late Chunking", 2024). Only meaningful for mean-pooling models:
their sentence vector is the mean of the same token vectors, so a span's mean lives in the same
space. Reads the SentenceTransformer through its public API (preprocess or tokenize, forward,
its Pooling module); runs beside the engine's batcher on one bounded thread per model. The
engines hand their model here (contract.Engine.late_runner, pooling_mode).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

import numpy as np


def pooling_mode(model: Any) -> str | None:
    """A SentenceTransformer's pooling ("mean", "cls", "lasttoken"...), None if it has no
    Pooling module."""
    from sentence_transformers.models import Pooling

    for module in model:
        if isinstance(module, Pooling):
            mode = getattr(module, "pooling_mode", None)  # sentence-transformers >= 6
            if mode is None:  # 3.x (infinity-emb's pin) names it through a method
                return str(module.get_pooling_mode_str())
            return "+".join(mode) if isinstance(mode, list | tuple) else str(mode)
    return None


def _forward(model: Any, text: str) -> tuple[np.ndarray, np.ndarray]:
    import torch
    from sentence_transformers.util import batch_to_device

    # sentence-transformers 6 prepares inputs with `preprocess` (`tokenize` before it)
    prepare = getattr(model, "preprocess", None) or model.tokenize
    with torch.inference_mode():
        features = batch_to_device(prepare([text]), model.device)
        out = model.forward(features)
    tokens = out["token_embeddings"][0].float().cpu().numpy()
    sentence = out["sentence_embedding"][0].float().cpu().numpy()
    return tokens, sentence


class LateRunner:
    """One model's late-chunking forwards, on one thread of its own beside the batcher;
    `close()` (when the model unloads) ends the thread."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="late-chunking")

    async def token_vectors(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each text's token vectors (special tokens included) and its sentence vector."""
        loop = asyncio.get_running_loop()
        return [await loop.run_in_executor(self._pool, _forward, self.model, t) for t in texts]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
