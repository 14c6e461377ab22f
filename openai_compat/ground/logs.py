"""Logging: one plain-text or JSON stderr handler for everything, infinity-emb included."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_handler: logging.Handler | None = None

# Attributes every LogRecord has; anything else was passed through `extra=`.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and v is not None}


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message key=value ...`"""

    def __init__(self) -> None:
        super().__init__(_TEXT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = _extras(record)
        if extras:
            line += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and every `extra` field."""

    def __init__(self) -> None:
        super().__init__()
        self.converter = time.gmtime  # the "Z" below means UTC

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **_extras(record),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str, fmt: str = "text", stream: Any = None) -> None:
    """Install our handler on the root logger (the CLI calls this once at start-up), writing
    to `stream` (sys.stderr when not given)."""
    global _handler
    _handler = logging.StreamHandler(stream or sys.stderr)
    _handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    reclaim_root()
    logging.getLogger().setLevel(level.upper())
    logging.getLogger("openai_compat").setLevel(level.upper())
    # uvicorn's own loggers write through their handlers; route them through ours instead.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers = []
        lg.propagate = True


def reclaim_root() -> None:
    """infinity-emb replaces the root handlers with a Rich console handler when imported
    (it wraps lines at the terminal width); put ours back. No-op if configure() never ran."""
    if _handler is None:
        return
    root = logging.getLogger()
    root.handlers = [_handler]
