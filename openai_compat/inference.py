"""What the routes share: turning requests into engine calls, and engine errors into API errors.

The /v1 routes and the tutorial's routes both call these functions: one implementation each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from openai_compat.errors import BadRequest
from openai_compat.registry import ModelEntry
from openai_compat.settings import Settings


@contextmanager
def engine_errors() -> Iterator[None]:
    """infinity-emb's exceptions for bad input -> 400s; anything else stays a 500."""
    from infinity_emb.primitives import (
        AudioCorruption,
        ImageCorruption,
        MatryoshkaDimError,
        ModelNotDeployedError,
    )

    try:
        yield
    except ModelNotDeployedError as exc:
        raise BadRequest(str(exc), param="model", code="model_not_supported") from exc
    except MatryoshkaDimError as exc:
        raise BadRequest(str(exc), param="dimensions") from exc
    except (ImageCorruption, AudioCorruption) as exc:
        raise BadRequest(str(exc), param="input", code="invalid_media") from exc


def check_count(n: int, limit: int, param: str, what: str = "inputs") -> None:
    if n == 0:
        raise BadRequest(f"'{param}' must not be empty.", param=param, code="empty_input")
    if n > limit:
        raise BadRequest(
            f"Too many {what}: at most {limit} per request, got {n}.",
            param=param,
            code="too_many_inputs",
        )


def texts_from_input(raw: str | list[Any], entry: ModelEntry, settings: Settings) -> list[str]:
    """OpenAI's four input forms -> texts, token ids decoded as the model is configured."""
    if isinstance(raw, str):
        return [raw]
    check_count(len(raw), settings.max_inputs_per_request, "input")
    first = raw[0]
    if isinstance(first, str):
        return raw
    batches = [raw] if isinstance(first, int) else raw
    if entry.token_decoder is None:
        raise BadRequest(
            f"Model {entry.name!r} does not accept token ids; send text.",
            param="input",
            code="token_ids_not_supported",
        )
    texts: list[str] = entry.token_decoder.decode(batches)
    return texts


def truncate_for(entry: ModelEntry, settings: Settings) -> bool:
    return settings.truncate if entry.config.truncate is None else entry.config.truncate


@dataclass
class EmbedResult:
    vectors: list[Any]
    tokens: int


async def embed_texts(entry: ModelEntry, texts: Sequence[str], settings: Settings) -> EmbedResult:
    """Embed texts; usage counts the model's own tokens after truncation."""
    truncate = truncate_for(entry, settings)
    with engine_errors():
        if entry.counter is None:
            vectors, usage = await entry.engine.embed(list(texts))
            return EmbedResult(vectors, int(usage))
        if not truncate:
            # Refuse over-long input before spending engine time on it.
            tokens = await entry.counter.usage(texts, truncate=False)
            vectors, _ = await entry.engine.embed(list(texts))
            return EmbedResult(vectors, tokens)
        tokens, (vectors, _) = await asyncio.gather(
            entry.counter.usage(texts, truncate=True), entry.engine.embed(list(texts))
        )
        return EmbedResult(vectors, tokens)


def check_dimensions(dimensions: int | None, entry: ModelEntry) -> None:
    if dimensions is None:
        return
    size = entry.dimensions
    if dimensions < 1 or (size is not None and dimensions > size):
        raise BadRequest(
            f"'dimensions' must be between 1 and {size} for model {entry.name!r}, "
            f"got {dimensions}.",
            param="dimensions",
            code="invalid_dimensions",
        )
