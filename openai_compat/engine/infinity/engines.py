"""infinity-emb's engines built, stopped and their refusals read: the only place outside the
rest of this package that imports infinity-emb's public API (models/loading.py and
inference/embed.py ask here), so an environment without it never imports it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from openai_compat.errors import BadRequest
from openai_compat.settings import ModelConfig


def engine_args(config: ModelConfig) -> Any:
    """infinity-emb's EngineArgs for a model's configuration."""
    from infinity_emb import EngineArgs

    options: dict[str, Any] = dict(
        model_name_or_path=config.source,
        served_model_name=config.served_name,
        engine=config.engine,
        device=config.device,
        batch_size=config.batch_size,
        revision=config.revision,
        trust_remote_code=config.trust_remote_code,
        dtype=config.dtype,
        pooling_method=config.pooling_method,
        # Our own, cheaper warm-up runs instead (models/loading.warm_up).
        model_warmup=False,
        compile=config.compile,
        bettertransformer=config.bettertransformer,
        # Priorities by character length: our own counter does the real token counting.
        lengths_via_tokenize=False,
    )
    return EngineArgs(**options)


def create(config: ModelConfig) -> Any:
    """An AsyncEmbeddingEngine for the model (its weights loaded: blocking)."""
    from infinity_emb import AsyncEmbeddingEngine

    return AsyncEmbeddingEngine.from_args(engine_args(config))


async def stop(engines: Sequence[Any]) -> None:
    """Stop infinity-emb's engines (their batching threads) together."""
    from infinity_emb import AsyncEngineArray

    await AsyncEngineArray(engines=list(engines)).astop()


def refusal(exc: Exception) -> BadRequest | None:
    """The 400 for one of infinity-emb's bad-input exceptions; None for anything else (and
    wherever infinity-emb, an optional engine, is not installed)."""
    try:
        from infinity_emb.primitives import (
            AudioCorruption,
            ImageCorruption,
            MatryoshkaDimError,
            ModelNotDeployedError,
        )
    except ImportError:
        return None
    if isinstance(exc, ModelNotDeployedError):
        return BadRequest(str(exc), param="model", code="model_not_supported")
    if isinstance(exc, MatryoshkaDimError):
        return BadRequest(str(exc), param="dimensions")
    if isinstance(exc, ImageCorruption | AudioCorruption):
        return BadRequest(str(exc), param="input", code="invalid_media")
    return None
