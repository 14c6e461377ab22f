"""The Batch API runner against hostile and broken jobs (integrity pass 2, items 2 and 3): a
big line is never parsed in the server's process, a line over max_body_bytes is refused
unread, and a batch whose lines keep being refused (a model that cannot load) backs off,
yields to the other batches, honours cancel and expiry, and fails its lines in bounded time."""

from __future__ import annotations

import asyncio
import time
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pytest

from openai_compat.batch import lines as lines_module
from openai_compat.batch import refusals
from openai_compat.batch import runner as runner_module
from openai_compat.batch.lines import split_line
from openai_compat.batch.runner import Gate, Runner
from openai_compat.batch.store import Store
from openai_compat.ground.bodies import INLINE_BYTES, BodyParser
from tests.test_batch_runner import Clock, embedding_line, errors, output, write_lines

UNAVAILABLE = orjson.dumps(
    {
        "error": {
            "message": "Model 'broken' failed to load; retry later.",
            "code": "model_load_failed",
        }
    }
)


class LoadSpy:
    """Stands in for orjson in batch/lines.py and records every parse of a big document."""

    def __init__(self) -> None:
        self.big: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(orjson, name)

    def loads(self, data: Any) -> Any:
        if len(data) > INLINE_BYTES:
            self.big.append(len(data))
        return orjson.loads(data)


async def test_big_lines_and_big_answers_are_parsed_in_a_worker_never_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = LoadSpy()
    monkeypatch.setattr(lines_module, "orjson", spy)
    store = Store(tmp_path / "data")
    texts = [f"word {i} " * 8 for i in range(40_000)]  # ~3.3 MB of input
    big_body = {"model": "m", "input": texts}
    raw = [embedding_line("big", big_body), embedding_line("small", {"model": "m", "input": "x"})]
    assert len(raw[0]) > 2 * INLINE_BYTES
    batch_id = write_lines(store, tmp_path, raw)
    received: list[Any] = []

    async def dispatch(url: str, body: bytes) -> tuple[int, bytes, str]:
        received.append(orjson.loads(body))  # the route's own parse, not the runner's
        answer = {"data": [[0.125] * 8 for _ in received[-1]["input"]] * 5, "n": len(body)}
        return 200, orjson.dumps(answer), "req"

    parser = BodyParser(workers=1)
    try:
        runner = Runner(lambda: store, dispatch, Gate(), max_requests=100)
        runner.off_loop = parser.run
        runner.big = partial(parser.call, split_line, encode_body=False)
        await asyncio.wait_for(runner.run(batch_id), timeout=120)
    finally:
        parser.close()
    assert spy.big == []  # neither the 3 MB line nor its ~5 MB answer was parsed here
    assert received[0] == big_body and received[1]["input"] == "x"
    records = output(store, batch_id)
    assert [r["custom_id"] for r in records] == ["big", "small"]
    assert records[0]["response"]["body"]["data"] == [[0.125] * 8] * (len(texts) * 5)
    store.close()


async def test_a_line_over_max_body_bytes_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = LoadSpy()
    monkeypatch.setattr(lines_module, "orjson", spy)
    store = Store(tmp_path / "data")
    huge = embedding_line("huge", {"model": "m", "input": "y" * (3 * INLINE_BYTES)})
    batch_id = write_lines(store, tmp_path, [huge, embedding_line("ok", {"input": "x"})])
    sent: list[bytes] = []

    async def dispatch(url: str, body: bytes) -> tuple[int, bytes, str]:
        sent.append(body)
        return 200, b'{"ok": true}', "req"

    # no worker pool: the refusal must come before any parse, here or elsewhere
    runner = Runner(lambda: store, dispatch, Gate(), max_requests=100, max_bytes=INLINE_BYTES)
    await runner.run(batch_id)
    assert spy.big == [] and len(sent) == 1
    (refused,) = errors(store, batch_id)
    assert refused["error"]["code"] == "request_too_large"
    assert refused["error"]["line"] == 1
    assert str(len(huge)) in refused["error"]["message"]
    assert [r["custom_id"] for r in output(store, batch_id)] == ["ok"]
    store.close()


def _two_models(store: Store, tmp_path: Path) -> tuple[str, str]:
    broken = [embedding_line(f"b{i}", {"model": "broken", "input": f"t{i}"}) for i in range(3)]
    fine = [embedding_line(f"f{i}", {"model": "fine", "input": f"t{i}"}) for i in range(3)]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    return write_lines(store, tmp_path / "a", broken), write_lines(store, tmp_path / "b", fine)


@pytest.fixture
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(refusals, "RETRY_PAUSE", 0.02)
    monkeypatch.setattr(refusals, "MAX_RETRY_PAUSE", 0.2)
    monkeypatch.setattr(refusals, "DEFER_AFTER_S", 0.2)


async def test_a_batch_whose_model_never_loads_yields_then_fails_its_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quick_backoff: None
) -> None:
    monkeypatch.setattr(refusals, "GIVE_UP_503_S", 1.5)
    monkeypatch.setattr(runner_module, "CHUNK", 1)  # a wave per line
    store = Store(tmp_path / "data")
    broken_id, fine_id = _two_models(store, tmp_path)  # the broken batch is older: first in line
    tries: list[float] = []
    tries_of: dict[str, int] = {}
    finished: dict[str, float] = {}

    async def dispatch(url: str, body: bytes) -> tuple[int, bytes, str]:
        request = orjson.loads(body)
        if request["model"] == "broken":
            tries.append(time.monotonic())
            tries_of[request["input"]] = tries_of.get(request["input"], 0) + 1
            return 503, UNAVAILABLE, "req-broken"
        return 200, orjson.dumps({"echo": request["input"]}), "req-fine"

    def final() -> bool:
        for batch_id in (broken_id, fine_id):
            obj = store.batch(batch_id)
            if obj is not None and obj["status"] == "completed":
                finished.setdefault(batch_id, time.monotonic())
        return len(finished) == 2

    runner = Runner(lambda: store, dispatch, Gate(stopping=final), max_requests=100)
    started = time.monotonic()
    await asyncio.wait_for(runner.serve(), timeout=30)
    # the other batch ran while the broken one backed off, long before the broken one gave up
    assert finished[fine_id] - started < 1.0 < finished[broken_id] - started < 10
    assert [r["custom_id"] for r in output(store, fine_id)] == ["f0", "f1", "f2"]
    failed = errors(store, broken_id)
    assert [r["custom_id"] for r in failed] == ["b0", "b1", "b2"]
    assert {r["response"]["status_code"] for r in failed} == {503}
    assert failed[0]["response"]["body"] == orjson.loads(UNAVAILABLE)
    obj = store.batch(broken_id)
    assert obj is not None and obj["request_counts"]["failed"] == 3
    # backed off: far fewer tries than one every 20 ms for 1.5 s; and once the batch's
    # refusals are past the bound, the next waves' lines fail after one try each (not 1.5 s
    # more per wave)
    assert tries_of["t0"] < 30 and tries_of["t1"] == tries_of["t2"] == 1
    store.close()


async def test_a_cancel_is_honoured_while_lines_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quick_backoff: None
) -> None:
    monkeypatch.setattr(refusals, "DEFER_AFTER_S", 60.0)  # retried in place throughout
    store = Store(tmp_path / "data")
    broken_id, _ = _two_models(store, tmp_path)
    refused = asyncio.Event()
    tries = 0

    async def dispatch(url: str, body: bytes) -> tuple[int, bytes, str]:
        nonlocal tries
        tries += 1
        if tries > 6:
            refused.set()
        return 503, UNAVAILABLE, "req"

    run = asyncio.create_task(
        Runner(lambda: store, dispatch, Gate(), max_requests=100).run(broken_id)
    )
    await asyncio.wait_for(refused.wait(), timeout=10)
    store.cancel(broken_id)
    await asyncio.wait_for(run, timeout=5)
    obj = store.batch(broken_id)
    assert obj is not None and obj["status"] == "cancelled"
    store.close()


async def test_a_batch_expires_while_its_lines_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quick_backoff: None
) -> None:
    monkeypatch.setattr(refusals, "DEFER_AFTER_S", 60.0)
    store = Store(tmp_path / "data")
    broken_id, _ = _two_models(store, tmp_path)
    clock = Clock()
    monkeypatch.setattr(runner_module.time, "time", clock)

    async def dispatch(url: str, body: bytes) -> tuple[int, bytes, str]:
        clock.offset = 25 * 3600  # the window ends while the lines are being refused
        return 503, UNAVAILABLE, "req"

    await asyncio.wait_for(
        Runner(lambda: store, dispatch, Gate(), max_requests=100).run(broken_id), timeout=10
    )
    obj = store.batch(broken_id)
    assert obj is not None and obj["status"] == "expired"
    assert {r["error"]["code"] for r in errors(store, broken_id)} == {"batch_expired"}
    assert obj["request_counts"]["failed"] == 3
    store.close()
