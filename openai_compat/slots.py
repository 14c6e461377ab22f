"""A model's residency record (Slot) and the leases requests hold on loaded models.

A request takes a lease on its model (pool.ModelPool.acquire) and holds it until its
response is built: the HTTP layer runs each handler inside `request_leases()`, which releases
them. A model with a lease is never unloaded.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from openai_compat import memory
from openai_compat.errors import ServiceUnavailable
from openai_compat.settings import ModelConfig

State = Literal["unloaded", "loading", "loaded", "unloading", "failed"]
# A forced unload cancels the handlers holding the model with this message: 503 for them.
FORCED_UNLOAD = "openai_compat: model unloaded by an administrator"
ModelEntry = Any  # registry.ModelEntry (registry imports this module)

REQUEST_LEASES: contextvars.ContextVar[RequestHold | None] = contextvars.ContextVar(
    "openai_compat_leases", default=None
)


@dataclass
class Slot:
    """One configured model's residency."""

    config: ModelConfig
    state: State = "unloaded"
    entry: ModelEntry | None = None
    error: str | None = None
    failed_at: float = 0.0
    leases: int = 0
    holders: set[asyncio.Task[Any]] = field(default_factory=set)
    last_used: float = 0.0
    keep_alive_next: float | None = None  # a request's keep_alive, for the next idle spell
    expiry: asyncio.TimerHandle | None = None
    expires_at: float | None = None  # monotonic time of the planned idle unload
    load_task: asyncio.Task[Any] | None = None
    unload_task: asyncio.Task[None] | None = None
    waiters: int = 0
    loads: int = 0
    unloads: int = 0
    load_seconds: float = 0.0
    load_seconds_total: float = 0.0
    resident_bytes: int | None = None  # measured at its last load (see measured_by)
    measured_by: Literal["tensors", "rss"] | None = None  # its tensors, or RSS growth
    rss_growth: int | None = None  # RSS after its last load minus before (trimmed both)
    file_bytes: int | None = None  # the weights' files, before any load
    card: dict[str, Any] | None = None  # its /v1/models card from its last load

    @property
    def name(self) -> str:
        return self.config.served_name

    def charge(self) -> int:
        """Bytes this model counts against the budget: measured at its last load, else its
        files."""
        return self.resident_bytes or self.file_size()

    def file_size(self) -> int:
        if self.file_bytes is None:
            self.file_bytes = memory.model_file_bytes(self.config)
        return self.file_bytes


class Lease:
    """A request's hold on a loaded model; released once (by the HTTP layer)."""

    __slots__ = ("on_release", "released", "slot", "task")

    def __init__(
        self, slot: Slot, task: asyncio.Task[Any] | None, on_release: Callable[[Lease], None]
    ) -> None:
        self.slot, self.task, self.on_release, self.released = slot, task, on_release, False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.on_release(self)


@dataclass
class RequestHold:
    """One request's leases, and the keep_alive its body asked for (if any)."""

    leases: list[Lease] = field(default_factory=list)
    keep_alive: float | None = None


@contextmanager
def request_leases() -> Iterator[RequestHold]:
    """The leases taken by the code run inside (one request's handler): released on exit,
    each model's next idle spell set to the request's keep_alive where it gave one."""
    hold = RequestHold()
    token = REQUEST_LEASES.set(hold)
    try:
        yield hold
    finally:
        REQUEST_LEASES.reset(token)
        for lease in hold.leases:
            if hold.keep_alive is not None:
                lease.slot.keep_alive_next = hold.keep_alive
            lease.release()


def set_keep_alive(seconds: float | None) -> None:
    """A request's own keep_alive (Ollama's): how long its models stay once idle after it
    (read_body calls this for every body that declares the field)."""
    hold = REQUEST_LEASES.get()
    if seconds is not None and hold is not None:
        hold.keep_alive = seconds


def raise_if_unloaded(exc: BaseException) -> None:
    """A handler cancelled by a forced unload (pool.ModelPool.unload) answers 503."""
    if exc.args == (FORCED_UNLOAD,):
        raise ServiceUnavailable(
            "The model was unloaded by an administrator while this request ran; retry (it "
            "loads again on use).",
            code="model_unloaded",
            headers={"Retry-After": "1"},
        ) from None
