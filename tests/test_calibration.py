"""The int8 calibration cache (models/calibration.py): measured once, read back on later starts
while it still matches the model, measured again when it does not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from openai_compat.formats.compact import CALIBRATION_TEXTS
from openai_compat.frame.settings import ModelConfig
from openai_compat.models.calibration import calibrate, calibration_file


class Engine:
    """Embeds a text as a fixed pseudo-random unit vector scaled by `scale`."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale
        self.calls: list[int] = []

    async def embed(self, texts: list[str]) -> tuple[list[Any], int]:
        self.calls.append(len(texts))
        out = []
        for t in texts:
            v = np.random.default_rng(sum(map(ord, t))).normal(size=8).astype(np.float32)
            out.append(self.scale * v / np.linalg.norm(v))
        return out, 0


@pytest.fixture
def config(tmp_path: Path) -> ModelConfig:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights v1")
    return ModelConfig(model=str(folder), name="m")


async def test_measured_once_then_read_back(config: ModelConfig, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = Engine()
    measured = await calibrate(first, config, cache)
    assert first.calls == [len(CALIBRATION_TEXTS)] and not measured.from_cache
    assert calibration_file(config, cache).is_file()
    again = Engine()
    cached = await calibrate(again, config, cache)
    assert again.calls == [1]  # one text, to check the cache still fits the model
    assert cached.from_cache
    np.testing.assert_array_equal(cached.calibration, measured.calibration)
    assert cached.range(8) == measured.range(8) and cached.range(4) == measured.range(4)


async def test_a_cache_that_no_longer_fits_the_model_is_measured_again(
    config: ModelConfig, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    await calibrate(Engine(), config, cache)
    changed = Engine(scale=0.5)  # same key, different outputs (e.g. weights swapped in place)
    q = await calibrate(changed, config, cache)
    assert changed.calls == [1, len(CALIBRATION_TEXTS)] and not q.from_cache
    assert q.range(8) == pytest.approx(0.5 * (await calibrate(Engine(), config, None)).range(8))
    assert np.load(calibration_file(config, cache)).max() <= 0.5 + 1e-6  # rewritten


async def test_a_half_precision_model_reads_its_cache_back(
    config: ModelConfig, tmp_path: Path
) -> None:
    """bfloat16 moves the first text's vector ~0.6% between its batch and alone: still the
    cache (1e-4 measured it again at every start), while a changed model is not."""
    cache = tmp_path / "cache"

    class Half(Engine):
        def __init__(self, scale: float = 1.0, jitter: float = 0.0) -> None:
            super().__init__(scale)
            self.jitter = jitter

        def precision(self) -> dict[str, Any]:
            return {"dtype": "bfloat16", "device": "cpu"}

        async def embed(self, texts: list[str]) -> tuple[list[Any], int]:
            out, n = await super().embed(texts)
            return [v * (1 + self.jitter) for v in out] if len(texts) == 1 else out, n

    await calibrate(Half(), config, cache)
    moved = Half(jitter=0.006)
    assert (await calibrate(moved, config, cache)).from_cache and moved.calls == [1]
    changed = Half(scale=0.5)
    assert not (await calibrate(changed, config, cache)).from_cache

    class Full(Half):  # float32: to 1e-4 still
        def precision(self) -> dict[str, Any]:
            return {"dtype": "float32", "device": "cpu"}

    await calibrate(Full(), config, tmp_path / "fp32")
    assert (await calibrate(Full(), config, tmp_path / "fp32")).from_cache
    assert not (await calibrate(Full(jitter=0.006), config, tmp_path / "fp32")).from_cache


async def test_the_key_follows_the_model_files_and_options(
    config: ModelConfig, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    one = calibration_file(config, cache)
    assert one == calibration_file(config, cache)
    (Path(config.model) / "model.safetensors").write_bytes(b"weights v2, longer")
    two = calibration_file(config, cache)
    assert two != one
    assert calibration_file(config.model_copy(update={"dtype": "float16"}), cache) != two


async def test_a_read_only_or_missing_cache_still_calibrates(
    config: ModelConfig, tmp_path: Path
) -> None:
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    q = await calibrate(Engine(), config, blocked)  # cannot create blocked/calibration/
    assert q.calibration.shape == (len(CALIBRATION_TEXTS), 8) and not q.from_cache
    q = await calibrate(Engine(), config, None)
    assert q.calibration.shape == (len(CALIBRATION_TEXTS), 8)
