"""The model-free engine: `engine = "debugengine"` on the native engine (where infinity-emb, whose
own debugengine this mirrors, is not installed). For measuring the HTTP layer and our scheduler
alone, and for tests that need an engine but no model.

Each text becomes 13 floats, every one the text's length in characters, and costs (and counts
as usage) that many tokens: infinity-emb's DummyTransformer, so a client sees the same answers
on either engine. It runs through the same scheduler and forward thread as a real model (rows
queued, batched by the token budget, departed callers dropped); only the forward pass is free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from openai_compat.engine.rows import Row
from openai_compat.engine.text import TextKind
from openai_compat.engine.usage import TokenCountedArray

DIMENSIONS = 13


class NoModel:
    """What the server reads of a sentence-transformers model, for a model that is not there:
    no prompts, no token limit, no tokenizer, no torch module."""

    prompts: dict[str, str] = {}
    default_prompt_name: str | None = None
    max_seq_length: int | None = None
    transformers_model: Any = None
    tokenizer: Any = None


class DebugRunner:
    """The runner interface of text.TextRunner (prepare anywhere, run on the forward thread),
    without a model."""

    kind: TextKind = "embedder"
    modalities: frozenset[str] = frozenset({"text"})
    multivector = False
    m3 = None  # no BGE-M3 heads
    modes = False
    exported = None
    sparse_size: int | None = None
    image_tokens = 0
    image_side: int | None = None
    sampling_rate: int | None = None
    threads = 1

    def __init__(self) -> None:
        self.model = NoModel()
        self.tokenizer = None

    def prepare(
        self, inputs: Sequence[Any], task: str | None = None, prompt: str | None = None
    ) -> list[Row]:
        if task is not None:
            raise ValueError("this model has no query and document modes")
        return [Row({}, len(str(text)), tokens=False) for text in inputs]

    def on_thread(self) -> None:
        pass

    def run(self, rows: Sequence[Row]) -> list[Any]:
        return [
            TokenCountedArray.of(np.full(DIMENSIONS, float(r.length), np.float32), r.length)
            for r in rows
        ]
