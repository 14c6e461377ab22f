"""Which class of work a call is: live (a client waits) or background (a Batch API line);
and whose it is (the caller's key and its weight, for the native queue's fair share).

The Batch API runs its lines inside `background()`; the feeder (feeder.py) and the native
engine's queue (scheduler.py) read `in_background()` and let live work go first.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_BACKGROUND: ContextVar[bool] = ContextVar("openai_compat_background", default=False)
_ENGINE_COUNTS: ContextVar[bool] = ContextVar("openai_compat_engine_counts", default=False)


@contextmanager
def background() -> Iterator[None]:
    """Engine calls made inside this block wait for live ones."""
    token = _BACKGROUND.set(True)
    try:
        yield
    finally:
        _BACKGROUND.reset(token)


def in_background() -> bool:
    """Whether the calling code runs inside `background()` (a Batch API line)."""
    return _BACKGROUND.get()


def tenant() -> tuple[str, float]:
    """The current request's key name and fair-share weight ("", 1.0 without keys)."""
    from openai_compat.tenants.limits import current

    caller = current.get()
    return ("", 1.0) if caller is None else (caller.key.name, caller.key.weight)


@contextmanager
def counted_by_engine() -> Iterator[None]:
    """Engine calls made inside this block take the caller's tokens (a key's tpm) themselves,
    once their inputs are prepared and before they queue: for inputs whose count only the
    model's preparation knows (page images, a VLM's chat template, image documents in a
    multimodal rerank). A refusal is then a 429 before the model runs."""
    token = _ENGINE_COUNTS.set(True)
    try:
        yield
    finally:
        _ENGINE_COUNTS.reset(token)


async def reserve_prepared(tokens: int) -> None:
    """The engine's call, with its prepared inputs' tokens: reserved inside
    counted_by_engine(), nothing elsewhere (the caller counted them before)."""
    if _ENGINE_COUNTS.get():
        from openai_compat.tenants.limits import reserve_tokens

        await reserve_tokens(tokens)
