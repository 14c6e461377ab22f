"""The server's phase (loading -> ready -> draining), shared by probes, routes and the CLI."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any, Literal, TypeVar

T = TypeVar("T")

logger = logging.getLogger("openai_compat")

Phase = Literal["loading", "ready", "draining", "failed"]

# Threads that load models are named so; the CLI exits without waiting for them.
LOADER_PREFIX = "model-load"


async def in_daemon_thread(fn: Callable[..., T], *args: Any, name: str) -> T:
    """Run blocking start-up work (imports, weight loading) in a daemon thread.

    Not in the default executor: asyncio.run() joins its threads at exit, so a SIGTERM during
    a long model load would wait for the load to finish. A daemon thread is abandoned instead.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(value: Any, failed: bool) -> None:
        if future.done():
            return
        if failed:
            future.set_exception(value)
        else:
            future.set_result(value)

    def run() -> None:
        try:
            result: Any = fn(*args)
            failed = False
        except BaseException as exc:
            result, failed = exc, True
        if not loop.is_closed():
            loop.call_soon_threadsafe(settle, result, failed)

    threading.Thread(target=run, name=f"{LOADER_PREFIX}-{name}", daemon=True).start()
    return await future


def loaders_running() -> bool:
    return any(t.name.startswith(LOADER_PREFIX) and t.is_alive() for t in threading.enumerate())


class Lifecycle:
    def __init__(self) -> None:
        self.phase: Phase = "loading"
        self.error: str | None = None
        self.inflight = 0  # API requests being served (probes excluded)
        # of those, Batch API lines waiting for their owner's budget: not worth a drain (they
        # have not reached a model; the batch resumes them after a restart)
        self.parked = 0
        # Set by whoever runs the server (the CLI) to stop it, e.g. when a model fails to load.
        self.on_fatal: Callable[[str], None] | None = None
        self.cpus: dict[str, Any] | None = None  # CPUs and thread pools (cpus.report)

    def park(self, delta: int) -> None:
        """A background request starts (+1) or stops (-1) waiting for its owner's budget."""
        self.parked += delta

    @property
    def draining_for(self) -> int:
        """Requests a drain waits for: those in flight, less the parked ones."""
        return self.inflight - self.parked

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
