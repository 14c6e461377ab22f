"""The native engine's scheduler (engine/scheduler.py): token-budget batches, departed callers,
live before background, failures kept to their batch, stopping. A scripted runner stands in
for the model, so timing is controlled by events, never by this machine's speed."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

from openai_compat.engine.batching import Slot, form_batch
from openai_compat.engine.refusals import EngineStopped
from openai_compat.engine.scheduler import LOADED_S, MAX_PASSES, Scheduler
from openai_compat.engine.threads import ThreadTuner, candidates


class Recorder:
    """Records every batch it runs; the first batch can be held until `release` is set."""

    def __init__(self, hold_first: bool = False) -> None:
        self.batches: list[list[Any]] = []
        self.started = threading.Event()
        self.release = threading.Event()
        if not hold_first:
            self.release.set()
        self.thread_name = ""

    def on_thread(self) -> None:
        self.thread_name = threading.current_thread().name

    def run(self, items: Sequence[Any]) -> list[Any]:
        self.batches.append(list(items))
        self.started.set()
        self.release.wait(10)
        if any(item == "poison" for item in items):
            raise ValueError("poisoned batch")
        return [f"done:{item}" for item in items]


def slots(costs: Sequence[int]) -> list[Slot]:
    call: Any = None
    return [Slot(call, i, c, i) for i, c in enumerate(costs)]


def test_batches_keep_to_the_token_budget_and_the_oldest_goes_first() -> None:
    rng = random.Random(7)
    for _ in range(500):
        window = slots([rng.randint(1, 300) for _ in range(rng.randint(1, 80))])
        size, budget = rng.randint(1, 32), rng.randint(1, 4096)
        batch = form_batch(window, size, budget)
        costs = [s.cost for s in batch]
        assert batch and window[0] in batch  # never empty; nothing starves behind newer work
        assert len(batch) <= size
        assert len(batch) == 1 or max(costs) * len(batch) <= budget
        assert costs == sorted(costs)  # length-sorted: small padding


def test_a_batch_fills_up_to_the_budget_with_neighbouring_lengths() -> None:
    # the oldest (100) and its shorter neighbours while 100 x n fits; the 300 never joins
    window = slots([100, 10, 11, 12, 300, 13, 99])
    assert [s.cost for s in form_batch(window, 32, 400)] == [12, 13, 99, 100]
    assert [s.cost for s in form_batch(window, 32, 500)] == [11, 12, 13, 99, 100]
    assert [s.cost for s in form_batch(window, 3, 10_000)] == [13, 99, 100]  # batch_size
    # the oldest is short: longer neighbours join while the padded cost fits
    assert [s.cost for s in form_batch(slots([10, 12, 30]), 32, 36)] == [10, 12]
    assert [s.cost for s in form_batch(slots([50, 60]), 32, 10)] == [50]  # over budget alone


def test_the_tightest_batch_pads_least_within_the_budget() -> None:
    """oldest=False: of the runs of batch_size neighbouring lengths, the one that pads
    least (here the three 20s, not the oldest 10's run); where no full run fits the budget,
    the oldest's run as before."""
    window = slots([10, 11, 20, 20, 20, 35, 36])
    assert [s.cost for s in form_batch(window, 3, 10_000, oldest=False)] == [20, 20, 20]
    assert [s.cost for s in form_batch(window, 2, 10_000, oldest=False)] == [20, 20]
    assert [s.cost for s in form_batch(window, 3, 50, oldest=False)] == [10, 11]  # none fit
    rng = random.Random(11)
    for _ in range(300):  # never over budget, never over batch_size, length-sorted
        window = slots([rng.randint(1, 300) for _ in range(rng.randint(1, 80))])
        size, budget = rng.randint(1, 32), rng.randint(1, 4096)
        costs = [s.cost for s in form_batch(window, size, budget, oldest=False)]
        assert costs and len(costs) <= size and costs == sorted(costs)
        assert len(costs) == 1 or max(costs) * len(costs) <= budget


async def test_the_oldest_input_waits_at_most_max_passes_batches() -> None:
    """A long input queued first, then many short ones: the tight batches of short inputs go
    first, but the long one is passed over at most MAX_PASSES times."""
    async with held(2, first="busy") as (runner, s, first):
        old = asyncio.create_task(s.submit(["long"], [90]))
        await until(lambda: s.waiting() == 1)
        shorts = [asyncio.create_task(s.submit([f"s{i}"], [5])) for i in range(20)]
        await until(lambda: s.waiting() == 21)
        runner.release.set()
        await asyncio.gather(first, old, *shorts)
    batches = runner.batches[1:]
    at = next(i for i, b in enumerate(batches) if "long" in b)
    assert at == MAX_PASSES  # passed over exactly MAX_PASSES times, then taken
    assert all(len(b) == 2 and "long" not in b for b in batches[:at])


@contextlib.asynccontextmanager
async def held(batch_size: int, first: str = "a") -> AsyncIterator[tuple[Recorder, Scheduler, Any]]:
    """A started scheduler whose forward thread holds its first batch (`first`) until
    runner.release is set; stopped on the way out."""
    runner = Recorder(hold_first=True)
    s = Scheduler(runner, name="t", batch_size=batch_size, max_batch_tokens=10_000)
    s.start()
    try:
        task = asyncio.create_task(s.submit([first], [1]))
        await asyncio.to_thread(runner.started.wait, 5)
        yield runner, s, task
    finally:
        s.stop()


async def until(condition: Callable[[], bool]) -> None:
    """Let the event loop run until `condition` holds (queued work, a stop), at most 5 s."""
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the scheduler never got there")


async def test_a_flooding_key_does_not_make_another_wait_behind_it() -> None:
    """Fair queuing: key A queues 64 requests of 16 inputs, then key B 2 of 16 (equal
    weights). B's inputs are served within the next batches, not after A's 1024."""
    rng = random.Random(5)  # lengths vary: a search by length alone would scatter B's inputs

    def costs() -> list[int]:
        return [rng.randint(5, 40) for _ in range(16)]

    async with held(16) as (runner, s, first):
        flood = [
            asyncio.create_task(s.submit([f"a{r}.{i}" for i in range(16)], costs(), tenant="A"))
            for r in range(64)
        ]
        await until(lambda: s.waiting() == 64 * 16)
        light = [
            asyncio.create_task(s.submit([f"b{r}.{i}" for i in range(16)], costs(), tenant="B"))
            for r in range(2)
        ]
        await until(lambda: s.waiting() == 66 * 16)
        runner.release.set()
        await asyncio.gather(first, *flood, *light)
    batches = runner.batches[1:]
    last_b = max(i for i, b in enumerate(batches) if any(str(x).startswith("b") for x in b))
    # equal shares: B's 32 inputs are done within 4 batches of 16 (half of each is B's)
    assert last_b < 5, [sum(str(x).startswith("b") for x in b) for b in batches[:8]]


async def test_weights_share_the_engines_tokens() -> None:
    """Keys of weights 3 and 1, both always waiting: the batches give them 3:1 of the tokens
    (counted over the time both had work queued)."""
    async with held(8) as (runner, s, first):
        heavy = asyncio.create_task(
            s.submit([f"h{i}" for i in range(600)], [10] * 600, tenant="H", weight=3)
        )
        light = asyncio.create_task(
            s.submit([f"l{i}" for i in range(600)], [10] * 600, tenant="L", weight=1)
        )
        await until(lambda: s.waiting() == 1200)
        runner.release.set()
        await asyncio.gather(first, heavy, light)
    served = [x for b in runner.batches[1:] for x in b]
    both = served[: served.index("h599") + 1]  # while the heavy key still had work
    h = sum(str(x).startswith("h") for x in both)
    l_ = sum(str(x).startswith("l") for x in both)
    assert h == 600 and abs(h / l_ - 3) <= 0.3, (h, l_)


async def test_one_key_alone_is_served_in_arrival_order() -> None:
    async with held(1) as (runner, s, first):
        calls = [asyncio.create_task(s.submit([f"c{i}"], [3], tenant="A")) for i in range(9)]
        await until(lambda: s.waiting() == 9)
        runner.release.set()
        await asyncio.gather(first, *calls)
    assert [b[0] for b in runner.batches[1:]] == [f"c{i}" for i in range(9)]


async def test_a_departed_callers_inputs_never_reach_the_model() -> None:
    async with held(8) as (runner, s, first):
        gone = asyncio.create_task(s.submit(["x", "y", "z"], [1, 1, 1]))
        stays = asyncio.create_task(s.submit(["b"], [1]))
        await until(lambda: s.waiting() == 4)
        gone.cancel()
        runner.release.set()
        assert await first == ["done:a"]
        assert await stays == ["done:b"]
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert runner.batches == [["a"], ["b"]]
        assert s.stats.dropped_inputs == 3
        assert runner.thread_name == "forward-t-0"  # one lane: the runner has no thread choice


async def test_live_inputs_go_before_background_ones_which_trickle_beside_them() -> None:
    async with held(16, first="busy") as (runner, s, first):
        lines = asyncio.create_task(
            s.submit([f"bg{i}" for i in range(16)], [1] * 16, background=True)
        )
        await until(lambda: s.waiting() == 16)
        live = asyncio.create_task(s.submit(["live"], [1]))
        await until(lambda: s.waiting() == 17)
        runner.release.set()
        await asyncio.gather(first, lines, live)
        order = runner.batches
        assert order[1] == ["live"]  # queued after the background line, served before it
        # live traffic was just seen: the background line goes in batches of 16 // 8
        assert [len(b) for b in order[2:]] == [2] * 8


async def test_a_failing_batch_fails_only_its_own_callers() -> None:
    async with held(1) as (runner, s, first):
        bad = asyncio.create_task(s.submit(["poison"], [1]))
        good = asyncio.create_task(s.submit(["c"], [1]))
        await until(lambda: s.waiting() == 2)
        runner.release.set()
        with pytest.raises(ValueError, match="poisoned"):
            await bad
        assert await first == ["done:a"]
        assert await good == ["done:c"]
        assert s.running  # the thread goes on


async def test_stopping_fails_what_is_queued_and_refuses_new_work() -> None:
    async with held(1) as (runner, s, first):
        queued = asyncio.create_task(s.submit(["b"], [1]))
        await until(lambda: s.waiting() == 1)
        assert s.waiting() == 1
        stopper = asyncio.create_task(asyncio.to_thread(s.stop))
        await until(lambda: not s.running)  # stopping: the queue is failed, none taken
        runner.release.set()
        await stopper
        assert await first == ["done:a"]  # the running batch finishes
        with pytest.raises(EngineStopped):
            await queued
        with pytest.raises(EngineStopped):
            await s.submit(["c"], [1])
        assert not s.running


def test_a_request_that_meets_a_stopped_engine_gets_a_503_to_retry() -> None:
    from openai_compat.ground.errors import ServiceUnavailable
    from openai_compat.inference.embed import engine_errors

    with pytest.raises(ServiceUnavailable) as caught, engine_errors():
        raise EngineStopped("model 't' was stopped")
    assert caught.value.status == 503
    assert caught.value.headers == {"Retry-After": "1"}


# ---------------------------------------------------------------- the thread count (threads.py)


class CpuModel:
    """A fake clock and a CPU whose speed per thread count the test sets: a batch of T padded
    tokens on n threads takes T / rate[n] seconds of the clock."""

    def __init__(self, rate: dict[int, float]) -> None:
        self.rate, self.now = rate, 0.0

    def clock(self) -> float:
        return self.now

    def run(self, threads: int, tokens: int) -> None:
        self.now += tokens / self.rate[threads]


def drive(tuner: ThreadTuner, cpu: CpuModel, batches: int, tokens: int = 1000) -> list[int]:
    used = []
    for _ in range(batches):
        n = tuner.start()
        cpu.run(n, tokens)
        tuner.done(tokens)
        used.append(n)
    return used


def test_the_thread_count_follows_what_each_count_measures() -> None:
    """Quiet, two threads are faster and are kept; a neighbour takes a core (two threads now
    wait at every barrier for the taken one): the fall is noticed within a few batches, one
    thread is measured faster and kept; the neighbour leaves: the next exploration goes back."""
    cpu = CpuModel({2: 1600.0, 1: 1000.0})
    tuner = ThreadTuner(2, explore_every=20, trial=3, clock=cpu.clock)
    assert tuner.options == (2, 1)
    first = drive(tuner, cpu, 6)
    assert first == [2, 2, 2, 1, 1, 1]  # the first exploration: each count, back to back
    assert tuner.chosen == 2 and drive(tuner, cpu, 15) == [2] * 15  # not yet due again
    cpu.rate = {2: 300.0, 1: 900.0}  # the neighbour arrives
    used = drive(tuner, cpu, 12)
    assert used[:3] == [2, 2, 2]  # the fall is sustained over `trial` batches
    assert used[3:9] == [2, 2, 2, 1, 1, 1] and tuner.chosen == 1  # explored early, at once
    assert used[9:] == [1, 1, 1]
    cpu.rate = {2: 1600.0, 1: 1000.0}  # it leaves: one thread is not slower, no early trigger
    used = drive(tuner, cpu, 40)
    assert tuner.chosen == 2 and used[-5:] == [2] * 5
    assert 1 in used[:20]  # one thread kept until the regular exploration found two faster


def test_the_largest_count_is_not_explored_again_while_it_keeps_its_rate() -> None:
    """A lone client's batches on fewer threads are its slowest: while every thread is the
    fastest and its rate holds, no exploration runs them (they were its p99)."""
    cpu = CpuModel({2: 1600.0, 1: 1000.0})
    tuner = ThreadTuner(2, explore_every=20, trial=3, clock=cpu.clock)
    assert drive(tuner, cpu, 6) == [2, 2, 2, 1, 1, 1] and tuner.chosen == 2
    assert drive(tuner, cpu, 500) == [2] * 500 and tuner.explorations == 1
    cpu.rate = {2: 700.0, 1: 1000.0}  # the fall below 0.6x is still noticed
    used = drive(tuner, cpu, 9)
    assert used == [2, 2, 2, 2, 2, 2, 1, 1, 1] and tuner.chosen == 1


def test_one_cpu_is_one_thread_and_nothing_is_measured() -> None:
    cpu = CpuModel({1: 1000.0})
    tuner = ThreadTuner(1, clock=cpu.clock)
    assert not tuner.active and drive(tuner, cpu, 100) == [1] * 100
    assert tuner.explorations == 0
    assert candidates(2) == (2, 1) and candidates(4) == (4, 3, 2, 1)
    assert candidates(16) == (16, 8, 1)


class TunableRecorder(Recorder):
    """A runner whose forward pass may run on 1 or 2 threads; records each count it is given
    and advances a fake CPU clock by the batch's tokens at that count's rate."""

    def __init__(self, cpu: CpuModel) -> None:
        super().__init__()
        self.cpu, self.threads, self.given = cpu, 0, []

    def tunable_threads(self) -> int:
        return 2

    def set_threads(self, count: int) -> None:
        self.given.append(count)
        self.threads = count

    def run(self, items: Sequence[Any]) -> list[Any]:
        self.cpu.run(self.threads, 100 * len(items))
        return super().run(items)


async def test_the_scheduler_runs_each_batch_on_the_tuners_count() -> None:
    cpu = CpuModel({2: 300.0, 1: 900.0})  # a busy neighbour: one thread is faster
    runner = TunableRecorder(cpu)
    tuner = ThreadTuner(2, explore_every=10, trial=2, clock=cpu.clock)
    s = Scheduler(runner, name="t", batch_size=1, max_batch_tokens=10_000, tuner=tuner)
    s.start()
    try:
        for i in range(8):
            await s.submit([f"x{i}"], [100])
    finally:
        await asyncio.to_thread(s.stop)
    # the runner's count changes only when the tuner's does: 2 (trials), 1 (trials), 1 (kept)
    assert runner.given == [2, 1] and tuner.chosen == 1
    # a runner without a choice (tunable_threads absent or 1) is never told a count
    assert Scheduler(Recorder(), name="u", batch_size=1, max_batch_tokens=1).tuner is None


def test_a_runner_is_told_every_thread_count_it_may_be_given_before_any_batch() -> None:
    """prepare_threads: a runner that holds something per thread count (an ONNX export's
    session per count) is given, at construction, the tuner's candidates and the lanes'
    share: what the model pool's load measurement then covers."""

    class Preparing(TunableRecorder):
        def tunable_threads(self) -> int:
            return 8

        def prepare_threads(self, counts: Sequence[int]) -> None:
            self.prepared = list(counts)

    runner = Preparing(CpuModel({}))
    Scheduler(runner, name="p", batch_size=1, max_batch_tokens=1, lanes=3)
    assert runner.prepared == [1, 2, 4, 8] and runner.given == []  # 8 // 3 lanes: 2 each
    fixed = Preparing(CpuModel({}))
    fixed.tunable_threads = lambda: 1  # type: ignore[method-assign]
    Scheduler(fixed, name="f", batch_size=1, max_batch_tokens=1)
    assert not hasattr(fixed, "prepared")  # a fixed count: nothing to prepare


class LaneRecorder(Recorder):
    """A runner on two tunable threads whose count is per thread, as torch's is: records, for
    each batch, the count its lane gave and the items running beside it when it started.
    Items in `together` wait at a barrier until both are in the runner at once."""

    def __init__(self, together: set[str]) -> None:
        super().__init__(hold_first=True)
        self.local = threading.local()
        self.lock = threading.Lock()
        self.running: list[Any] = []
        self.seen: dict[Any, tuple[int, list[Any]]] = {}
        self.together, self.barrier = together, threading.Barrier(2, timeout=5)

    def tunable_threads(self) -> int:
        return 2

    def set_threads(self, count: int) -> None:
        self.local.threads = count

    def run(self, items: Sequence[Any]) -> list[Any]:
        with self.lock:
            for item in items:
                self.seen[item] = (getattr(self.local, "threads", 0), list(self.running))
            self.running += list(items)
        try:
            if self.together & set(items):
                self.barrier.wait()  # BrokenBarrierError unless the other lane runs too
                return [f"done:{item}" for item in items]
            return super().run(items)
        finally:
            with self.lock:
                for item in items:
                    self.running.remove(item)


async def test_two_lanes_share_the_cpu_under_load_and_a_lone_batch_takes_it_all() -> None:
    """Two CPUs: a batch formed with nothing else to do runs alone on both threads (the
    tuner's count) and holds the other lane; batches formed with work left run side by
    side, one thread each; a call split over both lanes gets every result in its order; a
    lone batch soon after the lanes ran side by side stays narrow (under load the queue
    empties between a response and the next request), and goes wide once LOADED_S passed."""
    runner = LaneRecorder(together={"b0", "c0", "s0", "s2"})
    tuner = ThreadTuner(2, explore_every=10**9)
    tuner.explorations = 1  # measured already: two threads
    now = [10.0]
    s = Scheduler(
        runner,
        name="t",
        batch_size=2,
        max_batch_tokens=10_000,
        tuner=tuner,
        lanes=2,
        clock=lambda: now[0],
    )
    assert (s.lanes, s.narrow) == (2, 1)
    s.start()
    try:
        lone = asyncio.create_task(s.submit(["a"], [1]))
        await asyncio.to_thread(runner.started.wait, 5)  # "a" is held in the runner
        b = asyncio.create_task(s.submit(["b0", "b1"], [1, 1]))
        c = asyncio.create_task(s.submit(["c0", "c1"], [5, 5]))  # a batch of their own
        await until(lambda: s.waiting() == 4)
        runner.release.set()
        assert await asyncio.gather(lone, b, c) == [
            ["done:a"],
            ["done:b0", "done:b1"],
            ["done:c0", "done:c1"],
        ]
        # a lone batch on the tuner's two threads, and nothing beside it while it ran
        assert runner.seen["a"] == (2, [])
        # then both lanes at once (the barrier passed) on one thread each
        assert runner.seen["b0"][0] == runner.seen["c0"][0] == 1
        assert "a" not in runner.seen["b0"][1] + runner.seen["c0"][1]
        split = await s.submit(["s0", "s1", "s2", "s3"], [1, 1, 9, 9])
        assert split == ["done:s0", "done:s1", "done:s2", "done:s3"]
        # (a caller is answered before its lane is marked free, scheduler._run: wait for
        # the lanes to be free, or "w" may find one still running and go narrow)
        await until(lambda: s._running == 0)
        now[0] += LOADED_S / 2
        assert await s.submit(["n"], [1]) == ["done:n"]
        await until(lambda: s._running == 0)
        now[0] += LOADED_S
        assert await s.submit(["w"], [1]) == ["done:w"]
        assert (runner.seen["n"][0], runner.seen["w"][0]) == (1, 2)
        assert s.stats.batches == 7 and s.stats.inputs == 11
    finally:
        await asyncio.to_thread(s.stop)
    assert Scheduler(Recorder(), name="u", batch_size=1, max_batch_tokens=1).lanes == 1


def test_the_preparation_queue_takes_keys_in_fair_order() -> None:
    """engine/prep.py: a key with five requests waiting to be tokenized does not put another
    key's request behind all of them."""
    from openai_compat.engine.prep import FairPrep

    prep = FairPrep("t")
    gate, order = threading.Event(), []
    held = prep.submit("A", 1.0, 1, gate.wait, 5)  # holds the thread
    jobs = [prep.submit("A", 1.0, 16, order.append, f"a{i}") for i in range(5)]
    jobs.append(prep.submit("B", 1.0, 16, order.append, "b0"))
    gate.set()
    for job in [held, *jobs]:
        job.result(5)
    prep.shutdown()
    assert order == ["b0", "a0", "a1", "a2", "a3", "a4"]


async def test_a_key_that_drops_its_inputs_is_not_charged_for_them() -> None:
    """Key A abandons a 256-input request (an SDK timeout) while key B floods; A's next
    one-input request is served among B's next batches, not after B's flood as if A's
    dropped inputs had run (its finish tag moved back by their share)."""
    async with held(8) as (runner, s, first):
        abandoned = asyncio.create_task(
            s.submit([f"x{i}" for i in range(256)], [1] * 256, tenant="A")
        )
        flood = asyncio.create_task(s.submit([f"b{i}" for i in range(256)], [1] * 256, tenant="B"))
        await until(lambda: s.waiting() == 512)
        abandoned.cancel()
        await until(lambda: s.waiting() == 256)  # withdrawn at once, not at formation
        after = asyncio.create_task(s.submit(["a-next"], [1], tenant="A"))
        await until(lambda: s.waiting() == 257)
        runner.release.set()
        await asyncio.gather(first, flood, after)
    batches = runner.batches[1:]
    served_in = next(i for i, b in enumerate(batches) if "a-next" in b)
    assert served_in <= 1, served_in  # charged for the 256 it dropped: batch 32 of 33
    assert s.stats.dropped_inputs == 256
    assert not any(str(x).startswith("x") for b in batches for x in b)


def test_a_cancelled_preparation_job_is_not_charged_to_its_key() -> None:
    from openai_compat.engine.prep import FairPrep

    prep = FairPrep("t")
    gate, order = threading.Event(), []
    held_job = prep.submit("A", 1.0, 1, gate.wait, 5)  # holds the thread
    dropped = prep.submit("A", 1.0, 1000, order.append, "dropped")
    floods = [prep.submit("B", 1.0, 16, order.append, f"b{i}") for i in range(3)]
    assert dropped.cancel()
    kept = prep.submit("A", 1.0, 16, order.append, "a")  # not behind 1000 of A's
    gate.set()
    for job in [held_job, *floods, kept]:
        job.result(5)
    prep.shutdown()
    assert order == ["b0", "a", "b1", "b2"]
