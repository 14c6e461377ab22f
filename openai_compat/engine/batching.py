"""What the native engine's queue holds and how a batch is formed from it (scheduler.py runs
them): a caller's inputs (Call), each input's place in the queue (Slot: its cost in tokens and
its fair-queuing tag), the forward passes' counters (BatchStats), the formation rule
(form_batch: length-sorted neighbours within the token budget, TEI's `max_len x n`), and how
results and failures reach the callers' event loops (resolve, fail)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Call:
    """One caller's inputs and the future its results go to."""

    items: Sequence[Any]
    future: asyncio.Future[list[Any]]
    loop: asyncio.AbstractEventLoop
    results: list[Any] = field(default_factory=list)
    remaining: int = 0

    def wanted(self) -> bool:
        return not self.future.done()


@dataclass(eq=False)
class Slot:
    call: Call
    index: int
    cost: int
    order: float  # fair-queuing start tag: the queue's order ("oldest" is the smallest)
    tenant: str = ""


def tag_of(slot: Slot) -> float:
    return slot.order


def withdraw(
    queue: list[Slot], call: Call, tenant: str, share: float, vtime: float
) -> tuple[int, float]:
    """Take a departed call's queued inputs out of `queue` (kept in tag order); its tenant's
    inputs queued after them move back by their share (never before `vtime`). Returns how
    many left and that share (the tenant's finish tag moves back by it too)."""
    mine = [s for s in queue if s.call is call]
    if not mine:
        return 0, 0.0
    back = sum(s.cost for s in mine) / share
    after = max(s.order for s in mine)
    kept = [s for s in queue if s.call is not call]
    for slot in kept:
        if slot.tenant == tenant and slot.order > after:
            slot.order = max(vtime, slot.order - back)
    kept.sort(key=tag_of)
    queue[:] = kept
    return len(mine), back


@dataclass
class BatchStats:
    """What the forward thread has done (/metrics: openai_compat_forward_seconds_total ...)."""

    batches: int = 0
    inputs: int = 0
    tokens: int = 0  # real tokens
    padded_tokens: int = 0  # max_len x n, summed
    dropped_inputs: int = 0  # of callers gone before their batch
    forward_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "inputs": self.inputs,
            "tokens": self.tokens,
            "padded_tokens": self.padded_tokens,
            "dropped_inputs": self.dropped_inputs,
            "forward_seconds": round(self.forward_seconds, 3),
        }


def form_batch(
    window: Sequence[Slot], batch_size: int, max_batch_tokens: int, *, oldest: bool = True
) -> list[Slot]:
    """The next batch from `window` (oldest first, all wanted). Never empty; length-sorted.

    `oldest`: the oldest slot and its neighbours in length order, shorter ones first, while
    the padded cost stays within the budget and the count within batch_size. Otherwise the
    tightest batch: of the runs of min(batch_size, len(window)) neighbours in length that
    fit the budget, the one that pads least (the oldest's run where none fits)."""
    order = sorted(window, key=lambda s: (s.cost, s.order))
    if not oldest:
        n = min(batch_size, len(order))
        best, start, total = -1, 0, sum(s.cost for s in order[:n])
        for i in range(len(order) - n + 1):
            if i:
                total += order[i + n - 1].cost - order[i - 1].cost
            padded = order[i + n - 1].cost * n
            if padded <= max_batch_tokens and (best < 0 or padded - total < best):
                best, start = padded - total, i
        if best >= 0:
            return order[start : start + n]
    lo = hi = order.index(window[0])
    while hi - lo + 1 < batch_size:
        n = hi - lo + 2
        if lo > 0 and order[hi].cost * n <= max_batch_tokens:
            lo -= 1
        elif hi + 1 < len(order) and order[hi + 1].cost * n <= max_batch_tokens:
            hi += 1
        else:
            break
    return order[lo : hi + 1]


# Results go back to each caller's own event loop, one callback per loop and batch.


def by_loop(calls: Sequence[Call]) -> dict[asyncio.AbstractEventLoop, list[Call]]:
    grouped: dict[asyncio.AbstractEventLoop, list[Call]] = {}
    for call in calls:
        grouped.setdefault(call.loop, []).append(call)
    return grouped


def resolve(calls: list[Call]) -> None:
    for call in calls:
        if not call.future.done():
            call.future.set_result(call.results)


def reject(calls: list[Call], exc: BaseException) -> None:
    for call in calls:
        if not call.future.done():
            call.future.set_exception(exc)


def fail(calls: set[Call], exc: BaseException) -> None:
    for loop, group in by_loop(list(calls)).items():
        if not loop.is_closed():
            loop.call_soon_threadsafe(reject, group, exc)
