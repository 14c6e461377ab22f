"""Which class of work a call is: live (a client waits) or background (a Batch API line).

The Batch API runs its lines inside `background()`; the feeder (feeder.py) and the native
engine's queue (scheduler.py) read `in_background()` and let live work go first.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_BACKGROUND: ContextVar[bool] = ContextVar("openai_compat_background", default=False)


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
