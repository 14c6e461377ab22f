"""The native engine's scheduling: one queue per model, batches formed by a token budget, run
by the model's forward lanes.

A caller's inputs arrive prepared (tokenized off the event loop, each with its cost in tokens)
and wait as slots in the model's queue: live calls in one, Batch API lines (priority.background)
in another that is served only while no live input waits. When a lane is free it forms the
next batch from the oldest `window` live slots (batching.form_batch): sorted by cost, the run of
`batch_size` neighbouring lengths that pads least, within `max_len x n <= max_batch_tokens`
(what a padded batch costs, TEI's rule); once the oldest slot has been passed over
MAX_PASSES times, the run around it instead (so nothing waits behind newer work for long),
grown within the budget and `n <= batch_size`, never empty. A caller that has gone (its
future cancelled) is skipped at formation: its inputs never reach the model.

"Oldest" is in fair-queuing order (start-time fair queuing): each input gets a tag, its
tenant's (the caller's key: tenants/) previous finish or the queue's virtual time, whichever
is later, and the tenant's finish moves on by cost / weight. The queue is kept in tag order,
so with one tenant it is arrival order, and with several the engine's tokens are shared by
weight: a key with 64 requests queued does not make another key's input wait behind them,
and weights 3:1 give 3:1 of the tokens while both wait. While inputs of more than one key
wait in the window, a batch is the next `batch_size` of them in that order (within the
budget): the length-sorted search would otherwise pick across keys by length alone. While live
calls keep coming, background batches are an eighth of batch_size, so a live request never
waits behind a full one. Results go back with one event-loop callback per batch; a failing
batch fails only its own callers.

Lanes: on a CPU with two cores or more, two forward threads share a torch model by default
(its weights are read-only in inference; native.lanes, the model's `forward_lanes`). A batch
formed while no other runs, nothing else waits and the lanes have not run side by side for
LOADED_S runs alone on every thread (the lowest latency for one client; the thread count the
tuner measures best on the CPU the process really gets, threads.py), and while it runs the
other lane waits; under load the queue empties for a moment between a response and its
client's next request, and a lone batch then would hold the other lane when that request
came. A batch formed while work is left, or beside a running one, runs on its share of the
threads (`narrow`: one each on two CPUs) while the other lane takes the next: small GEMMs on
one thread each waste no time at OpenMP's barriers, so under load the pair does 1.13-1.16x
one batch on two threads (MiniLM, 2 vCPUs, sentence-transformers' own encode), and a
neighbour busy on one core slows one lane only instead of stalling a team at every barrier.
Each lane sets its own count (torch's is per thread).

There are no pollers: a lane sleeps on a condition until work arrives, callers await a
future. Whatever the runner is (text.py, debug.py), it is only ever called on its lanes.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from openai_compat.engine.batching import (
    BatchStats,
    Call,
    Slot,
    by_loop,
    fail,
    form_batch,
    resolve,
    tag_of,
    withdraw,
)
from openai_compat.engine.refusals import EngineStopped
from openai_compat.engine.threads import ThreadTuner

logger = logging.getLogger("openai_compat.engine")

# Slots considered per formation, in batches: enough to sort lengths, few enough to stay fair.
WINDOW_BATCHES = 8
# Background batches beside live traffic are this fraction of batch_size, so a live request
# that arrives waits for at most a short batch (feeder.py's TRICKLE_FRACTION); full batches
# again once no live call has come for QUIET_S.
TRICKLE_FRACTION = 8
QUIET_S = 0.5
# A batch is the tightest run of neighbouring lengths in the window (least padding), but the
# oldest waiting input goes once it has been passed over this many times: no input waits
# more than MAX_PASSES batches beyond those ahead of it.
MAX_PASSES = 4
# Lanes: a batch runs alone on every thread only if the lanes have not run side by side for
# this long (under load the queue empties between a response and the client's next request:
# a wide batch then would hold the other lane when that request comes).
LOADED_S = 0.5
# An idle model does not give its freed heap back (glibc's malloc_trim, tried 2026-12-05): the
# next batches fault those pages in again, and one-input requests in the second after a 2.5 s
# pause ran at p50 15.1-15.4 ms against 12.4 without it (docs/benchmarks.md). Nor would it
# lower the memory after a loaded run (tried 2026-12-07, a trim each time the queue emptied:
# MiniLM at 16 x 32 in flight, 676 MiB after the run with it and without).


class Runner(Protocol):
    def on_thread(self) -> None:
        """Runs once, first thing on the forward thread (thread counts, inference mode)."""

    # Optional: `tunable_threads() -> int`, the most threads `set_threads(count)` may give
    # the forward pass from the next batch on (1: the count is fixed); see threads.py.
    # Optional: `prepare_threads(counts)`, called once at construction with every count a
    # batch may be given, for a runner that holds something per count (exported.py).

    def run(self, items: Sequence[Any]) -> list[Any]:
        """One batch: the prepared items -> one result each, in order."""


class Scheduler:
    """The queue and forward thread of one model replica."""

    def __init__(
        self,
        runner: Runner,
        *,
        name: str,
        batch_size: int,
        max_batch_tokens: int,
        on_batch: Callable[[list[Slot]], None] | None = None,
        tuner: ThreadTuner | None = None,
        lanes: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`tuner`: how a lone batch's thread count is chosen (threads.py); by default one
        over the runner's tunable_threads() when it has more than one. `lanes`: forward
        threads (above; native.load chooses them). `clock`: when the lanes last ran side by
        side (tests inject one)."""
        self.runner, self.name = runner, name
        most = int(runner.tunable_threads()) if hasattr(runner, "tunable_threads") else 1
        if tuner is None and most > 1:
            tuner = ThreadTuner(most)
        self.tuner = tuner
        self.lanes = max(1, lanes)
        # threads per batch while lanes run side by side: the CPUs shared out among them
        self.narrow = max(1, most // self.lanes)
        if tuner is not None and hasattr(runner, "prepare_threads"):
            # made now, while the model loads (the pool measures a load's memory), not on a
            # batch's first use of a count
            runner.prepare_threads(sorted({*tuner.options, self.narrow}))
        self.batch_size, self.max_batch_tokens = max(1, batch_size), max(1, max_batch_tokens)
        self.stats = BatchStats()
        self._on_batch = on_batch  # tests observe formation here
        self._cond = threading.Condition()
        # Each queue in tag order, with its virtual time and every tenant's finish tag.
        self._live: list[Slot] = []
        self._background: list[Slot] = []
        self._vtime = {False: 0.0, True: 0.0}
        self._finish: dict[bool, dict[str, float]] = {False: {}, True: {}}
        self._last_live = -QUIET_S  # time.monotonic() of the last live call
        self._stopping = False
        self._passes = 0  # formations the oldest waiting input has been passed over
        self._running = 0  # batches in a forward pass now
        self._wide = False  # one of them is a lone batch on every thread: the others wait
        self._clock = clock
        self._side_by_side = -LOADED_S  # when a batch last started beside another
        self._threads = [
            threading.Thread(target=self._serve, name=f"forward-{name}-{i}", daemon=True)
            for i in range(self.lanes)
        ]

    # ------------------------------------------------------------ the caller's side

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads) and not self._stopping

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def waiting(self) -> int:
        """Inputs queued and not yet in a batch."""
        with self._cond:
            return len(self._live) + len(self._background)

    async def submit(
        self,
        items: Sequence[Any],
        costs: Sequence[int],
        *,
        background: bool = False,
        tenant: str = "",
        weight: float = 1.0,
    ) -> list[Any]:
        """Queue a caller's prepared inputs; their results, in order. Cancelling the await
        withdraws the inputs that are not yet in a batch. `tenant`, `weight`: whose inputs
        they are and that key's share of the engine (fair queuing, above)."""
        if not items:
            return []
        loop = asyncio.get_running_loop()
        call = Call(items, loop.create_future(), loop, [None] * len(items), len(items))
        with self._cond:
            if self._stopping:
                raise EngineStopped(f"model {self.name!r} is stopping")
            queue = self._background if background else self._live
            if not background:
                self._last_live = time.monotonic()
            finish = self._finish[background]
            tag = max(self._vtime[background], finish.get(tenant, 0.0))
            share = max(weight, 1e-9)
            for i, cost in enumerate(costs):
                slot = Slot(call, i, max(1, int(cost)), tag, tenant)
                if not queue or tag >= queue[-1].order:
                    queue.append(slot)
                else:
                    bisect.insort_right(queue, slot, key=tag_of)
                tag += slot.cost / share
            finish[tenant] = tag
            self._cond.notify()
        try:
            return await call.future
        except asyncio.CancelledError:
            self._withdraw(call, background, tenant, share)
            raise

    def _withdraw(self, call: Call, background: bool, tenant: str, share: float) -> None:
        """A caller gone before its inputs ran (an SDK's timeout): they leave the queue, and
        its key's tags move back by their share (not charged for work it dropped)."""
        with self._cond:
            queue = self._background if background else self._live
            vtime = self._vtime[background]
            dropped, back = withdraw(queue, call, tenant, share, vtime)
            finish = self._finish[background]
            if dropped and tenant in finish:
                finish[tenant] = max(vtime, finish[tenant] - back)
            self.stats.dropped_inputs += dropped

    def stop(self, timeout: float = 10.0) -> None:
        """Fail what is queued, let the running batch finish, end the thread."""
        self._close(EngineStopped(f"model {self.name!r} was stopped"))
        for thread in self._threads:
            if thread.is_alive() and threading.current_thread() is not thread:
                thread.join(timeout)

    def _close(self, exc: BaseException) -> None:
        """Stop taking work; every caller still queued fails with `exc`."""
        with self._cond:
            self._stopping = True
            pending = list(self._live) + list(self._background)
            self._live.clear()
            self._background.clear()
            self._cond.notify_all()
        fail({s.call for s in pending}, exc)

    # ------------------------------------------------------------ the forward thread

    def _next_batch(self) -> list[Slot] | None:
        """Under the lock: wait for work and a free CPU (no lone batch running on all the
        threads), then form a batch (None once stopping)."""
        while True:
            while not self._stopping and (self._wide or not (self._live or self._background)):
                self._cond.wait()
            if self._stopping:
                return None
            queue = self._live if self._live else self._background
            size = self.batch_size
            if queue is self._background and time.monotonic() - self._last_live < QUIET_S:
                size = max(1, size // TRICKLE_FRACTION)  # live traffic is about: short batches
            background = queue is self._background
            window: list[Slot] = []
            limit = size * WINDOW_BATCHES
            seen = 0
            while seen < len(queue) and len(window) < limit:
                slot = queue[seen]
                seen += 1
                if slot.call.wanted():
                    window.append(slot)
                else:
                    self.stats.dropped_inputs += 1
            del queue[:seen]
            if not window:
                continue
            if len({s.tenant for s in window}) > 1:
                # keys contend: the next `size` inputs in fair order (the tightest run over
                # the whole window would pick by length across keys and undo their shares)
                batch = form_batch(window[:size], size, self.max_batch_tokens)
            else:
                # the tightest batch, unless the oldest input was passed over MAX_PASSES times
                must = self._passes >= MAX_PASSES
                batch = form_batch(window, size, self.max_batch_tokens, oldest=must)
            taken = set(map(id, batch))
            self._passes = 0 if id(window[0]) in taken else self._passes + 1
            queue[0:0] = [s for s in window if id(s) not in taken]  # keep their place
            # the virtual time: the earliest start tag in service (start-time fair queuing;
            # the latest would let a batch picked by length jump it past waiting inputs, and
            # put a key that just came back behind them)
            served = min(s.order for s in batch)
            self._vtime[background] = max(self._vtime[background], served)
            return batch

    def _serve(self) -> None:
        try:
            self.runner.on_thread()
        except BaseException as exc:  # the model cannot run: fail everyone, stop
            logger.exception("model %r: the forward thread could not start", self.name)
            self._close(exc)
            return
        given = 0  # the thread count this lane last gave the runner (per thread: torch's is)
        while True:
            with self._cond:
                batch = self._next_batch()
                if batch is None:
                    return
                wide = self._start_batch()
            try:
                batch = [s for s in batch if s.call.wanted()]  # gone while the lock was let go
                if batch:
                    given = self._run(batch, wide, given)
            finally:
                with self._cond:
                    self._running -= 1
                    if wide:
                        self._wide = False
                    self._cond.notify_all()

    def _start_batch(self) -> bool:
        """Under the lock, a batch formed: whether it runs wide, alone on every thread (no
        other batch runs, none waits, and none ran beside another lately)."""
        now = self._clock()
        if self._running:
            self._side_by_side = now
        wide = self.lanes == 1 or (
            self._running == 0
            and not self._live
            and not self._background
            and now - self._side_by_side >= LOADED_S
        )
        self._running += 1
        self._wide = wide
        if not wide:
            self._cond.notify()  # work is left: another lane may take it
        return wide

    def _run(self, batch: list[Slot], wide: bool, given: int) -> int:
        """One batch through the runner on this lane; the thread count it ran on."""
        if self._on_batch is not None:
            self._on_batch(batch)
        # the tuner (a runner whose count it may set) picks a lone batch's count; a batch
        # beside another runs on its share
        tuner = self.tuner if wide else None
        threads = given
        if self.tuner is not None:
            threads = self.narrow if tuner is None else tuner.start()
            if threads != given:
                self.runner.set_threads(threads)  # type: ignore[attr-defined]
        started = time.perf_counter()
        padded = max(s.cost for s in batch) * len(batch)
        try:
            results = self.runner.run([s.call.items[s.index] for s in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"the runner gave {len(results)} results for {len(batch)}")
        except BaseException as exc:  # a batch's error fails its callers only
            logger.debug("model %r: batch failed", self.name, exc_info=True)
            fail({s.call for s in batch}, exc)
            return threads
        finally:
            self._count(batch, padded, time.perf_counter() - started, tuner)
        done: list[Call] = []
        with self._cond:  # a call's inputs may finish on two lanes at once
            for slot, result in zip(batch, results, strict=True):
                call = slot.call
                call.results[slot.index] = result
                call.remaining -= 1
                if call.remaining == 0:
                    done.append(call)
        # (answered before this lane is marked free: a one-client stream's next batch may then
        # find it running and go narrow, which measured faster than wide for one client here:
        # p50 12.5 vs 14.8 ms for 1 input, 49 vs 58 for 16, bench.py's one-client, 2026-12-06)
        for loop, calls in by_loop(done).items():
            loop.call_soon_threadsafe(resolve, calls)
        return threads

    def _count(
        self, batch: list[Slot], padded: int, seconds: float, tuner: ThreadTuner | None
    ) -> None:
        with self._cond:  # lanes count side by side
            stats = self.stats
            stats.forward_seconds += seconds
            stats.batches += 1
            stats.inputs += len(batch)
            stats.tokens += sum(s.cost for s in batch)
            stats.padded_tokens += padded
        if tuner is not None:  # a wide batch: no other runs, so only one lane is here
            before = tuner.chosen
            tuner.done(padded)
            if tuner.chosen != before:
                logger.info(
                    "model %r: a lone batch now runs on %d thread(s) (measured faster here)",
                    self.name,
                    tuner.chosen,
                )
