"""Runs batch jobs: each input line is a request to one of this server's own routes (lines.py).

A line is sent through the app itself (in process, over ASGI), so it gets exactly the
validation, errors, limits and response body a live request gets. Lines go in waves, in
input order; each wave's results are appended to the output and error files, fsynced, then
committed with the job's progress (store.py), so a restart resumes exactly where the last
commit left off. While no live request is in flight the next wave is sent as soon as the
previous one's answers are in, before they are written and committed, so the engine never
waits for the disk; a wave sent ahead and never written is simply sent again on resume.

Online traffic first: lines go in waves, each written, fsynced and committed: idle, a wave
holds up to WAVE_INPUTS inputs (engine batches stay full); while live requests are in
flight, a wave is one line, sent only when they pause (or after MAX_YIELD seconds), so a live
request waits behind at most one line's inputs.

Owners take turns: each owner's open batches run oldest first in a worker of its own (up to
MAX_OWNERS at once), so a batch paced by its owner's tokens per minute (its lines wait in the
owner's budget) holds up only that owner's other batches, never another key's. A wave cut
short keeps its finished lines (waves.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

from openai_compat.batch import refusals
from openai_compat.batch.closing import fail, finalize
from openai_compat.batch.lines import (
    BigSplit,
    Dispatch,
    LineResult,
    OffLoop,
    Retry,
    count_lines,
    read_wave,
    run_line,
    scan,
)
from openai_compat.batch.outputs import DataLost, reopen_outputs
from openai_compat.batch.pending import Pending
from openai_compat.batch.refusals import Refusals
from openai_compat.batch.store import Progress, Store
from openai_compat.batch.waves import Books, NoRoom, Wave
from openai_compat.tenants import batch_owner

logger = logging.getLogger("openai_compat.batch")

CHUNK = 64  # most lines sent at once (one commit each wave)
WAVE_INPUTS = 64  # inputs a wave stops at, while no live request is in flight
MAX_YIELD = 1.0  # seconds a chunk waits for live traffic to pause before it goes anyway
CANCEL_POLL_S = 0.5  # how soon a cancel is seen while a wave's lines are in the engine
MAX_OWNERS = 16  # owners whose batches run at once (each in a worker of its own)


@dataclass
class Gate:
    """Live requests first: `live()` says how many non-batch requests are in flight."""

    live: Callable[[], int] = lambda: 0
    stopping: Callable[[], bool] = lambda: False

    async def wait(self) -> None:
        deadline = time.monotonic() + MAX_YIELD
        # a counter, not an event: polled every 5 ms, for at most MAX_YIELD
        while self.live() > 0 and time.monotonic() < deadline and not self.stopping():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


class Runner:
    def __init__(
        self,
        store: Callable[[], Store],
        dispatch: Dispatch,
        gate: Gate,
        max_requests: int,
        admission: int = 0,
        served: Callable[[], frozenset[str]] | None = None,
        max_bytes: int | None = None,
    ) -> None:
        """`admission`: the inputs a model admits at once (--max-queued-inputs; 0 = no
        limit): no wave holds more, unless it is one line. `served`: the model names this
        server serves; a batch whose lines need others (served where it was submitted) stays
        pending, with a `pending_reason`, until a server that serves them opens the data dir
        (None: run every batch). `max_bytes`: a line over it is refused unread (413's
        record); `off_loop` and `big` (set when the app starts: its body workers) split big
        lines in a worker process, as big live bodies are parsed."""
        self._store = store  # opened on first use (an app that never runs a batch opens none)
        self.dispatch = dispatch
        self.gate = gate
        self.max_requests = max_requests
        self.wave_inputs = min(WAVE_INPUTS, admission) if admission else WAVE_INPUTS
        self.wake = asyncio.Event()
        self.pending = Pending(served)
        self.max_bytes = max_bytes
        self.off_loop: OffLoop | None = None
        self.big: BigSplit | None = None
        self.refusals = Refusals()  # batches whose lines keep being refused (refusals.py)

    @property
    def store(self) -> Store:
        return self._store()

    async def serve(self) -> None:
        """Run open batches for as long as the server lives: a worker per owner (oldest
        batch first), each running its owner's batches oldest first."""
        workers: dict[str, asyncio.Task[None]] = {}
        try:
            while not self.gate.stopping():
                open_now = await asyncio.to_thread(self.store.open_batch_owners)
                for owner in [o for o, task in workers.items() if task.done()]:
                    del workers[owner]
                for owner in dict.fromkeys(owner for _, owner in open_now):
                    if owner in workers or len(workers) >= MAX_OWNERS:
                        continue
                    ids = [i for i, o in open_now if o == owner and not self.refusals.deferred(i)]
                    if ids:
                        workers[owner] = asyncio.create_task(self._turns(ids))
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), timeout=self.refusals.idle_wait())
        finally:
            for task in workers.values():
                task.cancel()
            await asyncio.gather(*workers.values(), return_exceptions=True)

    async def _turns(self, batch_ids: list[str]) -> None:
        """One owner's batches, oldest first, each as far as it goes now."""
        for batch_id in batch_ids:  # serve() asked gate.stopping() just before
            if self.refusals.deferred(batch_id):
                continue
            try:
                await self.run(batch_id)
            except Exception:  # one broken job must not stop the others
                logger.exception("batch %s failed", batch_id)
                message = "The batch failed on the server."
                await asyncio.to_thread(self._fail, batch_id, "server_error", message)
            if self.gate.stopping():
                return

    def _fail(self, batch_id: str, code: str, message: str) -> None:
        fail(self.store, batch_id, code, message)

    async def run(self, batch_id: str) -> None:
        """Take one batch as far as it goes: to a final status, or until the server stops.
        Every store call runs in a thread: a commit waits for the disk (fsync)."""
        store = self.store
        obj = await asyncio.to_thread(store.batch, batch_id)
        if obj is None:
            return
        batch_owner.set(await asyncio.to_thread(store.batch_owner, batch_id))
        input_path = await asyncio.to_thread(store.file_path, obj["input_file_id"])
        if obj["status"] == "validating":
            if input_path is None or not input_path.exists():
                message = "The input file was deleted."
                return await asyncio.to_thread(self._fail, batch_id, "file_not_found", message)
            served = await asyncio.to_thread(store.served_at_submit, batch_id)
            total, duplicates, models = await asyncio.to_thread(
                scan, input_path, self.max_requests, served, self.big, self.max_bytes
            )
            if total > self.max_requests:
                message = f"The input file has more than {self.max_requests} requests."
                return await asyncio.to_thread(self._fail, batch_id, "too_many_requests", message)
            await asyncio.to_thread(store.set_needs, batch_id, models)
            obj["status"], obj["in_progress_at"] = "in_progress", int(time.time())
            obj["request_counts"]["total"] = total
            await asyncio.to_thread(store.save, obj, Progress(duplicates=duplicates))
            obj = await asyncio.to_thread(store.batch, batch_id) or obj
        if obj["status"] == "in_progress" and not await self.pending.may_run(store, obj):
            return  # pending: another server's models
        if obj["status"] in ("in_progress", "cancelling") and input_path is not None:
            try:
                finished = await self._lines(obj, input_path)
            except DataLost as exc:
                return await asyncio.to_thread(self._fail, batch_id, "data_lost", str(exc))
            except NoRoom as exc:
                message = f"The batch stopped: {exc}. Its output so far is kept."
                return await asyncio.to_thread(self._fail, batch_id, "quota_exceeded", message)
            if not finished:
                return  # the server is stopping: resumed from the last commit next time
            obj = await asyncio.to_thread(store.batch, batch_id) or obj
        if obj["status"] in ("in_progress", "cancelling", "finalizing"):
            await asyncio.to_thread(self._finalize, obj)

    async def _lines(self, obj: dict[str, Any], input_path: Path) -> bool:
        batch_id = obj["id"]
        progress = await asyncio.to_thread(self.store.progress, batch_id)
        folder = self.store.batch_dir(batch_id)
        out_path, err_path = folder / "output.jsonl", folder / "errors.jsonl"
        await asyncio.to_thread(reopen_outputs, folder, (out_path, err_path), progress)
        committed_line = await asyncio.to_thread(count_lines, input_path, progress.input_offset)
        endpoint = obj["endpoint"]
        with input_path.open("rb") as inp, out_path.open("ab") as out, err_path.open("ab") as err:
            inp.seek(progress.input_offset)
            books = Books(self.store, batch_id, (out, err), obj["request_counts"], progress)
            next_line = committed_line  # the file's line number the next read starts after
            wave: Wave | None = None  # sent, its results not written yet
            keep = True  # an exit keeps the finished lines of the wave in flight
            try:
                status = await asyncio.to_thread(self.store.status, batch_id)
                while True:
                    if status == "cancelling":
                        obj["status"] = "cancelling"
                        return True
                    if obj["expires_at"] is not None and time.time() > obj["expires_at"]:
                        if wave is not None:  # what was done stays; the rest is expired
                            await books.keep(wave)
                            wave.drop()
                            wave = None
                        await books.expire(inp, committed_line, self.big, self.max_bytes)
                        return True  # _finalize closes it as expired
                    if self.gate.stopping():
                        return False
                    if wave is None:
                        await self.gate.wait()
                        # idle: a wave fills engine batches; live requests in flight: one line
                        busy = self.gate.live() > 0
                        at = books.progress.lines_read
                        wave = await self._send(inp, endpoint, at, next_line, books, busy)
                        if wave is None:
                            return True
                        next_line = wave.physical
                    answered = await self._answered(obj, wave, endpoint, books.progress)
                    if answered == "cancelling":
                        obj["status"] = "cancelling"  # the wave's finished lines are kept
                        return True
                    if answered == "expired":
                        continue  # the rest get their expiry records at the top
                    if answered == "deferred" or answered is None:
                        # deferred: the other batches go first, resumed after a back-off;
                        # None: stopping; either way the refused lines are sent on resume
                        return False
                    done, wave = wave, None
                    # Idle: the next wave goes to the engine now, while this one is written,
                    # fsynced and committed (the engine would otherwise wait for the disk).
                    if self.gate.live() == 0 and not self.gate.stopping():
                        at = done.first + done.count
                        wave = await self._send(inp, endpoint, at, next_line, books, False)
                        if wave is not None:
                            next_line = wave.physical
                    status = await books.advance(done, answered)
                    committed_line = done.physical
            except BaseException as exc:
                keep = isinstance(exc, asyncio.CancelledError)  # the server stops
                raise
            finally:
                if wave is not None:
                    if keep:
                        await self._keep(books, wave)
                    wave.drop()

    async def _keep(self, books: Books, wave: Wave) -> None:
        try:
            kept = await books.keep(wave)
        except Exception:  # they run again on resume
            logger.exception("batch %s: the finished lines of a wave cut short", books.batch_id)
            return
        if kept:
            logger.info("batch %s: %d line(s) of a wave cut short kept", books.batch_id, kept)

    async def _send(
        self,
        inp: BinaryIO,
        endpoint: str,
        first: int,
        physical: int,
        books: Books,
        busy: bool,
    ) -> Wave | None:
        """Read the next wave of lines (line `first` on, after the file's line `physical`)
        and send those not run before; None at the end."""
        lines, offset, last = await asyncio.to_thread(
            read_wave, inp, 1 if busy else CHUNK, self.wave_inputs, physical
        )
        if not lines:
            return None
        progress = books.progress
        todo = [
            (first + i, number, raw)
            for i, (number, raw) in enumerate(lines)
            if first + i not in progress.done_ahead
        ]
        tasks = [
            asyncio.ensure_future(
                self._attempt(raw, endpoint, index in progress.duplicates, number)
            )
            for index, number, raw in todo
        ]
        return Wave(first, len(lines), offset, last, todo, tasks)

    async def _attempt(
        self, raw: bytes, endpoint: str, duplicate: bool, number: int
    ) -> LineResult | Retry:
        """A line's record, or its Retry when the server cannot take it now (429/503)."""
        try:
            return await run_line(
                raw,
                endpoint,
                duplicate,
                self.dispatch,
                number,
                max_bytes=self.max_bytes,
                off_loop=self.off_loop,
            )
        except Retry as retry:
            return retry

    async def _answered(
        self, obj: dict[str, Any], wave: Wave, endpoint: str, progress: Progress
    ) -> list[LineResult] | Literal["cancelling", "expired", "deferred"] | None:
        """Every line of the wave answered: the refused ones (429/503) sent again, alone of
        the rest (a finished line is never sent twice), backing off 0.2 s doubling to 5 s;
        None if the server stops first; "cancelling" if the client cancels the batch
        meanwhile (seen within CANCEL_POLL_S), "expired" once its window has passed;
        "deferred" when its lines have been refused for DEFER_AFTER_S (the other batches
        run meanwhile). Lines refused with 503 for GIVE_UP_503_S fail with that answer
        (refusals.py)."""
        batch_id = obj["id"]
        while not all(task.done() for task in wave.tasks):
            await asyncio.wait(wave.tasks, timeout=CANCEL_POLL_S)
            if not all(task.done() for task in wave.tasks):
                status = await asyncio.to_thread(self.store.status, batch_id)
                if status == "cancelling":
                    return "cancelling"
        results = wave.results = [task.result() for task in wave.tasks]
        pause = refusals.RETRY_PAUSE
        gave_up = False
        while True:
            refused = [i for i, r in enumerate(results) if isinstance(r, Retry)]
            if not refused:
                if not gave_up:  # the lines went through: the refusals (if any) are over
                    self.refusals.over(batch_id)
                return [r for r in results if isinstance(r, LineResult)]
            now = time.monotonic()
            # kept across waves until lines get through: once past the bound, the next
            # waves' 503s fail after one try each
            since = self.refusals.since(batch_id)
            if now - since >= refusals.GIVE_UP_503_S:
                for i in refused:
                    retry = results[i]
                    assert isinstance(retry, Retry)
                    if retry.status == 503 and retry.final is not None:
                        results[i] = retry.final  # fails with the answer it kept getting
                        gave_up = True
                if all(isinstance(r, LineResult) for r in results):
                    continue
            if self.gate.stopping():
                return None
            if await asyncio.to_thread(self.store.status, batch_id) == "cancelling":
                return "cancelling"
            if obj["expires_at"] is not None and time.time() > obj["expires_at"]:
                return "expired"
            if now - since >= refusals.DEFER_AFTER_S:
                self.refusals.defer(batch_id)
                return "deferred"
            await asyncio.sleep(pause)
            pause = min(pause * 2, refusals.MAX_RETRY_PAUSE)
            await self.gate.wait()
            again = await asyncio.gather(
                *(
                    self._attempt(
                        wave.lines[i][2],
                        endpoint,
                        wave.lines[i][0] in progress.duplicates,
                        wave.lines[i][1],
                    )
                    for i in refused
                )
            )
            for i, result in zip(refused, again, strict=True):
                results[i] = result

    def _finalize(self, obj: dict[str, Any]) -> None:
        finalize(self.store, obj)
