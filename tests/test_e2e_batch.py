"""OpenAI's Files and Batch APIs with the openai SDK, unchanged; a job that survives kill -9.

Job state lives in SQLite under --data-dir; every number in an output line is checked against
the live endpoint for the same input.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.utils import ROOT, SERVER_ENV, RemoteServer, live_pids

pytestmark = pytest.mark.slow

MODEL = "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RemoteServer]:
    data = tmp_path_factory.mktemp("batch-data")
    with RemoteServer(["--data-dir", str(data), "--batch-max-file-bytes", "200000"]) as server:
        yield server


def _client(srv: RemoteServer) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)


def _line(custom_id: str, body: dict[str, Any], url: str = "/v1/embeddings") -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}).encode()


def _wait(client: Any, batch_id: str, timeout: float = 180) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        time.sleep(0.2)
    raise TimeoutError(f"batch {batch_id} still {batch.status}")


def _jsonl(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_openai_sdk_batch_round_trip(srv: RemoteServer) -> None:
    client = _client(srv)
    texts = [
        f"sentence number {i} about {'cats' if i % 2 else 'the stock market'}" for i in range(40)
    ]
    bodies: list[dict[str, Any]] = [{"model": MODEL, "input": [t, t.upper()]} for t in texts]
    for i in range(0, len(bodies), 5):
        bodies[i]["dimensions"] = 128
    lines = [_line(f"req-{i}", body) for i, body in enumerate(bodies)]
    bad = [
        b"{not json",
        _line("wrong-url", {"model": MODEL, "input": "x"}, url="/v1/chat/completions"),
        _line("unknown-model", {"model": "nope", "input": "x"}),
        _line("req-3", {"model": MODEL, "input": "a repeated custom_id"}),
    ]
    content = b"\n".join(lines[:20] + bad + lines[20:]) + b"\n"
    uploaded = client.files.create(file=("input.jsonl", content), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(content)
    assert client.files.content(uploaded.id).content == content
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/embeddings",
        completion_window="24h",
        metadata={"job": "round-trip"},
    )
    assert batch.status == "validating" and batch.metadata == {"job": "round-trip"}
    done = _wait(client, batch.id)
    assert done.status == "completed", done
    assert done.request_counts.total == 44
    assert done.request_counts.completed == 40 and done.request_counts.failed == 4
    assert done.completed_at >= done.in_progress_at >= done.created_at

    output = _jsonl(client.files.content(done.output_file_id).text)
    assert sorted(o["custom_id"] for o in output) == sorted(f"req-{i}" for i in range(40))
    for o in output:
        i = int(o["custom_id"].split("-")[1])
        live = httpx.post(srv.base_url + "/embeddings", json=bodies[i]).json()
        assert o["response"]["status_code"] == 200 and o["error"] is None
        got = [d["embedding"] for d in o["response"]["body"]["data"]]
        np.testing.assert_allclose(got, [d["embedding"] for d in live["data"]], atol=1e-5)
        assert len(got[0]) == (128 if i % 5 == 0 else 384)
        assert o["response"]["request_id"] and o["id"].startswith("batch_req_")

    errors = {e["custom_id"]: e for e in _jsonl(client.files.content(done.error_file_id).text)}
    assert len(errors) == 4 and None in errors  # the unparseable line has no custom_id
    assert errors[None]["error"]["code"] == "invalid_json"
    assert errors["wrong-url"]["error"]["code"] == "invalid_url"
    assert errors["unknown-model"]["response"]["status_code"] == 404
    assert errors["unknown-model"]["response"]["body"]["error"]["code"] == "model_not_found"
    assert errors["req-3"]["error"]["code"] == "duplicate_custom_id"

    listed = client.batches.list(limit=10)
    assert done.id in [b.id for b in listed.data]
    files = {f.id: f for f in client.files.list()}
    assert files[done.output_file_id].purpose == "batch_output"
    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(Exception) as info:
        client.files.retrieve(uploaded.id)
    assert getattr(info.value, "status_code", None) == 404


def test_base64_lines_decode_to_the_floats(srv: RemoteServer) -> None:
    client = _client(srv)
    body = {"model": MODEL, "input": "decode me", "encoding_format": "base64"}
    up = client.files.create(file=("b.jsonl", _line("b64", body)), purpose="batch")
    done = _wait(
        client,
        client.batches.create(
            input_file_id=up.id, endpoint="/v1/embeddings", completion_window="24h"
        ).id,
    )
    (out,) = _jsonl(client.files.content(done.output_file_id).text)
    got = np.frombuffer(base64.b64decode(out["response"]["body"]["data"][0]["embedding"]), "<f4")
    live = httpx.post(srv.base_url + "/embeddings", json={"model": MODEL, "input": "decode me"})
    np.testing.assert_allclose(got, live.json()["data"][0]["embedding"], atol=1e-6)


def test_rerank_batches_too(srv: RemoteServer) -> None:
    client = _client(srv)
    body = {"model": MODEL, "query": "pasta", "documents": ["cook pasta", "stock market"]}
    up = client.files.create(file=("r.jsonl", _line("r", body, url="/v1/rerank")), purpose="batch")
    done = _wait(
        client,
        client.batches.create(
            input_file_id=up.id, endpoint="/v1/rerank", completion_window="24h"
        ).id,
    )
    (out,) = _jsonl(client.files.content(done.output_file_id).text)
    live = httpx.post(srv.base_url + "/rerank", json=body).json()
    got = out["response"]["body"]["results"]
    assert [r["index"] for r in got] == [r["index"] for r in live["results"]]
    assert [r["relevance_score"] for r in got] == pytest.approx(
        [r["relevance_score"] for r in live["results"]], abs=1e-6
    )


def test_bad_requests_are_clear_4xx(srv: RemoteServer) -> None:
    url = srv.base_url
    ok = httpx.post(url + "/files", files={"file": ("x.jsonl", b"{}\n")}, data={"purpose": "batch"})
    assert ok.status_code == 200
    r = httpx.post(
        url + "/files", files={"file": ("x.jsonl", b"{}\n")}, data={"purpose": "fine-tune"}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_purpose"
    r = httpx.post(url + "/files", data={"purpose": "batch"}, files={"other": ("x", b"1")})
    assert r.status_code == 400 and r.json()["error"]["param"] == "file"
    big = b"x" * 200_001
    r = httpx.post(url + "/files", files={"file": ("big.jsonl", big)}, data={"purpose": "batch"})
    assert r.status_code == 413 and "200000" in r.json()["error"]["message"]
    create = {
        "input_file_id": ok.json()["id"],
        "endpoint": "/v1/embeddings",
        "completion_window": "24h",
    }
    r = httpx.post(url + "/batches", json={**create, "input_file_id": "file-nope"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "file_not_found"
    r = httpx.post(url + "/batches", json={**create, "endpoint": "/v1/chat/completions"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_endpoint"
    r = httpx.post(url + "/batches", json={**create, "completion_window": "1h"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "completion_window"
    assert httpx.get(url + "/files/file-nope").status_code == 404
    assert httpx.get(url + "/batches/batch_nope").status_code == 404
    assert httpx.post(url + "/batches/batch_nope/cancel").status_code == 404
    assert httpx.get(url + "/batches", params={"limit": 0}).status_code == 400


def _debug_server(data: Path, *args: str) -> RemoteServer:
    cfg = data.parent / "debug.toml"
    cfg.write_text(
        '[[models]]\nname = "debug"\nmodel = "debug/engine"\nengine = "debugengine"\n'
        "batch_size = 16\n"
    )
    return RemoteServer(
        ["--config", str(cfg), "--data-dir", str(data), *args],
        env={"OPENAI_COMPAT_TEST_BATCH_SECONDS": "0.05"},
        slow_engine=True,
    )


def test_live_requests_beside_a_huge_batch_line_are_never_refused(tmp_path: Path) -> None:
    """One batch line reranks 1,200 documents (about 4 s of engine time here, 75 batches
    of 0.05 s) on a model that admits 200 inputs at once: the job has its own admission
    budget, so 30 live requests meanwhile are all answered, none 429."""
    import concurrent.futures

    with _debug_server(tmp_path / "data", "--max-queued-inputs", "200") as srv:
        client = _client(srv)
        docs = [f"document {i}" for i in range(1200)]
        line = _line("big", {"model": "debug", "query": "q", "documents": docs}, url="/v1/rerank")
        up = client.files.create(file=("r.jsonl", line), purpose="batch")
        batch = client.batches.create(
            input_file_id=up.id, endpoint="/v1/rerank", completion_window="24h"
        )
        deadline = time.monotonic() + 30
        while _metric(srv, "openai_compat_queued_inputs") < 1000:  # the line is in the engine
            assert time.monotonic() < deadline, "the batch line never reached the engine"
            time.sleep(0.02)

        def live(i: int) -> int:
            body = {"model": "debug", "input": f"live {i}"}
            return httpx.post(srv.base_url + "/embeddings", json=body, timeout=60).status_code

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(live, range(30)))
        assert statuses == [200] * 30
        done = _wait(client, batch.id, timeout=120)
        assert done.status == "completed" and done.request_counts.completed == 1


def _metric(srv: RemoteServer, name: str) -> float:
    """A gauge's value summed over its labels, from /metrics."""
    total = 0.0
    for row in httpx.get(srv.url + "/metrics").text.splitlines():
        if row.startswith(name + "{") or row.startswith(name + " "):
            total += float(row.rsplit(" ", 1)[1])
    return total


def test_cancel_and_list_pagination(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with _debug_server(data) as srv:
        client = _client(srv)
        content = b"\n".join(
            _line(f"c{i}", {"model": "debug", "input": f"t{i}"}) for i in range(400)
        )
        up = client.files.create(file=("c.jsonl", content), purpose="batch")
        ids = [
            client.batches.create(
                input_file_id=up.id, endpoint="/v1/embeddings", completion_window="24h"
            ).id
            for _ in range(3)
        ]
        deadline = time.monotonic() + 60
        while client.batches.retrieve(ids[0]).request_counts.completed == 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        cancelling = client.batches.cancel(ids[0])
        assert cancelling.status == "cancelling"
        done = _wait(client, ids[0])
        assert done.status == "cancelled" and done.cancelled_at
        output = _jsonl(client.files.content(done.output_file_id).text)
        assert 0 < len(output) < 400 == done.request_counts.total
        assert len({o["custom_id"] for o in output}) == len(output)
        page1 = client.batches.list(limit=2)
        assert [b.id for b in page1.data] == [ids[2], ids[1]] and page1.has_more
        page2 = client.batches.list(limit=2, after=ids[1])
        assert [b.id for b in page2.data] == [ids[0]] and not page2.has_more
        r = httpx.delete(srv.base_url + f"/files/{up.id}")  # still read by the open batches
        assert r.status_code == 400 and r.json()["error"]["code"] == "file_in_use"


def _killed_mid_job(data: Path, content: bytes, *, completed: int) -> str:
    """A job on a debug server over `data`, killed with SIGKILL once `completed` lines are
    done; its id."""
    srv = _debug_server(data)
    try:
        client = _client(srv)
        up = client.files.create(file=("k.jsonl", content), purpose="batch")
        batch = client.batches.create(
            input_file_id=up.id, endpoint="/v1/embeddings", completion_window="24h"
        )
        deadline = time.monotonic() + 120
        while client.batches.retrieve(batch.id).request_counts.completed < completed:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        srv.signal(signal.SIGKILL)
        srv.proc.wait(10)
    finally:
        srv.stop()
    return str(batch.id)


def test_a_job_survives_kill_9_without_losing_or_repeating_a_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    n = 3000
    content = b"\n".join(
        _line(f"k{i}", {"model": "debug", "input": "x" * (i % 50 + 1)}) for i in range(n)
    )
    batch_id = _killed_mid_job(data, content, completed=200)
    with _debug_server(data) as again:
        client = _client(again)
        before = client.batches.retrieve(batch_id)
        assert before.status == "in_progress" and 0 < before.request_counts.completed < n
        done = _wait(client, batch_id, timeout=300)
        assert done.status == "completed" and done.request_counts.completed == n
        output = _jsonl(client.files.content(done.output_file_id).text)
    ids = [o["custom_id"] for o in output]
    assert len(ids) == n and set(ids) == {f"k{i}" for i in range(n)}
    for o in output:  # the debug engine's vector: the input's length, repeated
        i = int(o["custom_id"][1:])
        assert o["response"]["body"]["data"][0]["embedding"][0] == i % 50 + 1


def test_a_server_with_other_models_leaves_the_job_pending(tmp_path: Path) -> None:
    """A quick experiment on the same data dir (the default server: MiniLM only) must not
    adopt a job for 'debug' and fail its lines with 404: it stays in_progress, says why,
    and the next server that serves 'debug' finishes it."""
    data = tmp_path / "data"
    n = 600
    content = b"\n".join(_line(f"k{i}", {"model": "debug", "input": "x" * 5}) for i in range(n))
    batch_id = _killed_mid_job(data, content, completed=50)
    with RemoteServer(["--data-dir", str(data)]) as other:
        client = _client(other)
        deadline = time.monotonic() + 60
        while httpx.get(other.url + "/ready").json()["batch_runner"]["pending_other_models"] != 1:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        waiting = client.batches.retrieve(batch_id)
        time.sleep(1.5)  # the runner's loop comes round again: still nothing run
        again = client.batches.retrieve(batch_id)
        assert again.status == "in_progress" and again.request_counts.failed == 0
        assert again.request_counts.completed == waiting.request_counts.completed < n
        assert "'debug'" in (again.model_extra or {})["pending_reason"]
    with _debug_server(data) as back:
        client = _client(back)
        done = _wait(client, batch_id, timeout=300)
        assert done.status == "completed" and done.request_counts.completed == n
        assert "pending_reason" not in (done.model_extra or {})


# ---------------------------------------------------------------- the CLI


def _cli(
    args: list[str], *, slow: bool = False, env: dict[str, str] | None = None, **kw: Any
) -> subprocess.Popen[bytes]:
    env = {**os.environ, **SERVER_ENV, **(env or {})}
    if slow:
        env["OPENAI_COMPAT_TEST_BATCH_SECONDS"] = "0.05"
        env["OPENAI_COMPAT_CACHE_BYTES"] = "0"  # repeated texts must cost engine time
    module = "tests.slow_engine" if slow else "openai_compat"
    return subprocess.Popen(
        [sys.executable, "-m", module, "batch", *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        # Ctrl-C as a user's terminal delivers it, however this suite was started: a suite
        # run under nohup or as a background job ignores SIGINT, and children inherit that.
        preexec_fn=_default_sigint,
        **kw,
    )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_cli_output_equals_the_servers(srv: RemoteServer, tmp_path: Path) -> None:
    bodies = [{"model": MODEL, "input": f"line {i} of the corpus"} for i in range(30)]
    source = tmp_path / "in.jsonl"
    source.write_bytes(
        b"\n".join([_line(f"q{i}", b) for i, b in enumerate(bodies)] + [b"[1, 2]"]) + b"\n"
    )
    out = tmp_path / "out.jsonl"
    proc = _cli([str(source), "-o", str(out)])
    log = proc.communicate(timeout=300)[0].decode(errors="replace")
    assert proc.returncode == 0, log[-3000:]
    assert "30 lines ->" in log and "1 failed ->" in log
    assert not (tmp_path / "out.jsonl.state").exists()  # done: the state is gone
    output = {o["custom_id"]: o for o in _jsonl(out.read_text())}
    assert sorted(output) == sorted(f"q{i}" for i in range(30))
    for i, body in enumerate(bodies):
        live = httpx.post(srv.base_url + "/embeddings", json=body).json()
        got = output[f"q{i}"]["response"]["body"]["data"][0]["embedding"]
        np.testing.assert_allclose(got, live["data"][0]["embedding"], atol=1e-5)
    (error,) = _jsonl((tmp_path / "out.errors.jsonl").read_text())
    assert error["error"]["code"] == "invalid_request"
    again = _cli([str(source), "-o", str(out)])  # done already: refuses to redo it silently
    assert again.wait(120) == 2


def test_cli_interrupted_then_rerun_continues_without_duplicates(tmp_path: Path) -> None:
    cfg = tmp_path / "debug.toml"
    cfg.write_text(
        '[[models]]\nname = "debug"\nmodel = "debug/engine"\nengine = "debugengine"\n'
        "batch_size = 16\n"
    )
    n = 2000
    source = tmp_path / "in.jsonl"
    source.write_bytes(
        b"\n".join(
            _line(f"r{i}", {"model": "debug", "input": "y" * (i % 30 + 1)}) for i in range(n)
        )
    )
    out = tmp_path / "out.jsonl"
    state = tmp_path / "out.jsonl.state"
    args = [str(source), "-o", str(out), "--config", str(cfg)]
    first = _cli(args, slow=True)

    def lines_read() -> int:
        db = state / "batch.sqlite3"
        if not db.exists():
            return 0
        with contextlib.closing(sqlite3.connect(db)) as con:
            try:
                row = con.execute("SELECT lines_read FROM batches").fetchone()
            except sqlite3.OperationalError:  # created, schema not written yet
                return 0
        return int(row[0]) if row else 0

    deadline = time.monotonic() + 120
    while lines_read() < 160:
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    first.send_signal(signal.SIGINT)  # Ctrl-C
    log = first.communicate(timeout=60)[0].decode(errors="replace")
    assert first.returncode == 130, log[-3000:]
    assert "run the same command again to continue" in log
    done_before = lines_read()
    assert 0 < done_before < n and not out.exists()
    kept = _jsonl((state / "batches").glob("*/output.jsonl").__next__().read_text())
    kept = kept[:done_before]
    second = _cli(args, slow=True)
    log = second.communicate(timeout=300)[0].decode(errors="replace")
    assert second.returncode == 0, log[-3000:]
    output = _jsonl(out.read_text())
    assert [o["custom_id"] for o in output] == [f"r{i}" for i in range(n)]  # input order, once
    assert output[:done_before] == kept  # the first run's lines kept as written, not redone


def _ray_workers() -> set[int]:
    """PIDs of live Ray Data actor processes running our LineWorker (zombies excluded)."""
    return live_pids(b"LineWorker")


def test_ray_job_output_equals_the_local_run(tmp_path: Path) -> None:
    """A local Ray instance (this machine's 2 CPUs), 2 actors: the same lines, in the same
    order, with the same vectors and the same failures as the local CLI run; afterwards no
    actor process is left holding its models. An API key is set: the actors need none."""
    before = _ray_workers()
    bodies = [{"model": MODEL, "input": [f"ray line {i}", f"second text {i}"]} for i in range(40)]
    lines = [_line(f"y{i}", b) for i, b in enumerate(bodies)]
    lines[10:10] = [b"not json", _line("y3", bodies[3]), _line("bad-url", bodies[0], url="/x")]
    lines[20:20] = [b'{"custom_id": "\xff"}']  # an invalid UTF-8 byte fails its line alone
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    local, ray = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    keyed = {"OPENAI_COMPAT_API_KEYS": "batch-secret"}
    first = _cli([str(source), "-o", str(local)], env=keyed)
    log = first.communicate(timeout=300)[0].decode(errors="replace")
    assert first.returncode == 0, log[-3000:]
    # a local instance advertises the machine's interface address unless Ray takes clusters
    # to be off: then it stays on 127.0.0.1
    second = _cli(
        [str(source), "-o", str(ray), "--ray", "--ray-actors", "2", "--ray-cpus-per-actor", "0.5"],
        env={**keyed, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
    )
    log = second.communicate(timeout=600)[0].decode(errors="replace")
    assert second.returncode == 0, log[-3000:]
    assert "40 lines ->" in log and "4 failed ->" in log
    deadline = time.monotonic() + 30  # actors exit gracefully, a moment after the driver
    while (left := _ray_workers() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left:  # do not leave them to the rest of the suite either
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"Ray actor processes outlived the job: {left}"
    mine, theirs = _jsonl(ray.read_text()), _jsonl(local.read_text())
    assert (
        [o["custom_id"] for o in mine]
        == [o["custom_id"] for o in theirs]
        == [f"y{i}" for i in range(40)]
    )
    for a, b in zip(mine, theirs, strict=True):
        assert a["response"]["status_code"] == b["response"]["status_code"] == 200
        np.testing.assert_allclose(
            [d["embedding"] for d in a["response"]["body"]["data"]],
            [d["embedding"] for d in b["response"]["body"]["data"]],
            atol=1e-5,
        )
        assert a["response"]["body"]["usage"] == b["response"]["body"]["usage"]
    errors = _jsonl((tmp_path / "ray.errors.jsonl").read_text())
    local_errors = _jsonl((tmp_path / "local.errors.jsonl").read_text())
    assert (
        [(e["custom_id"], e["error"]["code"], e["error"].get("line")) for e in errors]
        == [(e["custom_id"], e["error"]["code"], e["error"].get("line")) for e in local_errors]
        == [
            (None, "invalid_json", 11),
            ("y3", "duplicate_custom_id", 12),
            ("bad-url", "invalid_url", 13),
            (None, "invalid_json", 21),
        ]
    )


def test_two_servers_cannot_share_a_data_dir(tmp_path: Path) -> None:
    """Two runners on one database would run every job twice: the second process gets a
    clear 503 on the Batch API instead, and serves everything else."""
    data = tmp_path / "data"
    with _debug_server(data) as first, _debug_server(data) as second:
        # reading an unused Batch API creates nothing
        assert httpx.get(first.base_url + "/batches").json()["data"] == []
        assert httpx.get(first.base_url + "/files").json()["data"] == []
        assert httpx.get(first.base_url + "/batches/batch_x").status_code == 404
        assert not data.exists()
        upload = {"file": ("a.jsonl", _line("a", {"model": "debug", "input": "x"}))}
        ok = httpx.post(first.base_url + "/files", files=upload, data={"purpose": "batch"})
        assert ok.status_code == 200
        busy = httpx.post(second.base_url + "/files", files=upload, data={"purpose": "batch"})
        assert busy.status_code == 503 and busy.json()["error"]["code"] == "data_dir_in_use"
        assert "its own --data-dir" in busy.json()["error"]["message"]
        live = httpx.post(second.base_url + "/embeddings", json={"model": "debug", "input": "x"})
        assert live.status_code == 200
