"""Feeding a model's embed calls to infinity-emb in length-sorted waves.

infinity-emb batches whatever sits in its queue when its publishing thread looks, and that
thread looks as soon as anything arrives. In-process callers that await together also submit
together, so their inputs are sorted by length and cut into full batches. Over HTTP the same
callers arrive a few milliseconds apart (each response travels back, each new request is
parsed), so on a busy CPU every request became its own small batch padded to its own longest
input: at 16 inputs x 4 clients on all-MiniLM-L6-v2 that is 4 batches of 16 at 19 tokens
instead of 2 of 32 at 13 and 19 tokens, 20% fewer sentences per second than the same engine
in-process (docs/benchmarks.md).

The feeder restores what the in-process caller gets, and a little more:
- While the engine works on a wave, new calls wait here, until the wave is done or a full
  window (8 batches, infinity-emb's own sorting window) is waiting; then everything that
  waited (up to a window) is released as the next wave, so at most two waves are in the
  engine and a fast engine is never left idle under heavy load. A wave's inputs are
  sorted by length (infinity-emb's own key, so its re-sorting agrees) and cut into chunks of
  the batch size, each chunk one engine call, all handed over in the same instant. Each call
  returns as soon as the chunks holding its inputs are done.
- Gathering: a wave is released once as many calls are waiting as the previous wave held
  plus those that waited during it (clients whose answers just left are about to come
  back), or after a short pause (5% of
  the recent wave time, at most 10 ms), or at once when a window is full. A lone client
  never waits: its previous wave held one call.

Background calls (Batch API lines: `background()` around their dispatch) never share a wave
with live ones; live calls are considered first, one background wave may run beside a live
one (so steady live traffic cannot starve a batch job), and a live wave may start while a
background wave runs. A background wave hands the engine all its chunks at once only when
no live call has arrived for QUIET_S; otherwise it trickles: one chunk in the engine at a
time, each sized when it goes to about TRICKLE_S of engine time (from the seconds per input
of recent unpaced waves; batch/8 inputs before any), so a live request waits behind at most
that much background work, not behind a whole wave of a job's lines.

Calls are never split across waves or reordered between waves. A cancelled call that has
not been released is dropped; once released, the chunks that hold only inputs of cancelled
calls are cancelled too (infinity-emb then skips their queued inputs), the others run on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from openai_compat.engine.priority import _BACKGROUND, background, in_background
from openai_compat.engine.usage import engine_token_count, length_estimate
from openai_compat.ground.errors import ModelOutputError, ServiceUnavailable

__all__ = ["Feeder", "background", "in_background"]

GATHER_FRACTION = 0.05  # of the recent wave time
GATHER_MAX_S = 0.010
WINDOW_BATCHES = 8  # infinity-emb sorts up to 8 batches at a time (pop_optimal_batches)
MAX_WAVES = 2
QUIET_S = 0.5  # no live call for this long: background waves use full batches again
TRICKLE_S = 0.025  # beside live traffic a background chunk is about this much engine time
TRICKLE_FRACTION = 8  # ... or batch_size / 8 inputs until the engine's speed is known

logger = logging.getLogger("openai_compat")


@dataclass(eq=False)
class _Call:
    texts: list[str]
    future: asyncio.Future[tuple[list[Any], int]]
    background: bool = False
    released: bool = False
    chunks: list[asyncio.Future[Any]] = field(default_factory=list)  # engine calls it is in


@dataclass(eq=False)
class _Held:
    """Calls waiting for a wave (live or background), and how many inputs they hold."""

    calls: deque[_Call] = field(default_factory=deque)
    items: int = 0

    def add(self, call: _Call) -> None:
        self.calls.append(call)
        self.items += len(call.texts)

    def drop(self, call: _Call) -> None:
        self.calls.remove(call)
        self.items -= len(call.texts)

    def take(self, window: int) -> list[_Call]:
        """The oldest calls up to `window` inputs (at least one call, however large)."""
        taken: list[_Call] = []
        items = 0
        while self.calls and (not taken or items + len(self.calls[0].texts) <= window):
            call = self.calls.popleft()
            call.released = True
            taken.append(call)
            items += len(call.texts)
        self.items -= items
        return taken


@dataclass(eq=False)
class _Wave:
    calls: list[_Call]
    started: float
    background: bool
    results: list[list[Any]]  # per call: its vectors, filled in as chunks finish
    missing: list[int]  # per call: vectors still to come
    pending: list[tuple[int, int, int]]  # (length, call, position), sorted, not yet sent
    in_engine: int = 0  # chunks sent and not done
    trickled: bool = False  # paced by us: its duration says nothing of the engine's speed
    members: dict[asyncio.Future[Any], set[int]] = field(default_factory=dict)  # chunk -> calls


class Feeder:
    """One model's embed calls, handed to its engine in waves (see the module text)."""

    def __init__(self, engine: Any, batch_size: int) -> None:
        self._engine = engine
        self._batch = max(1, batch_size)
        self._window = self._batch * WINDOW_BATCHES
        self._live = _Held()
        self._background = _Held()
        self._waves: list[_Wave] = []  # in the engine (they hold their chunk tasks)
        self._expect = 1  # calls expected for the next wave
        self._wave_s = 0.0  # moving average of wave durations
        self._timer: asyncio.TimerHandle | None = None
        self._input_s = 0.0  # moving average of wave seconds per input
        self._last_live = -float("inf")  # when the last live call arrived (perf_counter)

    @property
    def waiting(self) -> int:
        """Inputs held here, not yet handed to the engine."""
        return self._live.items + self._background.items

    async def embed(self, texts: Sequence[str]) -> tuple[list[Any], int]:
        """What `engine.embed(texts)` returns: the vectors, and the usage the engine reports
        (its own token counts where it keeps them, else its length estimate)."""
        if not texts:
            return [], 0
        loop = asyncio.get_running_loop()
        call = _Call(list(texts), loop.create_future(), background=_BACKGROUND.get())
        held = self._background if call.background else self._live
        if not call.background:
            self._last_live = time.perf_counter()
        held.add(call)
        self._consider()
        try:
            return await call.future
        except asyncio.CancelledError:
            if call.released:
                self._abandon(call)
            else:
                held.drop(call)
            raise

    def _abandon(self, call: _Call) -> None:
        """A released call's caller is gone: cancel its chunks that nobody else waits for."""
        wave = next((w for w in self._waves if call in w.calls), None)
        if wave is None:
            return
        for chunk in call.chunks:
            if all(wave.calls[c].future.done() for c in wave.members.get(chunk, ())):
                chunk.cancel()

    # ------------------------------------------------------------ scheduling

    def _consider(self) -> None:
        self._consider_live()
        # One background wave at a time, beside live ones but never mixed into them: live
        # traffic that never pauses cannot starve a batch job.
        if (
            self._background.calls
            and len(self._waves) < MAX_WAVES
            and not any(w.background for w in self._waves)
        ):
            self._release(self._background)

    def _consider_live(self) -> None:
        if len(self._waves) >= MAX_WAVES or not self._live.calls:
            return
        if self._live.items >= self._window:
            self._release(self._live)
        elif self._live_waves():
            return  # the engine is busy and less than a window waits: gather more
        elif len(self._live.calls) >= self._expect:
            self._release(self._live)
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._pause(), self._gathered)

    def _live_waves(self) -> bool:
        return any(not w.background for w in self._waves)

    def _pause(self) -> float:
        """How long a wave waits for callers that are expected but not back yet."""
        return min(GATHER_MAX_S, GATHER_FRACTION * self._wave_s)

    def _gathered(self) -> None:
        self._timer = None
        if self._live.calls and not self._live_waves() and len(self._waves) < MAX_WAVES:
            self._release(self._live)

    def _release(self, held: _Held) -> None:
        background = held is self._background
        if not background and self._timer is not None:
            self._timer.cancel()
            self._timer = None
        calls = held.take(self._window)
        wave = _Wave(
            calls,
            time.perf_counter(),
            background,
            results=[[None] * len(call.texts) for call in calls],
            missing=[len(call.texts) for call in calls],
            # sorted like infinity-emb's queue: by character length
            pending=sorted(
                (
                    (len(text), c, i)
                    for c, call in enumerate(calls)
                    for i, text in enumerate(call.texts)
                ),
                key=lambda entry: entry[0],
            ),
        )
        self._waves.append(wave)
        self._pump(wave)

    def _pump(self, wave: _Wave) -> None:
        """Hand the engine the wave's next chunks: all of them, in batches, for a live wave
        or a background one while live traffic is quiet; else one small chunk at a time."""
        calls = wave.calls
        if wave.background:
            # inputs of calls whose callers are gone are never sent
            wave.pending = [item for item in wave.pending if not calls[item[1]].future.done()]
        trickle = wave.background and self._live_active()
        wave.trickled |= trickle and bool(wave.pending)
        while wave.pending and not (trickle and wave.in_engine):
            size = self._trickle() if trickle else self._batch
            chunk, wave.pending = wave.pending[:size], wave.pending[size:]
            texts = [calls[c].texts[i] for _, c, i in chunk]
            task = asyncio.ensure_future(self._engine.embed(texts))
            members = {c for _, c, _ in chunk}
            wave.members[task] = members
            for c in members:
                calls[c].chunks.append(task)
            wave.in_engine += 1
            task.add_done_callback(lambda t, chunk=chunk: self._chunk_done(wave, chunk, t))
        if not wave.pending and not wave.in_engine and wave in self._waves:
            self._wave_done(wave)  # every input left belonged to a cancelled call

    def _trickle(self) -> int:
        """Inputs in a background chunk beside live traffic: about TRICKLE_S of engine time
        (from recent waves, whose time includes any queueing: an overestimate, so chunks
        err small), 1 to batch_size."""
        if not self._input_s:
            return max(1, self._batch // TRICKLE_FRACTION)
        return max(1, min(self._batch, round(TRICKLE_S / self._input_s)))

    def _live_active(self) -> bool:
        return (
            bool(self._live.calls)
            or self._live_waves()
            or time.perf_counter() - self._last_live < QUIET_S
        )

    def _chunk_done(self, wave: _Wave, chunk: list[tuple[int, int, int]], task: Any) -> None:
        """A done-callback: whatever happens in here, every caller of the chunk is answered
        and the wave's slot is given back (nothing raised here would reach anyone)."""
        try:
            wave.members.pop(task, None)
            error = _chunk_error(task, len(chunk))
            if error is None:
                for (_, c, i), vector in zip(chunk, task.result()[0], strict=True):
                    wave.results[c][i] = vector
                    wave.missing[c] -= 1
            for c in {c for _, c, _ in chunk}:
                future = wave.calls[c].future
                if future.done():
                    continue  # its caller is gone, or an earlier chunk failed it
                if error is not None:
                    future.set_exception(error)
                elif wave.missing[c] == 0:
                    vectors = wave.results[c]
                    future.set_result((vectors, _usage(wave.calls[c].texts, vectors)))
        except Exception as exc:  # a bug here must not leave callers waiting forever
            logger.exception("wave batching failed on a finished chunk")
            for c in {c for _, c, _ in chunk}:
                if not wave.calls[c].future.done():
                    wave.calls[c].future.set_exception(exc)
        finally:
            wave.in_engine -= 1
            if wave.pending:
                self._pump(wave)
            elif wave.in_engine == 0 and wave in self._waves:
                self._wave_done(wave)

    def _wave_done(self, wave: _Wave) -> None:
        elapsed = time.perf_counter() - wave.started
        if not wave.trickled:
            per_input = elapsed / sum(len(call.texts) for call in wave.calls)
            self._input_s = (
                per_input if not self._input_s else 0.8 * self._input_s + 0.2 * per_input
            )
        if not wave.background:
            self._wave_s = elapsed if not self._wave_s else 0.8 * self._wave_s + 0.2 * elapsed
            # its callers are about to come back, and those that waited meanwhile are here
            self._expect = max(1, len(wave.calls) + len(self._live.calls))
        self._waves.remove(wave)
        self._consider()

    def close(self) -> None:
        """Fail whatever still waits (the engine is stopping): 503, a retryable refusal.
        Calls already in the engine get its answer, or a 503 if it stops without one."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for held in (self._live, self._background):
            while held.calls:
                call = held.calls.popleft()
                if not call.future.done():
                    call.future.set_exception(
                        ServiceUnavailable("The model is shutting down; retry shortly.")
                    )
            held.items = 0


def _chunk_error(task: Any, inputs: int) -> BaseException | None:
    """What the callers of a finished chunk get instead of vectors, if anything: the
    engine's error; a 503 if the engine cancelled it (it is stopping: the callers did not
    ask to stop, so never their CancelledError); a 500 if it answered the wrong count."""
    if task.cancelled():
        return ServiceUnavailable("The model stopped before answering; retry shortly.")
    error: BaseException | None = task.exception()
    if error is not None:
        return error
    vectors = task.result()[0]
    if len(vectors) != inputs:
        return ModelOutputError(
            f"The model answered {len(vectors)} vectors for {inputs} inputs; retry, or report "
            "this engine fault.",
            code="engine_output_mismatch",
        )
    return None


def _usage(texts: list[str], vectors: list[Any]) -> int:
    counted = engine_token_count(vectors)
    return counted if counted is not None else length_estimate(texts)
