"""The server's phase (loading -> ready -> draining), shared by probes, routes and the CLI."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

logger = logging.getLogger("openai_compat")

Phase = Literal["loading", "ready", "draining", "failed"]


class Lifecycle:
    def __init__(self) -> None:
        self.phase: Phase = "loading"
        self.error: str | None = None
        self.inflight = 0  # API requests being served (probes excluded)
        # Set by whoever runs the server (the CLI) to stop it, e.g. when a model fails to load.
        self.on_fatal: Callable[[str], None] | None = None

    def ready(self) -> None:
        if self.phase == "loading":
            self.phase = "ready"

    def drain(self) -> None:
        if self.phase in ("loading", "ready"):
            self.phase = "draining"

    def fail(self, error: str) -> None:
        self.phase = "failed"
        self.error = error
        logger.error("%s", error)
        if self.on_fatal is not None:
            self.on_fatal(error)

    def unavailable_message(self) -> str:
        return {
            "loading": "The server is still loading its models; retry shortly.",
            "ready": "The server is ready.",
            "draining": "The server is shutting down; retry on another replica.",
            "failed": "The server failed to load its models.",
        }[self.phase]
