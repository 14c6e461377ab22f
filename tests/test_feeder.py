"""engine/infinity/feeder.py on a scripted engine: waves, length-sorted chunks, gathering, the
window, cancellation and errors. Each engine call waits until the test releases it, so the order of
events is the test's, not the machine's speed."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from openai_compat.engine.infinity import feeder as feeder_module
from openai_compat.engine.infinity.feeder import Feeder
from openai_compat.engine.usage import TokenCountedArray
from openai_compat.ground.errors import ServiceUnavailable


class ScriptedEngine:
    """embed(texts) records the call and waits until `finish(n)` lets it return; a text's
    vector is [its length, its number], numbers taken from the text's trailing digits."""

    def __init__(self, tokens: bool = False) -> None:
        self.calls: list[list[str]] = []
        self._gates: list[asyncio.Event] = []
        self.fail: set[int] = set()  # call numbers that raise
        self.cancelled: list[int] = []  # call numbers cancelled while waiting
        self.tokens = tokens

    async def embed(self, texts: list[str]) -> tuple[list[Any], int]:
        n = len(self.calls)
        self.calls.append(list(texts))
        gate = asyncio.Event()
        self._gates.append(gate)
        try:
            await gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(n)
            raise
        if n in self.fail:
            raise RuntimeError(f"engine call {n} failed")
        vectors: list[Any] = []
        for t in texts:
            v = np.array([len(t), number(t)], dtype=np.float32)
            if self.tokens:
                v = v.view(TokenCountedArray)
                v.tokens = len(t.split())
            vectors.append(v)
        return vectors, sum(len(t) for t in texts)

    def finish(self, n: int) -> None:
        self._gates[n].set()


def number(text: str) -> int:
    digits = "".join(c for c in text if c.isdigit())
    return int(digits) if digits else -1


class Clock:
    """The feeder's perf_counter, moved by the test (wave times, the quiet period)."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """Every test runs on the fake clock: the gathering pause is sized from measured wave
    times, and on a busy machine real ones made waves form later than the test's settle()."""
    fake = Clock()
    monkeypatch.setattr(feeder_module, "time", fake)
    return fake


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def busy(feeder: Feeder) -> asyncio.Future[Any]:
    """A first call, now in the engine until the test finishes engine call 0."""
    blocker = asyncio.ensure_future(feeder.embed(["x 0"]))
    await settle()
    return blocker


def texts(prefix: str, lengths: list[int], start: int) -> list[str]:
    """Texts of the given extra lengths, each ending in a unique number."""
    return [prefix + "x" * extra + f" {start + i}" for i, extra in enumerate(lengths)]


def check(result: tuple[list[Any], int], sent: list[str]) -> None:
    vectors, usage = result
    assert [int(v[1]) for v in vectors] == [number(t) for t in sent]  # own inputs, own order
    assert [int(v[0]) for v in vectors] == [len(t) for t in sent]
    assert usage == sum(len(t) for t in sent)  # infinity-emb's estimate: characters


async def test_a_lone_call_goes_straight_to_the_engine() -> None:
    engine = ScriptedEngine()
    feeder = Feeder(engine, batch_size=4)
    sent = texts("a", [3, 1, 2], 0)
    task = asyncio.ensure_future(feeder.embed(sent))
    await settle()
    assert engine.calls == [sorted(sent, key=len)]  # one chunk, sorted like infinity-emb
    engine.finish(0)
    check(await task, sent)


async def test_calls_arriving_during_a_wave_wait_and_go_together_sorted_in_full_batches() -> None:
    engine = ScriptedEngine()
    feeder = Feeder(engine, batch_size=4)
    first = asyncio.ensure_future(feeder.embed(texts("a", [0], 0)))
    await settle()
    assert len(engine.calls) == 1
    later = [texts("b", [5, 0, 9], 10), texts("c", [2, 7], 20), texts("d", [1, 8, 3], 30)]
    tasks = [asyncio.ensure_future(feeder.embed(t)) for t in later]
    await settle()
    assert len(engine.calls) == 1 and feeder.waiting == 8  # held while the engine works
    engine.finish(0)
    check(await first, texts("a", [0], 0))
    await settle()
    # one wave: all 8 inputs sorted by length, cut at the batch size, handed over at once
    everything = sorted((t for group in later for t in group), key=len)
    assert engine.calls[1:] == [everything[:4], everything[4:]]
    assert feeder.waiting == 0
    engine.finish(1)
    await settle()
    # the shortest chunk holds the whole of no call: nobody is answered yet
    assert not any(t.done() for t in tasks)
    engine.finish(2)
    for task, sent in zip(tasks, later, strict=True):
        check(await task, sent)


async def test_a_call_is_answered_when_its_own_chunks_are_done() -> None:
    engine = ScriptedEngine()
    feeder = Feeder(engine, batch_size=2)
    blocker = await busy(feeder)
    short = texts("s", [0, 0], 10)
    long = texts("l", [20, 20], 20)
    t_short = asyncio.ensure_future(feeder.embed(short))
    t_long = asyncio.ensure_future(feeder.embed(long))
    engine.finish(0)
    await blocker
    await settle()
    assert engine.calls[1:] == [short, long]
    engine.finish(1)
    check(await t_short, short)
    assert not t_long.done()
    engine.finish(2)
    check(await t_long, long)


async def test_the_next_wave_gathers_the_callers_expected_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four clients in a loop: whoever was answered, and whoever waited meanwhile, is
    expected in the next wave; it goes when they are all here (not one by one)."""
    engine = ScriptedEngine()
    feeder = Feeder(engine, batch_size=8)
    monkeypatch.setattr(feeder, "_pause", lambda: 30.0)  # only the count releases here
    first = asyncio.ensure_future(feeder.embed(["a 0"]))
    await settle()
    others = [asyncio.ensure_future(feeder.embed([f"{c} 0"])) for c in "bcd"]
    engine.finish(0)
    await first
    await settle()
    assert len(engine.calls) == 1  # b, c, d wait for a, whose answer just left
    again = asyncio.ensure_future(feeder.embed(["a 1"]))
    await settle()
    assert len(engine.calls) == 2 and sorted(engine.calls[1]) == ["a 1", "b 0", "c 0", "d 0"]
    engine.finish(1)
    await asyncio.gather(again, *others)
    back = [asyncio.ensure_future(feeder.embed(["a 2"]))]
    await settle()
    assert len(engine.calls) == 2  # one of four is back: wait for the rest
    back += [asyncio.ensure_future(feeder.embed([f"{c} 2"])) for c in "bc"]
    await settle()
    assert len(engine.calls) == 2
    back.append(asyncio.ensure_future(feeder.embed(["d 2"])))
    await settle()
    assert len(engine.calls) == 3 and len(engine.calls[2]) == 4
    engine.finish(2)
    await asyncio.gather(*back)


async def test_a_missing_caller_costs_at_most_the_gathering_pause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = ScriptedEngine()
    feeder = Feeder(engine, batch_size=8)
    monkeypatch.setattr(feeder, "_pause", lambda: 0.05)
    blocker = await busy(feeder)
    pair = [asyncio.ensure_future(feeder.embed([f"p {i}"])) for i in (1, 2)]
    engine.finish(0)
    await blocker
    await settle()
    assert len(engine.calls) == 1  # waiting for the blocker's client to come back...
    await asyncio.sleep(0.3)  # ...which it does not: only for the pause
    assert len(engine.calls) == 2 and sorted(engine.calls[1]) == ["p 1", "p 2"]
    engine.finish(1)
    for task, i in zip(pair, (1, 2), strict=True):
        check(await task, [f"p {i}"])


async def test_a_full_window_starts_a_second_wave_but_never_a_third() -> None:
    engine = ScriptedEngine()
    feeder = Feeder(engine, batch_size=1)  # window = 8 inputs
    window = 1 * feeder_module.WINDOW_BATCHES
    first = asyncio.ensure_future(feeder.embed(["x 0"]))
    await settle()
    second = asyncio.ensure_future(feeder.embed(texts("b", [0] * window, 100)))
    await settle()
    assert len(engine.calls) == 1 + window  # a full window did not wait for the first wave
    third = asyncio.ensure_future(feeder.embed(texts("c", [0] * window, 200)))
    await settle()
    assert len(engine.calls) == 1 + window and feeder.waiting == window  # two waves at most
    engine.finish(0)
    await first
    await settle()
    assert len(engine.calls) == 1 + 2 * window
    for n in range(1, len(engine.calls)):
        engine.finish(n)
    check(await second, texts("b", [0] * window, 100))
    check(await third, texts("c", [0] * window, 200))


async def test_a_cancelled_waiting_call_never_reaches_the_engine() -> None:
    engine = ScriptedEngine()
    feeder = Feeder(engine, batch_size=4)
    blocker = await busy(feeder)
    gone = asyncio.ensure_future(feeder.embed(["gone 1"]))
    kept = asyncio.ensure_future(feeder.embed(["kept 2"]))
    await settle()
    gone.cancel()
    await settle()
    assert feeder.waiting == 1
    engine.finish(0)
    await blocker
    await settle()
    assert engine.calls[1:] == [["kept 2"]]
    engine.finish(1)
    check(await kept, ["kept 2"])


async def test_a_cancelled_released_call_leaves_its_chunk_to_the_others() -> None:
    engine = ScriptedEngine()
    feeder = Feeder(engine, batch_size=4)
    blocker = await busy(feeder)
    a = asyncio.ensure_future(feeder.embed(["a 1"]))
    b = asyncio.ensure_future(feeder.embed(["b 2"]))
    engine.finish(0)
    await blocker
    await settle()
    assert sorted(engine.calls[1]) == ["a 1", "b 2"]
    a.cancel()
    await settle()
    engine.finish(1)
    check(await b, ["b 2"])
    after = asyncio.ensure_future(feeder.embed(["c 3"]))  # the feeder is not stuck
    await settle()
    engine.finish(2)
    check(await after, ["c 3"])


async def test_chunks_only_a_cancelled_call_waits_for_are_cancelled_in_the_engine() -> None:
    """A client that gives up leaves no work behind (infinity-emb skips the queued inputs of
    a cancelled engine call); chunks shared with a live call run on."""
    engine = ScriptedEngine()
    feeder = Feeder(engine, batch_size=2)
    blocker = await busy(feeder)
    gone = asyncio.ensure_future(feeder.embed(["g 1", "g 2", "g 3", "g 4", "glong 5"]))
    kept = asyncio.ensure_future(feeder.embed(["keptlong 6"]))
    engine.finish(0)
    await blocker
    await asyncio.sleep(0.1)  # the pause for the blocker's client, who does not come back
    # sorted: [g 1, g 2] [g 3, g 4] [glong 5, keptlong 6]
    assert engine.calls[1:] == [["g 1", "g 2"], ["g 3", "g 4"], ["glong 5", "keptlong 6"]]
    gone.cancel()
    await settle()
    assert engine.cancelled == [1, 2]  # its own chunks; the shared one runs on
    engine.finish(3)
    check(await kept, ["keptlong 6"])
    after = asyncio.ensure_future(feeder.embed(["next 7"]))  # the wave ended: not stuck
    await asyncio.sleep(0.1)  # (the pause: two callers were expected back)
    assert engine.calls[-1] == ["next 7"]
    engine.finish(4)
    await after


async def test_an_engine_error_reaches_the_calls_of_that_chunk_only() -> None:
    engine = ScriptedEngine()
    engine.fail = {1}
    feeder = Feeder(engine, batch_size=2)
    blocker = await busy(feeder)
    short = asyncio.ensure_future(feeder.embed(["s 1", "s 2"]))
    long = asyncio.ensure_future(feeder.embed(["long 3", "long 4"]))
    engine.finish(0)
    await blocker
    await settle()
    engine.finish(1)
    engine.finish(2)
    with pytest.raises(RuntimeError, match="engine call 1 failed"):
        await short
    check(await long, ["long 3", "long 4"])


async def test_usage_is_the_engines_token_count_where_it_keeps_one() -> None:
    engine = ScriptedEngine(tokens=True)
    feeder = Feeder(engine, batch_size=4)
    task = asyncio.ensure_future(feeder.embed(["one two 1", "three 2"]))
    await settle()
    engine.finish(0)
    vectors, usage = await task
    assert [v.tokens for v in vectors] == [3, 2] and usage == 5  # not 16 characters


async def test_close_fails_the_waiting_calls() -> None:
    engine = ScriptedEngine()
    feeder = Feeder(engine, batch_size=4)
    blocker = await busy(feeder)
    waiting = asyncio.ensure_future(feeder.embed(["w 1"]))
    await settle()
    feeder.close()
    with pytest.raises(ServiceUnavailable, match="shutting down") as refused:
        await waiting
    assert refused.value.status == 503  # retryable, not a server fault
    engine.finish(0)
    await blocker


def test_the_pause_is_a_small_part_of_the_recent_wave_time() -> None:
    feeder = Feeder(ScriptedEngine(), batch_size=4)
    feeder._wave_s = 0.1
    assert feeder._pause() == pytest.approx(0.1 * feeder_module.GATHER_FRACTION)
    feeder._wave_s = 60.0
    assert feeder._pause() == feeder_module.GATHER_MAX_S


async def test_an_empty_call_is_answered_without_the_engine() -> None:
    engine = ScriptedEngine()
    assert await Feeder(engine, batch_size=4).embed([]) == ([], 0)
    assert engine.calls == []


async def test_background_calls_never_share_a_wave_with_live_ones() -> None:
    """Batch API lines (background) never share a wave with live calls; one background wave
    runs beside live ones, and a live call may start while a background wave runs."""
    engine = ScriptedEngine()
    feeder = Feeder(engine, batch_size=8)
    with feeder_module.background():
        bulk = asyncio.ensure_future(feeder.embed(["bulk 1", "bulk 2"]))
    await settle()
    assert engine.calls == [["bulk 1", "bulk 2"]]  # nothing live: it goes
    live = asyncio.ensure_future(feeder.embed(["live 3"]))
    await settle()
    assert engine.calls[1:] == [["live 3"]]  # not held behind the background wave
    with feeder_module.background():
        more = asyncio.ensure_future(feeder.embed(["bulk 4"]))
    later_live = asyncio.ensure_future(feeder.embed(["live 5"]))
    await settle()
    assert len(engine.calls) == 2 and feeder.waiting == 2  # both wait: two waves run
    engine.finish(0)  # the background wave ends: the next goes beside the live wave
    await bulk
    await settle()
    assert engine.calls[2:] == [["bulk 4"]]  # steady live traffic does not starve the job
    engine.finish(1)
    await live
    await asyncio.sleep(0.05)  # (the gathering pause)
    assert engine.calls[3:] == [["live 5"]]  # in its own wave, never mixed with bulk 4
    engine.finish(2)
    engine.finish(3)
    check(await more, ["bulk 4"])
    check(await later_live, ["live 5"])


async def test_beside_live_traffic_a_background_wave_trickles_small_chunks(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    """While live calls run (or arrived within QUIET_S) a background wave keeps one small
    chunk in the engine, shortest first, so a live call that arrives waits behind at most
    that chunk; once live traffic is quiet the rest goes in full batches at once."""
    monkeypatch.setattr(feeder_module, "QUIET_S", 3600.0)  # the test says when it is quiet
    monkeypatch.setattr(feeder_module, "TRICKLE_S", 0.025)
    engine = ScriptedEngine()
    feeder = Feeder(engine, batch_size=16)  # chunks of 16 / 8 = 2 until a wave is timed
    live = asyncio.ensure_future(feeder.embed(["live 0"]))
    await settle()
    bulk_texts = texts("b", [5, 0, 4, 1, 3, 2, 7, 6], 10)
    with feeder_module.background():
        bulk = asyncio.ensure_future(feeder.embed(bulk_texts))
    await settle()
    by_length = sorted(bulk_texts, key=len)
    assert engine.calls[1:] == [by_length[:2]]  # one small chunk, not a batch of 8
    clock.now = 0.0125  # the live wave took 12.5 ms for its input: 2 inputs make 25 ms
    engine.finish(0)
    check(await live, ["live 0"])
    engine.finish(1)
    await settle()
    # the live wave is over, but a live call came within QUIET_S: still trickling
    assert engine.calls[2:] == [by_length[2:4]]
    later = asyncio.ensure_future(feeder.embed(["live 99"]))
    await settle()
    assert engine.calls[3:] == [["live 99"]]  # beside the one small background chunk
    clock.now += 0.0125  # the same speed again
    engine.finish(3)
    check(await later, ["live 99"])
    monkeypatch.setattr(feeder_module, "QUIET_S", 0.0)  # live traffic has gone quiet
    engine.finish(2)
    await settle()
    assert engine.calls[4:] == [by_length[4:]]  # all that is left, in one full batch
    engine.finish(4)
    check(await bulk, bulk_texts)


async def test_with_no_live_traffic_a_background_wave_goes_in_full_batches() -> None:
    engine = ScriptedEngine()
    feeder = Feeder(engine, batch_size=4)
    bulk_texts = texts("b", [3, 0, 2, 1, 5, 4], 0)
    with feeder_module.background():
        bulk = asyncio.ensure_future(feeder.embed(bulk_texts))
    await settle()
    by_length = sorted(bulk_texts, key=len)
    assert engine.calls == [by_length[:4], by_length[4:]]  # both batches at once
    engine.finish(0)
    engine.finish(1)
    check(await bulk, bulk_texts)


async def test_a_cancelled_background_call_is_not_trickled_on(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    monkeypatch.setattr(feeder_module, "QUIET_S", 3600.0)
    engine = ScriptedEngine()
    feeder = Feeder(engine, batch_size=8)  # trickle chunks of 1
    live = asyncio.ensure_future(feeder.embed(["live 0"]))
    await settle()
    with feeder_module.background():
        gone = asyncio.ensure_future(feeder.embed(texts("g", [0, 1, 2], 10)))
        kept = asyncio.ensure_future(feeder.embed(texts("k", [5], 20)))
    await settle()
    assert engine.calls[1:] == [["g 10"]]  # one wave of both calls, shortest input first
    gone.cancel()
    await settle()
    assert engine.cancelled == [1]  # that chunk held only the cancelled call's input
    await settle()
    assert engine.calls[2:] == [["kxxxxx 20"]]  # g 11 and g 12 never reach the engine
    engine.finish(2)
    check(await kept, ["kxxxxx 20"])
    engine.finish(0)
    await live


async def test_the_trickle_follows_the_engines_measured_speed(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    """Chunks of about TRICKLE_S of engine time: a fast engine gets larger chunks, a slow one
    single inputs; a trickled (paced) wave's own duration does not count as engine speed."""
    monkeypatch.setattr(feeder_module, "QUIET_S", 3600.0)
    monkeypatch.setattr(feeder_module, "TRICKLE_S", 0.025)
    engine = ScriptedEngine()
    feeder = Feeder(engine, batch_size=64)
    fast = asyncio.ensure_future(feeder.embed(texts("f", [0] * 10, 0)))
    await settle()
    clock.now = 0.005  # 10 inputs in 5 ms: 0.5 ms an input -> chunks of 50
    engine.finish(0)
    await fast
    live = asyncio.ensure_future(feeder.embed(["live 0"]))
    await settle()
    bulk_texts = texts("b", list(range(60)), 100)
    with feeder_module.background():
        bulk = asyncio.ensure_future(feeder.embed(bulk_texts))
    await settle()
    assert [len(c) for c in engine.calls[2:]] == [50]
    clock.now += 10.0  # the trickled wave's time is ours, not the engine's
    engine.finish(2)
    await settle()
    assert [len(c) for c in engine.calls[3:]] == [10]  # the rest, still 50 at most
    engine.finish(3)
    check(await bulk, bulk_texts)
    clock.now += 0.2  # the live wave: 1 input in 10.2 s (it waited behind the bulk)
    engine.finish(1)
    await live
    assert feeder._trickle() == 1  # the engine now looks slow: one input at a time


class ShortEngine(ScriptedEngine):
    """Answers one vector too few for its first call (an engine fault)."""

    async def embed(self, texts: list[str]) -> tuple[list[Any], int]:
        vectors, usage = await super().embed(texts)
        return (vectors[:-1] if len(self.calls) == 1 else vectors), usage


async def test_an_engine_answering_the_wrong_count_fails_its_callers_and_frees_the_wave() -> None:
    from openai_compat.ground.errors import ModelOutputError

    engine = ShortEngine()
    feeder = Feeder(engine, batch_size=4)
    first = asyncio.ensure_future(feeder.embed(texts("a", [1, 2], 0)))
    await settle()
    engine.finish(0)
    with pytest.raises(ModelOutputError) as info:
        await asyncio.wait_for(first, timeout=5)  # never a hang
    assert info.value.code == "engine_output_mismatch"
    second = asyncio.ensure_future(feeder.embed(texts("b", [3], 10)))  # the slot is free
    await settle()
    engine.finish(1)
    check(await asyncio.wait_for(second, timeout=5), texts("b", [3], 10))


async def test_a_chunk_the_engine_cancels_is_a_503_not_the_callers_cancellation() -> None:
    engine = ScriptedEngine()
    feeder = Feeder(engine, batch_size=4)
    task = asyncio.ensure_future(feeder.embed(texts("a", [1, 2], 0)))
    await settle()
    (chunk,) = next(iter(feeder._waves)).members  # the engine call in flight
    chunk.cancel()  # the engine stops under it (the caller did not ask to stop)
    with pytest.raises(ServiceUnavailable):
        await asyncio.wait_for(task, timeout=5)
    assert not task.cancelled()
