"""Logging: one plain (or JSON) stderr handler for everything, infinity-emb included."""

from __future__ import annotations

import logging
import sys

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_handler: logging.Handler | None = None


def configure(level: str) -> None:
    """Install our handler on the root logger (the CLI calls this once at start-up)."""
    global _handler
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter(_FORMAT))
    reclaim_root()
    logging.getLogger().setLevel(level.upper())
    logging.getLogger("openai_compat").setLevel(level.upper())


def reclaim_root() -> None:
    """infinity-emb replaces the root handlers with a Rich console handler when imported
    (it wraps lines at the terminal width); put ours back. No-op if configure() never ran."""
    if _handler is None:
        return
    root = logging.getLogger()
    root.handlers = [_handler]
