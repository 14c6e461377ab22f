"""engine/late.py's forward thread lives as long as its model: unloading the model ends it
(it used to be kept in a module dict for good, one thread per load)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from openai_compat.engine import late
from openai_compat.frame.settings import ModelConfig
from openai_compat.models.loading import unload_entry
from openai_compat.models.registry import ModelEntry


class _Engine:
    async def astop(self) -> None:
        return None


class _Registry:
    def remove(self, entry: ModelEntry) -> None:
        return None


def _late_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("late-chunking")]


async def test_unloading_a_model_ends_its_late_chunking_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def forward(replica: Any, text: str) -> tuple[np.ndarray, np.ndarray]:
        return np.ones((3, 4), np.float32), np.ones(4, np.float32)

    monkeypatch.setattr(late, "_forward", forward)
    before = set(_late_threads())
    for _ in range(3):  # three loads of a model that served late chunking
        runner = late.LateRunner(object())
        outputs = await runner.token_vectors(["a", "b"])
        assert len(outputs) == 2 and outputs[0][0].shape == (3, 4)
        entry = ModelEntry(
            config=ModelConfig(model="m", name="m"),
            engine=_Engine(),
            capabilities=frozenset(),
            late=runner,
        )
        await unload_entry(_Registry(), entry)  # type: ignore[arg-type]
        assert entry.late is None
    for thread in set(_late_threads()) - before:
        await asyncio.to_thread(thread.join, 5)  # ended by close(), not left for good
    assert set(_late_threads()) - before == set()
