"""batch/runner.py on a scripted dispatch and a real SQLite store: the next wave goes to the
engine while the last one is written and committed, and a wave refused with 429 (the one sent
ahead included) is sent again, so every line is answered once, in order."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

import orjson
import pytest

from openai_compat.batch import runner as runner_module
from openai_compat.batch import waves as waves_module
from openai_compat.batch.runner import Gate, Runner
from openai_compat.batch.service import batch_object
from openai_compat.batch.store import Store

LINES = 6


def job(tmp_path: Path) -> tuple[Store, str]:
    """A store holding one in-progress-to-be batch of LINES embedding lines."""
    store = Store(tmp_path / "data")
    lines = [embedding_line(f"c{i}", {"model": "m", "input": [f"text {i}"]}) for i in range(LINES)]
    return store, write_lines(store, tmp_path, lines)


def output(store: Store, batch_id: str) -> list[dict[str, Any]]:
    obj = store.batch(batch_id)
    assert obj is not None and obj["status"] == "completed", obj
    path = store.file_path(obj["output_file_id"])
    assert path is not None
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


@pytest.fixture(autouse=True)
def waves_of_two(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_module, "CHUNK", 2)  # lines per wave


async def test_the_next_wave_is_sent_before_the_last_one_is_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, batch_id = job(tmp_path)
    sent: list[str] = []
    third_line_sent = threading.Event()

    async def dispatch(url: str, body: bytes) -> tuple[int, bytes, str]:
        text = orjson.loads(body)["input"][0]
        sent.append(text)
        if text == "text 2":
            third_line_sent.set()
        return 200, orjson.dumps({"echo": text}), f"req-{text}"

    seen_during_first_fsync: list[bool] = []
    real_fsync = waves_module.fsync_both

    def fsync(*files: BinaryIO) -> None:  # runs in a thread: the loop stays free
        if not seen_during_first_fsync:
            seen_during_first_fsync.append(third_line_sent.wait(timeout=5))
        real_fsync(*files)

    monkeypatch.setattr(waves_module, "fsync_both", fsync)
    await Runner(lambda: store, dispatch, Gate(), max_requests=100).run(batch_id)
    assert seen_during_first_fsync == [True]  # wave 2 was in flight while wave 1 was synced
    records = output(store, batch_id)
    assert [r["custom_id"] for r in records] == [f"c{i}" for i in range(LINES)]
    assert [r["response"]["body"]["echo"] for r in records] == [f"text {i}" for i in range(LINES)]
    assert [r["response"]["request_id"] for r in records] == [f"req-text {i}" for i in range(LINES)]
    assert sorted(sent) == [f"text {i}" for i in range(LINES)]  # each line sent once
    store.close()


async def test_a_wave_sent_ahead_and_refused_is_sent_again(tmp_path: Path) -> None:
    store, batch_id = job(tmp_path)
    sent: list[str] = []
    refused: set[str] = set()

    async def dispatch(url: str, body: bytes) -> tuple[int, bytes, str]:
        text = orjson.loads(body)["input"][0]
        sent.append(text)
        await asyncio.sleep(0)
        if text in ("text 0", "text 3") and text not in refused:  # the first wave, a later one
            refused.add(text)
            return 429, b'{"error": {"message": "busy"}}', ""
        return 200, orjson.dumps({"echo": text}), ""

    await Runner(lambda: store, dispatch, Gate(), max_requests=100).run(batch_id)
    records = output(store, batch_id)
    assert [r["response"]["body"]["echo"] for r in records] == [f"text {i}" for i in range(LINES)]
    assert all(r["response"]["status_code"] == 200 for r in records)
    assert sent.count("text 0") == 2 and sent.count("text 3") == 2  # refused, then again
    obj = store.batch(batch_id)
    assert obj is not None
    assert obj["request_counts"] == {"total": LINES, "completed": LINES, "failed": 0}
    assert obj["error_file_id"] is None
    store.close()


async def test_no_wave_is_sent_ahead_while_live_requests_are_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Busy: one line a wave, each sent after the gate lets it (never ahead of its turn)."""
    store, batch_id = job(tmp_path)
    in_flight = 0
    most = 0

    async def dispatch(url: str, body: bytes) -> tuple[int, bytes, str]:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return 200, orjson.dumps({"echo": orjson.loads(body)["input"][0]}), ""

    monkeypatch.setattr(runner_module, "MAX_YIELD", 0.0)  # no waiting for a pause that never comes
    gate = Gate(live=lambda: 1)
    await Runner(lambda: store, dispatch, gate, max_requests=100).run(batch_id)
    assert most == 1
    assert len(output(store, batch_id)) == LINES
    store.close()


def write_lines(
    store: Store,
    tmp_path: Path,
    raw_lines: list[bytes],
    *,
    served: list[str] | None = None,
    age: int = 0,
) -> str:
    """A batch over exactly these input lines (blank ones kept), created `age` seconds ago
    on a server that served `served`."""
    source = tmp_path / "lines.jsonl"
    source.write_bytes(b"\n".join(raw_lines) + b"\n")
    file_id = store.add_file(source, purpose="batch", filename="lines.jsonl")["id"]
    obj = batch_object(
        input_file_id=file_id,
        endpoint="/v1/embeddings",
        completion_window="24h",
        metadata=None,
        now=int(time.time()) - age,
    )
    store.add_batch(obj, served=served)
    return str(obj["id"])


def embedding_line(custom_id: str, body: Any) -> bytes:
    return orjson.dumps(
        {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body}
    )


def errors(store: Store, batch_id: str) -> list[dict[str, Any]]:
    obj = store.batch(batch_id)
    assert obj is not None and obj["error_file_id"] is not None, obj
    path = store.file_path(obj["error_file_id"])
    assert path is not None
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


async def echo(url: str, body: bytes) -> tuple[int, bytes, str]:
    return 200, orjson.dumps({"echo": orjson.loads(body)["input"]}), ""


async def test_a_line_that_breaks_the_server_fails_alone(tmp_path: Path) -> None:
    """A route that raises (any 500) and a body nested too deep to re-encode fail their own
    lines; the lines around them complete and the batch completes."""
    store = Store(tmp_path / "data")
    batch_id = write_lines(
        store,
        tmp_path,
        [
            embedding_line("a", {"model": "m", "input": "fine"}),
            embedding_line("boom", {"model": "m", "input": "raise"}),
            b'{"custom_id": "deep", "method": "POST", "url": "/v1/embeddings", "body": '
            + b'{"input": '
            + b"[" * 300
            + b'"x"'
            + b"]" * 300
            + b"}}",
            embedding_line("b", {"model": "m", "input": "also fine"}),
        ],
    )

    async def dispatch(url: str, body: bytes) -> tuple[int, bytes, str]:
        if orjson.loads(body)["input"] == "raise":
            raise RuntimeError("the route broke")
        return await echo(url, body)

    await Runner(lambda: store, dispatch, Gate(), max_requests=100).run(batch_id)
    assert [r["custom_id"] for r in output(store, batch_id)] == ["a", "b"]
    failed = {e["custom_id"]: e["error"] for e in errors(store, batch_id)}
    assert failed["boom"]["code"] == "server_error" and failed["boom"]["line"] == 2
    assert failed["deep"]["code"] == "invalid_body" and failed["deep"]["line"] == 3
    obj = store.batch(batch_id)
    assert obj is not None and obj["request_counts"] == {"total": 4, "completed": 2, "failed": 2}
    store.close()


async def test_a_line_that_is_not_json_is_named_by_its_line_number(tmp_path: Path) -> None:
    store = Store(tmp_path / "data")
    lines = [embedding_line(f"c{i}", {"model": "m", "input": str(i)}) for i in range(5)]
    # blank lines count as lines of the file, as an editor shows them
    batch_id = write_lines(store, tmp_path, [lines[0], b"", lines[1], b"{oops", *lines[2:]])
    await Runner(lambda: store, echo, Gate(), max_requests=100).run(batch_id)
    (bad,) = errors(store, batch_id)
    assert bad["error"]["code"] == "invalid_json" and bad["error"]["line"] == 4
    assert bad["error"]["message"].startswith("Line 4 is not valid JSON")
    store.close()


async def test_line_numbers_carry_on_after_a_resume(tmp_path: Path) -> None:
    """Stopped after the first wave and resumed: the numbers count from the file's start."""
    store = Store(tmp_path / "data")
    good = [embedding_line(f"c{i}", {"model": "m", "input": str(i)}) for i in range(4)]
    batch_id = write_lines(store, tmp_path, [good[0], b"", good[1], good[2], b"nope", good[3]])
    stopping = False

    async def dispatch(url: str, body: bytes) -> tuple[int, bytes, str]:
        nonlocal stopping
        stopping = True  # the server stops once the first wave is in
        return await echo(url, body)

    await Runner(lambda: store, dispatch, Gate(stopping=lambda: stopping), 100).run(batch_id)
    assert store.progress(batch_id).lines_read == 2  # one wave (CHUNK = 2) committed
    await Runner(lambda: store, echo, Gate(), max_requests=100).run(batch_id)
    (bad,) = errors(store, batch_id)
    assert bad["error"]["line"] == 5
    store.close()


async def test_a_failed_batch_keeps_the_lines_it_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner itself breaks mid-job (the disk, say): the batch fails, and the output
    committed before that is still a file the client can read."""
    store, batch_id = job(tmp_path)
    syncs = 0
    real_fsync = waves_module.fsync_both

    def fsync(*files: BinaryIO) -> None:
        nonlocal syncs
        syncs += 1
        if syncs == 2:
            raise OSError("disk gone")
        real_fsync(*files)

    monkeypatch.setattr(waves_module, "fsync_both", fsync)
    runner = Runner(lambda: store, echo, Gate(), max_requests=100)
    gate_stop = Gate(stopping=lambda: store.status(batch_id) == "failed")
    runner.gate = gate_stop
    await asyncio.wait_for(runner.serve(), timeout=30)
    obj = store.batch(batch_id)
    assert obj is not None and obj["status"] == "failed"
    assert obj["errors"]["data"][0]["code"] == "server_error"
    path = store.file_path(obj["output_file_id"])
    assert path is not None
    kept = [orjson.loads(line)["custom_id"] for line in path.read_bytes().splitlines()]
    assert kept == ["c0", "c1"]  # the first wave, as committed
    store.close()


def test_ray_actors_get_no_api_key() -> None:
    from openai_compat.batch.ray_job import _actor_settings
    from openai_compat.frame.settings import Settings

    shipped = _actor_settings(Settings(api_key=("top-secret",)))
    assert "top-secret" not in shipped
    assert Settings.model_validate_json(shipped).api_key == ()


async def test_lines_larger_together_than_admission_never_livelock(tmp_path: Path) -> None:
    """A 1-input line beside a 150-input one under an admission limit of 100: the waves are
    cut so admission can take each whole; refused lines are sent again alone, and a line
    that finished is never sent twice."""
    from openai_compat.frame.settings import ModelConfig
    from openai_compat.models.registry import ModelEntry

    store = Store(tmp_path / "data")
    sizes = [1, 150, 2, 3, 120, 1]
    batch_id = write_lines(
        store,
        tmp_path,
        [
            embedding_line(f"c{i}", {"model": "m", "input": [f"t{i}"] * n})
            for i, n in enumerate(sizes)
        ],
    )
    entry = ModelEntry(config=ModelConfig(model="m"), engine=None, capabilities=frozenset())
    sent: list[str] = []

    async def dispatch(url: str, body: bytes) -> tuple[int, bytes, str]:
        inputs = orjson.loads(body)["input"]
        sent.append(inputs[0])
        try:
            with entry.admit(len(inputs), 100):  # the real admission, a model's budget
                await asyncio.sleep(0.01)
        except Exception:
            return 429, b'{"error": {"message": "busy"}}', ""
        return 200, orjson.dumps({"n": len(inputs)}), ""

    runner = Runner(lambda: store, dispatch, Gate(), max_requests=100, admission=100)
    await asyncio.wait_for(runner.run(batch_id), timeout=20)
    records = output(store, batch_id)
    assert [r["response"]["body"]["n"] for r in records] == sizes
    assert sorted(sent) == sorted(f"t{i}" for i in range(len(sizes)))  # each line once
    store.close()


async def test_refused_lines_are_sent_again_without_their_finished_neighbours(
    tmp_path: Path,
) -> None:
    store, batch_id = job(tmp_path)
    sent: list[str] = []
    refusals = {"text 1": 2}  # refused twice, then taken

    async def dispatch(url: str, body: bytes) -> tuple[int, bytes, str]:
        text = orjson.loads(body)["input"][0]
        sent.append(text)
        if refusals.get(text, 0) > 0:
            refusals[text] -= 1
            return 503, b'{"error": {"message": "draining"}}', ""
        return 200, orjson.dumps({"echo": text}), ""

    await Runner(lambda: store, dispatch, Gate(), max_requests=100).run(batch_id)
    assert [r["response"]["body"]["echo"] for r in output(store, batch_id)] == [
        f"text {i}" for i in range(LINES)
    ]
    assert sent.count("text 1") == 3 and sent.count("text 0") == 1
    store.close()


async def test_an_output_file_shorter_than_committed_fails_the_batch_never_padded(
    tmp_path: Path,
) -> None:
    store, batch_id = job(tmp_path)
    stopping = False

    async def dispatch(url: str, body: bytes) -> tuple[int, bytes, str]:
        nonlocal stopping
        stopping = True
        return await echo(url, body)

    await Runner(lambda: store, dispatch, Gate(stopping=lambda: stopping), 100).run(batch_id)
    out = store.batch_dir(batch_id) / "output.jsonl"
    committed = store.progress(batch_id).output_bytes
    assert committed > 0 and out.stat().st_size == committed
    with out.open("r+b") as f:  # the disk lost the tail of what was committed
        f.truncate(committed - 10)
    await Runner(lambda: store, echo, Gate(), max_requests=100).run(batch_id)
    obj = store.batch(batch_id)
    assert obj is not None and obj["status"] == "failed"
    assert obj["errors"]["data"][0]["code"] == "data_lost"
    assert b"\0" not in out.read_bytes()  # never zero-padded
    store.close()


async def test_each_wave_commits_its_counts_without_rewriting_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per wave only the counts and the progress change in the database; the batch object
    (metadata and all) is written when its status changes."""
    store, batch_id = job(tmp_path)
    saves: list[str] = []
    real_save = store.save

    def save(obj: dict[str, Any], progress: Any = None) -> None:
        saves.append(obj["status"])
        real_save(obj, progress)

    monkeypatch.setattr(store, "save", save)
    await Runner(lambda: store, echo, Gate(), max_requests=100).run(batch_id)
    assert saves == ["in_progress", "completed"]  # LINES / CHUNK = 3 waves, no save each
    obj = store.batch(batch_id)
    assert obj is not None
    assert obj["request_counts"] == {"total": LINES, "completed": LINES, "failed": 0}
    store.close()


def test_deleting_a_batch_output_file_frees_its_bytes(tmp_path: Path) -> None:
    store, batch_id = job(tmp_path)
    asyncio.run(Runner(lambda: store, echo, Gate(), max_requests=100).run(batch_id))
    obj = store.batch(batch_id)
    assert obj is not None
    path = store.file_path(obj["output_file_id"])
    assert path is not None and path.stat().st_size > 0
    assert store.delete_file(obj["output_file_id"])
    assert not path.exists()
    store.close()


def test_a_database_from_before_versioning_is_migrated(tmp_path: Path) -> None:
    import json
    import sqlite3

    from openai_compat.batch import schema as schema_module
    from openai_compat.batch import store as store_module

    root = tmp_path / "data"
    root.mkdir()
    db = sqlite3.connect(root / "batch.sqlite3")
    db.executescript(schema_module.MIGRATIONS[0])  # the first layout, user_version 0
    counts = {"total": 5, "completed": 3, "failed": 1}
    db.execute(
        "INSERT INTO batches (id, status, obj) VALUES (?, ?, ?)",
        ("batch_old", "completed", json.dumps({"id": "batch_old", "request_counts": counts})),
    )
    db.commit()
    db.close()
    store = Store(root)
    obj = store.batch("batch_old")
    assert obj is not None and obj["request_counts"] == counts  # backfilled into columns
    (version,) = store._db.execute("PRAGMA user_version").fetchone()
    assert version == schema_module.SCHEMA_VERSION
    store.close()
    newer = sqlite3.connect(root / "batch.sqlite3")
    newer.execute(f"PRAGMA user_version = {schema_module.SCHEMA_VERSION + 1}")
    newer.commit()
    newer.close()
    with pytest.raises(store_module.StoreBusy, match="newer openai-compat"):
        Store(root)


def test_an_upload_is_durable_before_the_database_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its bytes fsynced, then its name (the folder), then the row committed: after a power
    cut the database never lists a file the disk does not have."""
    from contextlib import contextmanager

    from openai_compat.batch import store as store_module

    store = Store(tmp_path / "data")
    events: list[str] = []
    real_fsync, real_dir, real_tx = store_module.os.fsync, store_module.fsync_dir, store._tx
    monkeypatch.setattr(
        store_module.os, "fsync", lambda fd: (events.append("fsync file"), real_fsync(fd))
    )

    def fsync_dir(folder: Path) -> None:
        events.append(f"fsync {folder.name}/")
        with monkeypatch.context() as m:
            m.setattr(store_module.os, "fsync", real_fsync)
            real_dir(folder)

    monkeypatch.setattr(store_module, "fsync_dir", fsync_dir)

    @contextmanager
    def tx() -> Any:
        with real_tx() as db:
            yield db
        events.append("commit")

    monkeypatch.setattr(store, "_tx", tx)
    source = tmp_path / "upload.jsonl"
    source.write_bytes(b"{}\n")
    store.add_file(source, purpose="batch", filename="upload.jsonl")
    assert events == ["fsync file", "fsync files/", "commit"]
    store.close()


async def test_a_batch_that_would_pass_the_quota_fails_keeping_what_it_wrote(
    tmp_path: Path,
) -> None:
    store, batch_id = job(tmp_path)
    store.max_bytes = store.used_bytes() + 450  # the input file and one wave (2 x ~170 bytes)
    await Runner(lambda: store, echo, Gate(), max_requests=100).run(batch_id)
    obj = store.batch(batch_id)
    assert obj is not None and obj["status"] == "failed", obj
    error = obj["errors"]["data"][0]
    assert error["code"] == "quota_exceeded" and "batch_max_data_bytes" in error["message"]
    path = store.file_path(obj["output_file_id"])
    assert path is not None
    kept = [orjson.loads(line)["custom_id"] for line in path.read_bytes().splitlines()]
    assert kept == ["c0", "c1"]  # the first wave; the second would not fit
    assert store.used_bytes() <= store.max_bytes
    store.close()


def test_the_free_disk_floor_refuses_writes(tmp_path: Path) -> None:
    import shutil

    store = Store(tmp_path / "data", min_free=0)
    assert store.room(1000) is None
    store.min_free = shutil.disk_usage(tmp_path).free  # nothing more may be written
    refused = store.room(1)
    assert refused is not None and refused[0] == "disk"
    assert "batch_min_free_bytes" in refused[1]
    store.close()


class Clock:
    """time.time() as the runner sees it: the real one, plus what a test adds."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.real = time.time  # before the patch: runner_module.time is the time module

    def __call__(self) -> float:
        return self.real() + self.offset


async def test_an_expired_batch_writes_a_batch_expired_record_per_line_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, batch_id = job(tmp_path)
    clock = Clock()
    monkeypatch.setattr(runner_module.time, "time", clock)

    async def dispatch(url: str, body: bytes) -> tuple[int, bytes, str]:
        clock.offset = 25 * 3600  # the completion window ends while the first wave runs
        return await echo(url, body)

    gate = Gate(live=lambda: 1)  # no wave sent ahead: the first wave is all that runs
    monkeypatch.setattr(runner_module, "MAX_YIELD", 0.0)
    await Runner(lambda: store, dispatch, gate, max_requests=100).run(batch_id)
    obj = store.batch(batch_id)
    assert obj is not None and obj["status"] == "expired" and obj["expired_at"] is not None
    assert [r["custom_id"] for r in output_of(store, obj)] == ["c0"]
    expired = errors(store, batch_id)
    assert [e["custom_id"] for e in expired] == [f"c{i}" for i in range(1, LINES)]
    assert {e["error"]["code"] for e in expired} == {"batch_expired"}
    assert [e["error"]["line"] for e in expired] == list(range(2, LINES + 1))
    assert obj["request_counts"] == {"total": LINES, "completed": 1, "failed": LINES - 1}
    store.close()


async def test_a_local_cli_job_never_expires(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(tmp_path / "data")
    source = tmp_path / "in.jsonl"
    source.write_bytes(embedding_line("a", {"model": "m", "input": "x"}) + b"\n")
    file_id = store.add_file(source, purpose="batch", filename="in.jsonl")["id"]
    obj = batch_object(
        input_file_id=file_id,
        endpoint="/v1/embeddings",
        completion_window="24h",
        metadata=None,
        now=int(time.time()),
        expires=False,
    )
    assert obj["expires_at"] is None
    store.add_batch(obj)
    clock = Clock()
    clock.offset = 30 * 24 * 3600  # resumed a month later
    monkeypatch.setattr(runner_module.time, "time", clock)
    await Runner(lambda: store, echo, Gate(), max_requests=100).run(obj["id"])
    assert [r["custom_id"] for r in output(store, obj["id"])] == ["a"]
    store.close()


def output_of(store: Store, obj: dict[str, Any]) -> list[dict[str, Any]]:
    path = store.file_path(obj["output_file_id"])
    assert path is not None
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


async def test_a_cancel_is_seen_while_a_wave_is_in_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, batch_id = job(tmp_path)
    monkeypatch.setattr(runner_module, "CANCEL_POLL_S", 0.05)
    sent = asyncio.Event()

    async def stuck(url: str, body: bytes) -> tuple[int, bytes, str]:
        sent.set()
        await asyncio.Event().wait()  # the engine never answers this wave
        raise AssertionError("unreachable")

    run = asyncio.create_task(Runner(lambda: store, stuck, Gate(), max_requests=100).run(batch_id))
    await asyncio.wait_for(sent.wait(), timeout=5)
    store.cancel(batch_id)
    await asyncio.wait_for(run, timeout=5)  # not stuck behind the wave
    obj = store.batch(batch_id)
    assert obj is not None and obj["status"] == "cancelled"
    store.close()


async def test_a_line_past_its_time_limit_fails_alone() -> None:
    from openai_compat.batch.lines import run_line

    async def slow(url: str, body: bytes) -> tuple[int, bytes, str]:
        raise TimeoutError

    result = await run_line(embedding_line("t", {"input": "x"}), "/v1/embeddings", False, slow, 7)
    assert not result.ok
    assert result.record["error"]["code"] == "timeout" and result.record["error"]["line"] == 7


async def test_the_service_enforces_the_line_timeout_through_asgi() -> None:
    """httpx's timeout never fires over ASGITransport: the service's own limit does."""
    import httpx

    from openai_compat.batch.service import BatchService
    from openai_compat.frame.settings import Settings
    from openai_compat.ground.lifecycle import Lifecycle

    async def hanging_app(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.Event().wait()

    service = BatchService(Settings(batch_line_timeout=0.2), Lifecycle())
    service._client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=hanging_app), base_url="http://batch.internal"
    )
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await service._dispatch("/v1/embeddings", b"{}")
    assert time.monotonic() - started < 5
    await service._client.aclose()


def test_the_ray_job_reads_lines_as_the_local_run_does() -> None:
    from openai_compat.batch.ray_job import job_problem, split_lines
    from openai_compat.frame.settings import Settings

    data = b'{"a": 1}\n\n  \n\xff bad\rutf-8\r\n{"b": 2}'
    rows = split_lines({"bytes": data})
    assert [(r["number"], r["line"]) for r in rows] == [
        (1, b'{"a": 1}\n'),
        (4, b"\xff bad\rutf-8\r\n"),  # a bare \r splits nothing, as in a file's lines
        (5, b'{"b": 2}'),
    ]
    settings = Settings(batch_max_requests=2)
    assert job_problem("/v1/embeddings", 2, settings) is None
    assert "batch_max_requests" in (job_problem("/v1/embeddings", 3, settings) or "")
    assert "endpoint must be one of" in (job_problem("/v1/chat/completions", 1, settings) or "")


async def test_store_commits_never_run_on_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every commit waits for the disk (fsync): a slow one (0.3 s here) must not stall the
    loop that serves live requests (each wave's commit ran on it, 537 ms with big metadata)."""
    store, batch_id = job(tmp_path)
    for name in ("commit_wave", "save"):
        real = getattr(store, name)

        def slow(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            time.sleep(0.3)  # a slow disk
            return _real(*args, **kwargs)

        monkeypatch.setattr(store, name, slow)
    lags: list[float] = []
    running = True

    async def ticker() -> None:
        while running:
            started = time.perf_counter()
            await asyncio.sleep(0.01)
            lags.append(time.perf_counter() - started - 0.01)

    tick = asyncio.create_task(ticker())
    await Runner(lambda: store, echo, Gate(), max_requests=100).run(batch_id)
    running = False
    await tick
    assert len(output(store, batch_id)) == LINES
    assert max(lags) < 0.15, sorted(lags)[-3:]
    store.close()


async def test_a_batch_needing_models_this_server_lacks_stays_pending(tmp_path: Path) -> None:
    """Submitted where 'm' was served; a server serving only 'x' leaves it in_progress with a
    pending_reason and sends nothing; a server serving 'm' then runs it. A line naming a model
    the submitting server did not serve either ('typo') does not hold the batch back."""
    store = Store(tmp_path / "data")
    lines = [embedding_line(f"c{i}", {"model": "m", "input": f"t{i}"}) for i in range(3)]
    lines.append(embedding_line("c3", {"model": "typo", "input": "t3"}))
    batch_id = write_lines(store, tmp_path, lines, served=["m", "x"])
    sent: list[str] = []

    async def dispatch(url: str, body: bytes) -> tuple[int, bytes, str]:
        sent.append(orjson.loads(body)["model"])
        return await echo(url, body)

    other = Runner(lambda: store, dispatch, Gate(), 100, served=lambda: frozenset({"x"}))
    await other.run(batch_id)
    await other.run(batch_id)  # again: nothing sent, the reason saved once
    pending = store.batch(batch_id)
    assert pending is not None and pending["status"] == "in_progress" and sent == []
    assert pending["request_counts"]["total"] == 4  # validated: it knows its lines
    assert "'m'" in pending["pending_reason"] and other.pending.waiting == {batch_id: ["m"]}
    assert store.needs(batch_id) == frozenset({"m"})

    right = Runner(lambda: store, dispatch, Gate(), 100, served=lambda: frozenset({"m"}))
    await right.run(batch_id)
    done = store.batch(batch_id)
    assert done is not None and done["status"] == "completed", done
    assert "pending_reason" not in done and right.pending.waiting == {}
    assert sent == ["m", "m", "m", "typo"]


async def test_an_expired_pending_batch_expires_without_its_models(tmp_path: Path) -> None:
    store = Store(tmp_path / "data")
    line = embedding_line("a", {"model": "m", "input": "t"})
    batch_id = write_lines(store, tmp_path, [line], served=["m"], age=25 * 3600)
    await Runner(lambda: store, echo, Gate(), 100, served=lambda: frozenset()).run(batch_id)
    done = store.batch(batch_id)
    assert done is not None and done["status"] == "expired"
    assert errors(store, batch_id)[0]["error"]["code"] == "batch_expired"
