"""Which models are loaded: lazy loads on first use, idle unloads, a memory budget.

Every configured model has a Slot with a state (unloaded, loading, loaded, unloading, failed).
A request takes a lease on its model (`acquire`) and holds it until its response is built;
the HTTP layer releases the request's leases (`request_leases`). A model with a lease is never
unloaded: an unload waits for them (or, forced, cancels their handlers: 503 to those clients).
Loads run one at a time (transformers builds models under process-global contexts), each in
its own task: waiters share it (single flight) and a client that leaves does not cancel it.
Waiting for room happens outside that one-at-a-time lock, so a model that fits loads while
another waits for busy models to become idle.
Before a load, the least recently used idle models are unloaded until the new one fits
`--max-loaded-models` and `--memory-budget`; sizes are measured at every load (the model's
torch tensors where it has them, else the RSS growth of its load between trimmed readings),
the model's file sizes standing in before its first load.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from openai_compat.frame.settings import ModelConfig
from openai_compat.ground.errors import APIError, ServiceUnavailable
from openai_compat.models import memory
from openai_compat.models.slots import (
    FORCED_UNLOAD,
    REQUEST_LEASES,
    RETRY_FAILED_AFTER,
    Lease,
    Slot,
    give_back,
    load_failed,
    refuse_if_own_leases_block,
)

logger = logging.getLogger("openai_compat")

ModelEntry = Any  # registry.ModelEntry (registry imports this module)


Loader = Any  # loading.ModelLoader: await loader(config) -> ModelEntry
Unloader = Callable[[ModelEntry], Awaitable[None]]


class ModelPool:
    """Slots for every configured model; loads and unloads them (see the module's text)."""

    def __init__(
        self,
        configs: tuple[ModelConfig, ...],
        loader: Loader,
        unloader: Unloader,
        *,
        max_loaded: int = 0,
        budget: int = 0,
        max_waiters: int = 256,
        wait_timeout: float = 120.0,
        on_loaded: Callable[[ModelEntry], None] | None = None,
    ) -> None:
        self.slots = {c.served_name: Slot(c) for c in configs}
        self.loader, self._unloader = loader, unloader
        self.max_loaded, self.budget = max_loaded, budget
        self.max_waiters, self.wait_timeout = max_waiters, wait_timeout
        self._on_loaded = on_loaded
        self._load_lock = asyncio.Lock()
        self._changed = asyncio.Condition()  # a lease released, a model unloaded
        self._version = 0  # bumped by every such change (no wake-up is lost)
        self.closed = False

    # ------------------------------------------------------------ requests

    async def acquire(self, name: str) -> ModelEntry:
        """The loaded model `name`, loading it first if need be, leased to the current request."""
        slot = self.slots[name]
        deadline = time.monotonic() + self.wait_timeout
        while True:
            if slot.state == "loaded" and slot.entry is not None:
                return self._lease(slot)
            if self.closed:
                raise ServiceUnavailable("The server is shutting down.", code="draining")
            if slot.state == "unloading" and slot.unload_task is not None:
                await self._wait(slot, asyncio.shield(slot.unload_task), deadline)
                continue
            refuse_if_own_leases_block(slot, self.max_loaded, self.budget)
            task = slot.load_task  # a load queued or under way: share it
            if task is None:
                if (
                    slot.state == "failed"
                    and time.monotonic() - slot.failed_at < RETRY_FAILED_AFTER
                ):
                    raise load_failed(slot)
                task = self._start_load(slot)
            await self._wait(slot, asyncio.shield(task), deadline)

    async def _wait(self, slot: Slot, awaitable: Awaitable[Any], deadline: float) -> None:
        if slot.waiters >= self.max_waiters:
            raise ServiceUnavailable(
                f"{slot.waiters} requests are already waiting for model {slot.name!r} to load; "
                "retry shortly.",
                code="model_loading",
                headers={"Retry-After": "1"},
            )
        slot.waiters += 1
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                await awaitable
        except TimeoutError:
            raise ServiceUnavailable(
                f"Model {slot.name!r} is still {slot.state} after {self.wait_timeout:g}s; "
                "retry shortly.",
                code="model_loading",
                headers={"Retry-After": "5"},
            ) from None
        except Exception as exc:  # the shared load broke: the same 503 for every waiter
            if isinstance(exc, APIError) or slot.state != "failed":
                raise
            raise load_failed(slot) from exc
        finally:
            slot.waiters -= 1

    def _lease(self, slot: Slot) -> ModelEntry:
        assert slot.entry is not None
        hold = REQUEST_LEASES.get()
        if hold is not None and not any(lease.slot is slot for lease in hold.leases):
            task = asyncio.current_task()
            lease = Lease(slot, task, self._release)
            slot.leases += 1
            if task is not None:
                slot.holders.add(task)
            hold.leases.append(lease)
        slot.last_used = time.monotonic()
        if hold is None and slot.leases == 0:
            # used outside any request (no lease to release): an idle spell starts now,
            # rather than the planned unload being cancelled for good
            self._plan_expiry(slot)
        else:
            self._cancel_expiry(slot)
        return slot.entry

    def give_back(self, name: str) -> None:
        """The current request no longer uses `name` (it looked at the model and chose
        another): its lease is released now, not with the response."""
        give_back(self.slots[name])

    def _release(self, lease: Lease) -> None:
        slot = lease.slot
        slot.leases -= 1
        if lease.task is not None:
            slot.holders.discard(lease.task)
        slot.last_used = time.monotonic()
        if slot.leases == 0:
            self._notify()
            if slot.state == "loaded":
                self._plan_expiry(slot)

    # ------------------------------------------------------------ idle unloads

    def _plan_expiry(self, slot: Slot) -> None:
        keep = slot.config.keep_alive if slot.keep_alive_next is None else slot.keep_alive_next
        slot.keep_alive_next = None
        self._cancel_expiry(slot)
        if keep < 0:
            return
        slot.expires_at = time.monotonic() + keep
        loop = asyncio.get_running_loop()
        slot.expiry = loop.call_later(keep, self._expire, slot)

    def _cancel_expiry(self, slot: Slot) -> None:
        if slot.expiry is not None:
            slot.expiry.cancel()
        slot.expiry, slot.expires_at = None, None

    def _expire(self, slot: Slot) -> None:
        slot.expiry, slot.expires_at = None, None
        if slot.state == "loaded" and slot.leases == 0:
            logger.info("model %r idle past its keep_alive: unloading", slot.name)
            self._start_unload(slot, force=False)

    # ------------------------------------------------------------ loading

    def _start_load(self, slot: Slot) -> asyncio.Task[Any]:
        """Queue a load (state "loading" once it has the load lock and room)."""
        task = asyncio.create_task(self._load(slot), name=f"load-{slot.name}")
        task.add_done_callback(_retrieve)
        slot.load_task = task
        return task

    async def load(self, name: str, *, for_client: bool = False, detail: bool = False) -> None:
        """Load `name` now (eager start-up and the admin API); returns once it is loaded.
        A failed load raises its error (start-up reports it), or for a client a 503."""
        slot = self.slots[name]
        while slot.state != "loaded":
            if slot.state == "unloading" and slot.unload_task is not None:
                await asyncio.shield(slot.unload_task)
                continue
            try:
                await asyncio.shield(slot.load_task or self._start_load(slot))
            except Exception as exc:
                if not for_client or isinstance(exc, APIError) or slot.state != "failed":
                    raise
                raise load_failed(slot, detail=detail) from exc

    async def _load(self, slot: Slot) -> None:
        try:
            need = slot.need(self.budget)
            deadline = time.monotonic() + self.wait_timeout
            while True:
                # Room is made, and waited for, without the load lock: a model that fits
                # now loads meanwhile. Under the lock the room is checked again (another
                # load may have taken it), so two loads never share one model's room.
                await self._make_room(slot, need, deadline)
                async with self._load_lock:
                    if not self._fits(slot, need):
                        continue
                    entry = await self._load_locked(slot)
                    break
            slot.entry, slot.state, slot.loads = entry, "loaded", slot.loads + 1
            slot.load_seconds_total += slot.load_seconds
            slot.last_used = time.monotonic()
            if self._on_loaded is not None:
                self._on_loaded(entry)
            logger.info(
                "model %r loaded in %.1fs, %s resident",
                slot.name,
                slot.load_seconds,
                memory.human(slot.resident_bytes),
            )
            if slot.leases == 0 and slot.waiters == 0:
                self._plan_expiry(slot)  # loaded ahead of use (eager, admin): idle from now
        except APIError:
            slot.state = "unloaded"  # could not make room: nothing wrong with the model
            raise
        except BaseException as exc:
            slot.state, slot.failed_at = "failed", time.monotonic()
            slot.error = str(exc) or type(exc).__name__
            # a lazy load or a reload: said here once (start-up reports an eager model's own)
            if isinstance(exc, Exception) and (slot.config.load == "lazy" or slot.loads):
                logger.error("model %r failed to load: %s", slot.name, slot.error)
            raise
        finally:
            slot.load_task = None
            self._notify()

    async def _load_locked(self, slot: Slot) -> ModelEntry:
        """Build the model (the load lock held) and measure what it costs."""
        slot.state, slot.error = "loading", None
        memory.trim()
        before = memory.rss()
        started = time.perf_counter()
        with memory.weights_mapped():
            entry = await self.loader(slot.config)
        slot.load_seconds = time.perf_counter() - started
        memory.trim()  # both readings trimmed: the load's freed scratch is not kept
        after = memory.rss()
        grown = max(after - before, 0) if before and after else None
        slot.measured(getattr(self.loader, "weight_bytes", lambda entry: None)(entry), grown)
        return entry

    async def _make_room(self, slot: Slot, need: int, deadline: float) -> None:
        """Unload least recently used idle models until `slot` fits; wait (bounded) while
        the models in the way are busy."""
        while not self._fits(slot, need):
            idle = [
                s
                for s in self.slots.values()
                if s is not slot and s.state == "loaded" and s.leases == 0 and s.waiters == 0
            ]
            if idle:
                victim = min(idle, key=lambda s: s.last_used)
                logger.info("unloading idle model %r to make room for %r", victim.name, slot.name)
                await self._start_unload(victim, force=False)
                continue
            busy = [s.name for s in self.slots.values() if s.state in ("loaded", "unloading")]
            seen = self._version
            try:
                async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                    async with self._changed:
                        await self._changed.wait_for(partial(self._changed_since, seen))
            except TimeoutError:
                raise ServiceUnavailable(
                    f"No room to load model {slot.name!r}: the loaded models "
                    f"({', '.join(busy)}) stayed busy for {self.wait_timeout:g}s.",
                    code="model_capacity",
                    headers={"Retry-After": "5"},
                ) from None

    def _fits(self, slot: Slot, need: int) -> bool:
        others = [
            s for s in self.slots.values() if s is not slot and s.state in ("loaded", "unloading")
        ]
        if self.max_loaded and len(others) + 1 > self.max_loaded:
            return False
        return not self.budget or sum(s.charge() for s in others) + need <= self.budget

    # ------------------------------------------------------------ unloading

    async def unload(self, name: str, *, force: bool = False) -> bool:
        """Unload `name` once its in-flight work is done (force: cancel that work). False if
        it was not loaded."""
        slot = self.slots[name]
        if slot.load_task is not None:
            # a load that fails leaves nothing to unload: its error is the slot's, not ours
            with contextlib.suppress(Exception):
                await asyncio.shield(slot.load_task)
        if slot.state == "unloading" and slot.unload_task is not None:
            if force:
                self._cancel_holders(slot)
            await asyncio.shield(slot.unload_task)
            return True
        if slot.state != "loaded":
            return False
        await self._start_unload(slot, force=force)
        return True

    def _start_unload(self, slot: Slot, *, force: bool) -> asyncio.Task[None]:
        if slot.unload_task is not None:
            return slot.unload_task
        self._cancel_expiry(slot)
        slot.state = "unloading"
        if force:
            self._cancel_holders(slot)
        task = asyncio.create_task(self._unload(slot), name=f"unload-{slot.name}")
        task.add_done_callback(_retrieve)
        slot.unload_task = task
        return task

    def _cancel_holders(self, slot: Slot) -> None:
        for task in list(slot.holders):
            task.cancel(FORCED_UNLOAD)

    async def _unload(self, slot: Slot) -> None:
        try:
            async with self._changed:
                await self._changed.wait_for(lambda: slot.leases == 0)
            entry, slot.entry = slot.entry, None
            collected = 0.0
            if entry is not None:
                try:
                    await self._unloader(entry)
                finally:
                    del entry
                    started = time.perf_counter()
                    memory.release()
                    collected = time.perf_counter() - started
            slot.unloads += 1
            logger.info(
                "model %r unloaded (memory released in %.0f ms; rss now %s)",
                slot.name,
                collected * 1000,
                memory.human(memory.rss()),
            )
        finally:
            slot.state, slot.unload_task, slot.holders = "unloaded", None, set()
            self._notify()

    def _changed_since(self, version: int) -> bool:
        return self._version != version

    def _notify(self) -> None:
        self._version += 1

        async def wake() -> None:
            async with self._changed:
                self._changed.notify_all()

        with contextlib.suppress(RuntimeError):  # no loop: interpreter shutdown
            asyncio.get_running_loop().create_task(wake()).add_done_callback(_retrieve)

    async def close(self) -> None:
        """At shutdown: no new loads; planned idle unloads and loads under way are dropped
        (the engines are stopped with the others)."""
        self.closed = True
        for slot in self.slots.values():
            self._cancel_expiry(slot)
            if slot.load_task is not None and not slot.load_task.done():
                slot.load_task.cancel()
                with contextlib.suppress(BaseException):
                    await slot.load_task

    # ------------------------------------------------------------ reading

    def describe(self, name: str) -> dict[str, Any]:
        """The admin view of one model (GET /admin/models)."""
        return self.slots[name].describe()

    def loaded_count(self) -> int:
        return sum(1 for s in self.slots.values() if s.state in ("loaded", "unloading"))


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a background task's outcome as seen (waiters get it through their shield)."""
    if not task.cancelled():
        task.exception()
