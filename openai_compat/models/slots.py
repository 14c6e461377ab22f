"""A model's residency record (Slot: its state, measured size and budget charge, admin view)
and the leases requests hold on loaded models (taken, given back, and what they block).

A request takes a lease on its model (pool.ModelPool.acquire) and holds it until its
response is built: the HTTP layer runs each handler inside `request_leases()`, which releases
them. A model with a lease is never unloaded.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from openai_compat.frame.settings import ModelConfig
from openai_compat.ground.errors import BadRequest, Forbidden, ServiceUnavailable
from openai_compat.models import memory
from openai_compat.tenants.limits import current as current_caller

State = Literal["unloaded", "loading", "loaded", "unloading", "failed"]
# A forced unload cancels the handlers holding the model with this message: 503 for them.
FORCED_UNLOAD = "openai_compat: model unloaded by an administrator"
ModelEntry = Any  # registry.ModelEntry (registry imports this module)
# A failed lazy load is tried again by a request at most this often.
RETRY_FAILED_AFTER = 30.0

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

    def need(self, budget: int) -> int:
        """What this model will count against `budget` (0: none); a model larger than the
        whole budget is a 400."""
        need = self.charge() if budget else 0
        if budget and need > budget and self.measured_by == "rss":
            # RSS growth is noisy (it counts all the process allocated during the load): one
            # high reading must not refuse the model for good. Its files decide again, and
            # this load measures it anew.
            need = self.file_size()
        if budget and need > budget:
            raise BadRequest(
                f"Model {self.name!r} needs {memory.human(need)}, more than the whole memory "
                f"budget ({memory.human(budget)}); it cannot be loaded on this server.",
                param="model",
                code="model_too_large",
            )
        return need

    def measured(self, weights: int | None, grown: int | None) -> None:
        """A load's measurement: the model's own tensors where the engine has them, since
        RSS growth also takes in whatever else the process allocated meanwhile (a concurrent
        request, a worker pool starting). Taken again at every load."""
        self.resident_bytes, self.rss_growth = (weights or grown), grown
        self.measured_by = "tensors" if weights else "rss" if grown is not None else None

    def describe(self) -> dict[str, Any]:
        """The admin view (GET /admin/models)."""
        now = time.monotonic()
        return {
            "id": self.name,
            "load": self.config.load,
            "state": self.state,
            "error": self.error,
            "keep_alive": self.config.keep_alive,
            "idle_unload_in": None
            if self.expires_at is None
            else round(max(self.expires_at - now, 0.0), 3),
            "in_flight": self.leases,
            "waiting": self.waiters,
            "loads": self.loads,
            "unloads": self.unloads,
            "load_seconds": round(self.load_seconds, 3) if self.loads else None,
            "resident_bytes": self.resident_bytes,
            "measured_by": self.measured_by,
            "rss_growth_bytes": self.rss_growth,
            "file_bytes": self.file_size(),
        }

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
            # an eager model is the server's standing set: a request never unloads it
            if hold.keep_alive is not None and lease.slot.config.load != "eager":
                lease.slot.keep_alive_next = hold.keep_alive
            lease.release()


def held_slots(besides: Slot) -> list[Slot]:
    """The other models the current request holds leases on (each once)."""
    hold = REQUEST_LEASES.get()
    mine: list[Slot] = []
    for lease in hold.leases if hold else []:
        seen = any(lease.slot is s for s in mine)
        if not lease.released and lease.slot is not besides and not seen:
            mine.append(lease.slot)
    return mine


def refuse_if_own_leases_block(slot: Slot, max_loaded: int, budget: int) -> None:
    """A request that holds models and needs `slot` too: if the models it holds leave no
    room for `slot` under --max-loaded-models or the budget (they stay loaded while it
    waits), waiting cannot help: 503 now, saying why, rather than after the load timeout
    with every other load held up."""
    mine = held_slots(slot)
    if not mine:
        return
    names = ", ".join(repr(s.name) for s in mine)
    if max_loaded and len(mine) + 1 > max_loaded:
        why = f"--max-loaded-models is {max_loaded}"
    elif budget and sum(s.charge() for s in mine) + slot.need(budget) > budget:
        why = f"the memory budget ({memory.human(budget)}) cannot hold them together"
    else:
        return
    raise ServiceUnavailable(
        f"This request needs model {slot.name!r} loaded beside {names}, which it holds, and {why}.",
        code="model_capacity",
    )


def give_back(slot: Slot) -> None:
    """Release the current request's lease on `slot` now, not with its response."""
    hold = REQUEST_LEASES.get()
    for lease in [x for x in hold.leases if x.slot is slot] if hold else []:
        hold.leases.remove(lease)  # type: ignore[union-attr]
        lease.release()


def load_failed(slot: Slot, *, detail: bool = False) -> ServiceUnavailable:
    """The 503 of a model whose load failed. API clients get no more than that (the load's
    error names server paths and library internals): the reason is in the log and in
    GET /admin/models, and `detail` (the admin API) gives it."""
    why = (
        f": {slot.error}"
        if detail
        else "; retry later (the reason is in the server's log and GET /admin/models)"
    )
    return ServiceUnavailable(
        f"Model {slot.name!r} failed to load{why}.",
        code="model_load_failed",
        headers={"Retry-After": str(int(RETRY_FAILED_AFTER))},
    )


def set_keep_alive(seconds: float | None) -> None:
    """A request's own keep_alive (Ollama's): how long its lazy models stay once idle after
    it (read_body calls this for every body that declares the field). A keys-file key needs
    `set_keep_alive = true` (403 otherwise): its keep_alive would unload a model that other
    keys share, and cost their next request a reload."""
    hold = REQUEST_LEASES.get()
    if seconds is None or hold is None:
        return
    caller = current_caller.get()
    if caller is not None and not caller.key.set_keep_alive:
        raise Forbidden(
            f"Key {caller.key.name!r} may not set keep_alive: models are shared by every key "
            "(the keys file's set_keep_alive = true grants it). Leave keep_alive out.",
            param="keep_alive",
        )
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
