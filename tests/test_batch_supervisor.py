"""The batch runner is supervised: a crash is logged and the runner restarted, a data dir
held by another process is waited for, and /ready says which (in-process app, debug model)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from openai_compat.batch import service as service_module
from openai_compat.batch.store import Store
from openai_compat.frame.settings import ModelConfig, Settings
from tests.utils import app_client


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service_module, "RESTART_MIN_S", 0.01)
    monkeypatch.setattr(service_module, "STORE_RETRY_S", 0.05)


def _settings(data: Path) -> Settings:
    return Settings(
        models=(ModelConfig(model="debug/engine", name="debug", engine="debugengine"),),
        data_dir=data,
    )


async def _runner(client: httpx.AsyncClient, state: str, restarts: int = 0) -> dict[str, Any]:
    """The runner's status once it is in `state` after at least `restarts` restarts (between
    two crashes it is briefly "running" too)."""
    for _ in range(200):
        status: dict[str, Any] = (await client.get("/ready")).json()["batch_runner"]
        if status["state"] == state and status["restarts"] >= restarts:
            return status
        await asyncio.sleep(0.02)
    raise AssertionError(f"the runner never became {state!r}: {status}")


async def _run_one_batch(client: httpx.AsyncClient) -> dict[str, Any]:
    line = b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", '
    line += b'"body": {"model": "debug", "input": "abc"}}'
    up = await client.post(
        "/v1/files", files={"file": ("a.jsonl", line)}, data={"purpose": "batch"}
    )
    assert up.status_code == 200, up.text
    body = {"input_file_id": up.json()["id"], "endpoint": "/v1/embeddings"}
    created = await client.post("/v1/batches", json={**body, "completion_window": "24h"})
    assert created.status_code == 200, created.text
    for _ in range(500):
        batch: dict[str, Any] = (await client.get(f"/v1/batches/{created.json()['id']}")).json()
        if batch["status"] in ("completed", "failed"):
            return batch
        await asyncio.sleep(0.02)
    raise AssertionError(f"batch still {batch['status']}")


async def test_a_crashed_runner_is_restarted_and_ready_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    crashes = 0
    real_open_batches = Store.open_batch_owners

    def open_batches(self: Store) -> list[tuple[str, str]]:
        nonlocal crashes
        if crashes < 2:  # the store breaks under the runner twice (a disk error, say)
            crashes += 1
            raise OSError("disk I/O error")
        return real_open_batches(self)

    monkeypatch.setattr(Store, "open_batch_owners", open_batches)
    monkeypatch.setattr(service_module, "RESTART_MIN_S", 0.3)  # long enough to be seen
    async with app_client(_settings(tmp_path / "data")) as client:
        assert (await client.get("/ready")).json()["batch_runner"]["state"] == "idle"
        await client.get("/v1/files")  # reading creates nothing: still idle
        await _run_one_batch_started(client)
        status = await _runner(client, "restarting")
        assert status["error"] == "OSError: disk I/O error" and status["restarts"] >= 1
        status = await _runner(client, "running", restarts=2)
        assert status["restarts"] == 2 and "error" not in status
        batch = await _run_one_batch(client)
        assert batch["status"] == "completed"


async def _run_one_batch_started(client: httpx.AsyncClient) -> None:
    """The first upload creates the database; the runner then opens the store."""
    up = await client.post(
        "/v1/files", files={"file": ("s.jsonl", b"{}\n")}, data={"purpose": "batch"}
    )
    assert up.status_code == 200, up.text


async def test_a_runner_waits_for_a_data_dir_another_process_holds(tmp_path: Path) -> None:
    data = tmp_path / "data"
    holder = Store(data)  # another server's store: it holds the data dir's lock
    async with app_client(_settings(data)) as client:
        status = await _runner(client, "waiting_for_data_dir")
        assert "in use by another openai-compat process" in status["error"]
        holder.close()  # that server stopped
        await _runner(client, "running")
        batch = await _run_one_batch(client)
        assert batch["status"] == "completed" and batch["request_counts"]["completed"] == 1


def test_threads_opening_the_store_at_once_share_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A route's thread and the runner both open the store first: without one lock the
    second Store in this process found the data dir's lock taken (503 data_dir_in_use, or a
    runner waiting 5 s), seen as a flaky restart count under load."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from openai_compat.batch.service import BatchService
    from openai_compat.ground.lifecycle import Lifecycle

    real_init = Store.__init__

    def slow_init(self: Store, *args: Any, **kwargs: Any) -> None:
        time.sleep(0.05)  # every opener is inside the constructor at once
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(Store, "__init__", slow_init)
    service = BatchService(_settings(tmp_path / "data"), Lifecycle())
    start = threading.Barrier(6)

    def open_store(_: int) -> Store:
        start.wait()
        return service.store

    with ThreadPoolExecutor(6) as pool:
        stores = list(pool.map(open_store, range(6)))
    assert all(s is stores[0] for s in stores)
    stores[0].close()
