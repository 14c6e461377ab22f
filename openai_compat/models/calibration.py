"""The int8 calibration of a dense model (formats/compact.py's ranges): its fixed texts'
embeddings, measured once and kept beside the exports, read back on later starts while they
still match the model."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from openai_compat.engine import backends
from openai_compat.formats.compact import CALIBRATION_TEXTS, Quantizer
from openai_compat.frame.settings import ModelConfig

logger = logging.getLogger("openai_compat")


def calibration_file(config: ModelConfig, cache_dir: Path) -> Path:
    """Where a model's calibration embeddings are kept between starts: keyed by everything
    that changes them (source, revision, engine, dtype, pooling, the calibration texts, and
    for a local folder its files' sizes and times, ctime included: it moves with every
    write, also when the mtime is set back)."""
    parts = [config.source, config.revision or "", config.engine, config.quantize or ""]
    parts += [config.dtype, config.pooling_method, config.device, "\n".join(CALIBRATION_TEXTS)]
    folder = Path(config.source)
    if folder.is_dir():
        for f in sorted(folder.iterdir()):
            if f.is_file():
                st = f.stat()
                parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}")
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    return cache_dir / "calibration" / f"{backends.slug(config.served_name)}-{key}.npy"


async def calibrate(engine: Any, config: ModelConfig, cache_dir: Path | None) -> Quantizer:
    """The int8 calibration: the fixed texts' embeddings, read from the cache when one
    exists and still matches the model (its first text is embedded again and compared),
    else embedded (two batches: half a second on one CPU core for MiniLM) and cached."""
    path = calibration_file(config, cache_dir) if cache_dir is not None else None
    if path is not None and path.is_file():
        try:
            cached = np.load(path, allow_pickle=False)
        except (OSError, ValueError):
            cached = None
        if cached is not None and cached.ndim == 2 and len(cached) == len(CALIBRATION_TEXTS):
            first, _ = await engine.embed([CALIBRATION_TEXTS[0]])
            fresh = np.asarray(first[0], dtype=np.float32)
            if _matches(fresh, cached[0], _lowered(engine)):
                return Quantizer(cached, config.quantization_range, from_cache=True)
            logger.info(
                "model %r: cached calibration is stale; measuring again", config.served_name
            )
    vectors, _ = await engine.embed(list(CALIBRATION_TEXTS))
    matrix = np.asarray(vectors, dtype=np.float32)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.stem}.tmp-{os.getpid()}.npy")
            np.save(tmp, matrix, allow_pickle=False)
            tmp.replace(path)
        except OSError as exc:  # a read-only cache is fine: measure on every start
            logger.info("model %r: calibration not cached (%s)", config.served_name, exc)
    return Quantizer(matrix, config.quantization_range)


def _lowered(engine: Any) -> bool:
    """Whether the model runs in a half precision (engine/precision.py's verdict)."""
    verdict = (engine.precision() if hasattr(engine, "precision") else None) or {}
    return verdict.get("dtype") in ("bfloat16", "float16")


def _matches(fresh: np.ndarray, cached: np.ndarray, lowered: bool) -> bool:
    """Whether the first text's vector is still the cached one: to 1e-4 in float32; in a half
    precision within 2% of its length (bf16 keeps ~3 digits, and the text alone is padded
    otherwise than in its calibration batch: MiniLM moved 0.6%, where 1e-4 called every
    cache stale and measured again at every start)."""
    if fresh.shape != cached.shape:
        return False
    if not lowered:
        return bool(np.allclose(fresh, cached, atol=1e-4))
    return bool(np.linalg.norm(fresh - cached) <= 0.02 * np.linalg.norm(cached))
