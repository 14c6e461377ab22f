"""Engines built and stopped: the native one (native.py) or, where a model names one of
infinity-emb's engines and it is installed, InfinityEngine (engine/infinity/engine.py). The
only place that decides which engine runs a model; what it returns is contract.Engine."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from openai_compat.engine import infinity
from openai_compat.engine.contract import Engine
from openai_compat.frame.model_config import DEBUG_ENGINE, NATIVE, TORCH, ModelConfig
from openai_compat.ground import cpus


class NotInstalled(RuntimeError):
    """The model names an engine whose package is not installed here."""


def runs_natively(engine: str) -> bool:
    """Whether a model configured with this engine runs on the native engine: "native"; and
    "torch" / "debugengine" where infinity-emb is not installed. Any other name ("optimum",
    "ctranslate2"...) is one of infinity-emb's engines."""
    if engine == NATIVE:
        return True
    return engine in (TORCH, DEBUG_ENGINE) and not infinity.installed()


def engine_package(engines: Iterable[str]) -> str:
    """The package whose import (torch, transformers: seconds) to start early for models on
    these engines: infinity-emb if any model runs on it, else sentence-transformers."""
    native_only = all(runs_natively(e) for e in engines)
    return "sentence_transformers" if native_only else infinity.PACKAGE


def create(config: ModelConfig, export_dir: Path) -> Engine:
    """Build (load the weights of) one model's engine, set up as configured. Blocking: run
    it in a thread. ValueError (and the like) for options the model cannot take."""
    if runs_natively(config.engine):
        from openai_compat.engine import native  # numpy, asyncio: not before the early import

        engine = native.load(config, cpus.engine_threads(), export_dir)
        engine.apply_max_length(config.max_length)
        engine.apply_pooling(config.pooling_method)
        return engine
    if not infinity.installed():
        raise NotInstalled(
            f"engine = {config.engine!r} is one of infinity-emb's engines, which is not "
            "installed here: use engine = 'native' (the default), or install infinity-emb in "
            "an environment of its own (requirements/infinity.txt)"
        )
    from openai_compat.engine.infinity.engine import InfinityEngine

    return InfinityEngine.create(config)


async def stop(engines: Sequence[Engine]) -> None:
    """Stop engines: native ones each, infinity-emb's as one AsyncEngineArray."""
    from openai_compat.engine import native

    others = [e for e in engines if not isinstance(e, native.NativeEngine)]
    for engine in engines:
        if isinstance(engine, native.NativeEngine):
            await engine.astop()
    if others:
        from openai_compat.engine.infinity.engine import stop as stop_infinity

        await stop_infinity(others)  # type: ignore[arg-type]
