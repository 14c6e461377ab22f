"""A running batch's lines in flight (a Wave) and its books: the output and error files, the
request counts and the progress committed with them (store.py).

A wave's lines are separate tasks, so a wave cut short (a cancel, an expiry, a deferral, the
server stopping) still has the answers of the lines that finished: their records are written
and their numbers committed as `done_ahead` (lines past the committed offset already run), and
a resume skips them. A finished line is charged to its owner once and never run again.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any, BinaryIO

from openai_compat.batch.lines import BigSplit, LineResult, Retry, expire_rest
from openai_compat.batch.outputs import fsync_both
from openai_compat.batch.store import Progress, Store


class NoRoom(RuntimeError):
    """The data dir's quota or free-disk floor would be passed: the batch fails with what it
    committed so far."""


@dataclass
class Wave:
    """Lines sent together. `first`: the number of its first line (non-blank lines counted
    from 0); `count`: the non-blank lines it spans, some perhaps run before (done_ahead) and
    not sent; `offset` and `physical`: the input file's byte offset and line number after its
    last line."""

    first: int
    count: int
    offset: int
    physical: int
    lines: list[tuple[int, int, bytes]]  # (line number from 0, file line from 1, raw) sent
    tasks: list[asyncio.Task[LineResult | Retry]]
    results: list[LineResult | Retry] | None = None  # once every task answered (then retried)

    def finished(self) -> list[tuple[int, LineResult]]:
        """(line number, record) of the lines answered for good so far."""
        answers: list[Any] = self.results or [_answer(t) for t in self.tasks]
        return [
            (line[0], a)
            for line, a in zip(self.lines, answers, strict=True)
            if isinstance(a, LineResult)
        ]

    def drop(self) -> None:
        """Cancel the lines still running (what they did is not wanted)."""
        for task in self.tasks:
            if not task.done():
                task.cancel()
            task.add_done_callback(retrieve)


def _answer(task: asyncio.Task[LineResult | Retry]) -> LineResult | Retry | None:
    if not task.done() or task.cancelled() or task.exception() is not None:
        return None
    return task.result()


class Books:
    """One running batch's output and error files, its request counts (the batch object's,
    updated in place) and the progress last committed."""

    def __init__(
        self,
        store: Store,
        batch_id: str,
        files: tuple[BinaryIO, BinaryIO],
        counts: dict[str, int],
        progress: Progress,
    ) -> None:
        self.store, self.batch_id = store, batch_id
        self.out, self.err = files
        self.counts = counts
        self.progress = progress

    async def write(self, results: list[LineResult]) -> None:
        """Append the records (within the data dir's room: NoRoom if not) and fsync them."""
        records = [(r.ok, r.encoded() + b"\n") for r in results]
        adding = sum(len(record) for _, record in records)
        refused = await asyncio.to_thread(self.store.room, adding)
        if refused is not None:
            raise NoRoom(refused[1])
        for ok, record in records:
            (self.out if ok else self.err).write(record)
            self.counts["completed" if ok else "failed"] += 1
        self.out.flush()
        self.err.flush()
        await asyncio.to_thread(fsync_both, self.out, self.err)

    async def commit(self, progress: Progress) -> str | None:
        """Commit the counts with `progress`; the batch's status now."""
        self.progress = progress
        return await asyncio.to_thread(
            self.store.commit_wave,
            self.batch_id,
            self.counts["completed"],
            self.counts["failed"],
            progress,
        )

    async def advance(self, wave: Wave, results: list[LineResult]) -> str | None:
        """A whole wave answered: its records written and the offset moved past it."""
        await self.write(results)
        lines_read = wave.first + wave.count
        ahead = frozenset(i for i in self.progress.done_ahead if i >= lines_read)
        progress = Progress(
            wave.offset,
            lines_read,
            self.out.tell(),
            self.err.tell(),
            self.progress.duplicates,
            ahead,
        )
        return await self.commit(progress)

    async def keep(self, wave: Wave) -> int:
        """A wave cut short: the records of its finished lines written and their numbers
        committed as done ahead of the offset (a resume skips them); how many."""
        finished = [(i, r) for i, r in wave.finished() if i not in self.progress.done_ahead]
        if not finished:
            return 0
        await self.write([r for _, r in finished])
        progress = dataclasses.replace(
            self.progress,
            output_bytes=self.out.tell(),
            error_bytes=self.err.tell(),
            done_ahead=self.progress.done_ahead | {i for i, _ in finished},
        )
        await self.commit(progress)
        return len(finished)

    async def expire(
        self, inp: BinaryIO, physical: int, big: BigSplit | None, max_bytes: int | None
    ) -> None:
        """Every line not run (from the committed offset, after the file's line `physical`)
        gets its error record (code batch_expired), committed."""
        progress = self.progress
        inp.seek(progress.input_offset)
        written, passed = await asyncio.to_thread(
            expire_rest,
            inp,
            self.err,
            physical,
            progress.lines_read,
            progress.done_ahead,
            big,
            max_bytes,
        )
        self.counts["failed"] += written
        await asyncio.to_thread(fsync_both, self.out, self.err)
        lines_read = progress.lines_read + passed
        await self.commit(
            Progress(
                inp.tell(),
                lines_read,
                self.out.tell(),
                self.err.tell(),
                progress.duplicates,
            )
        )


def retrieve(task: asyncio.Future[Any]) -> None:
    """A dropped line's outcome is not wanted (no 'exception never retrieved' warning)."""
    if not task.cancelled():
        task.exception()
