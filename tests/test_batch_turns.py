"""batch/runner.py and waves.py on a scripted dispatch and a real SQLite store: owners take
turns (one owner's paced batch never holds another's), and a wave cut short by a cancel, an
expiry or the server stopping keeps the lines that finished: written once, committed, never
sent again on resume."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from openai_compat.batch import runner as runner_module
from openai_compat.batch.runner import Gate, Runner
from openai_compat.batch.service import batch_object
from openai_compat.batch.store import Store
from tests.test_batch_runner import Clock, embedding_line


def submit(store: Store, tmp_path: Path, owner: str, ids: list[str]) -> str:
    source = tmp_path / f"{owner}-{ids[0]}.jsonl"
    lines = [embedding_line(i, {"model": "m", "input": i}) for i in ids]
    source.write_bytes(b"\n".join(lines) + b"\n")
    file_id = store.add_file(source, purpose="batch", filename=source.name)["id"]
    obj = batch_object(
        input_file_id=file_id,
        endpoint="/v1/embeddings",
        completion_window="24h",
        metadata=None,
        now=int(time.time()),
    )
    store.add_batch(obj, owner)
    return str(obj["id"])


def records(store: Store, batch_id: str, which: str) -> list[dict[str, Any]]:
    path = store.batch_dir(batch_id) / which
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


class Engine:
    """Answers a line at once unless its input is held (a line waiting for its owner's
    tokens); counts what each input was sent."""

    def __init__(self, held: set[str]) -> None:
        self.held = held
        self.sent: dict[str, int] = {}
        self.release = asyncio.Event()

    async def __call__(self, url: str, body: bytes) -> tuple[int, bytes, str]:
        text = orjson.loads(body)["input"]
        self.sent[text] = self.sent.get(text, 0) + 1
        if text in self.held:
            await self.release.wait()
        return 200, orjson.dumps({"echo": text}), f"req-{text}"

    async def answered(self, *texts: str) -> None:
        while not all(t in self.sent for t in texts):  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def until(check: Any) -> None:
    deadline = time.monotonic() + 5.0
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_a_paced_owner_never_holds_another_owners_batch(tmp_path: Path) -> None:
    """Owner A's older batch waits on its budget (its second line never answers until the
    end); owner B's one-line batch, submitted after, completes meanwhile."""
    store = Store(tmp_path / "data")
    paced = submit(store, tmp_path, "owner-a", ["a0", "a1", "a2"])
    quick = submit(store, tmp_path, "owner-b", ["b0"])
    engine = Engine(held={"a1"})
    runner = Runner(lambda: store, engine, Gate(), max_requests=100)
    serving = asyncio.create_task(runner.serve())
    try:
        await until(lambda: store.status(quick) == "completed")
        assert store.status(paced) == "in_progress"
        assert [r["custom_id"] for r in records(store, quick, "output.jsonl")] == ["b0"]
        engine.release.set()
        await until(lambda: store.status(paced) == "completed")
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    assert [r["custom_id"] for r in records(store, paced, "output.jsonl")] == ["a0", "a1", "a2"]
    store.close()


async def test_a_cancel_keeps_the_lines_of_the_wave_that_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "CANCEL_POLL_S", 0.05)
    store = Store(tmp_path / "data")
    batch_id = submit(store, tmp_path, "", ["c0", "c1", "c2", "c3"])  # one wave
    engine = Engine(held={"c1", "c3"})
    run = asyncio.create_task(Runner(lambda: store, engine, Gate(), max_requests=100).run(batch_id))
    await engine.answered("c0", "c1", "c2", "c3")
    store.cancel(batch_id)
    await asyncio.wait_for(run, timeout=5)
    obj = store.batch(batch_id)
    assert obj is not None and obj["status"] == "cancelled"
    # c0 and c2 ran (and were charged): their answers are the batch's output
    assert [r["custom_id"] for r in records(store, batch_id, "output.jsonl")] == ["c0", "c2"]
    assert obj["request_counts"]["completed"] == 2
    store.close()


async def test_a_stop_keeps_finished_lines_and_the_resume_never_sends_them_again(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "data")
    ids = ["s0", "s1", "s2", "s3", "s4"]
    batch_id = submit(store, tmp_path, "", ids)
    engine = Engine(held={"s0", "s3"})  # s1, s2 and s4 finish; s0 and s3 are still waiting
    serving = asyncio.create_task(Runner(lambda: store, engine, Gate(), max_requests=100).serve())
    await engine.answered(*ids)
    await asyncio.sleep(0.05)
    serving.cancel()  # what BatchService.stop does as the server stops
    await asyncio.gather(serving, return_exceptions=True)
    progress = store.progress(batch_id)
    assert (progress.lines_read, progress.done_ahead) == (0, frozenset({1, 2, 4}))
    kept = [r["custom_id"] for r in records(store, batch_id, "output.jsonl")]
    assert kept == ["s1", "s2", "s4"]

    resumed = Engine(held=set())  # a new process: every line answers
    await Runner(lambda: store, resumed, Gate(), max_requests=100).run(batch_id)
    assert resumed.sent == {"s0": 1, "s3": 1}  # the finished lines were not sent again
    obj = store.batch(batch_id)
    assert obj is not None and obj["status"] == "completed"
    assert obj["request_counts"] == {"total": 5, "completed": 5, "failed": 0}
    out = [r["custom_id"] for r in records(store, batch_id, "output.jsonl")]
    assert sorted(out) == ids and len(out) == 5
    assert store.progress(batch_id).done_ahead == frozenset()
    store.close()


async def test_an_expiry_keeps_finished_lines_and_expires_only_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "CANCEL_POLL_S", 0.05)
    store = Store(tmp_path / "data")
    ids = ["e0", "e1", "e2", "e3"]
    batch_id = submit(store, tmp_path, "", ids)
    clock = Clock()
    monkeypatch.setattr(runner_module.time, "time", clock)
    engine = Engine(held={"e0", "e2"})
    serving = asyncio.create_task(Runner(lambda: store, engine, Gate(), max_requests=100).serve())
    await engine.answered(*ids)
    await asyncio.sleep(0.05)
    serving.cancel()  # a stop: e1 and e3 kept
    await asyncio.gather(serving, return_exceptions=True)
    clock.offset = 25 * 3600  # resumed after the completion window
    await Runner(lambda: store, Engine(held=set()), Gate(), max_requests=100).run(batch_id)
    obj = store.batch(batch_id)
    assert obj is not None and obj["status"] == "expired"
    assert [r["custom_id"] for r in records(store, batch_id, "output.jsonl")] == ["e1", "e3"]
    expired = records(store, batch_id, "errors.jsonl")
    assert [(e["custom_id"], e["error"]["line"]) for e in expired] == [("e0", 1), ("e2", 3)]
    assert obj["request_counts"] == {"total": 4, "completed": 2, "failed": 2}
    store.close()
