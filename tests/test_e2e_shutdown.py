"""SIGTERM while requests are in flight: readiness drops at once, new work is refused, every
request in flight completes with 200, and the process exits 0 within the grace time."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from tests.utils import RemoteServer

pytestmark = pytest.mark.slow


def test_sigterm_drains_in_flight_requests_then_exits_zero() -> None:
    srv = RemoteServer(["--graceful-timeout", "60"])
    try:
        sentence = "The quick brown fox jumps over the lazy dog near the quiet river bank. " * 3
        results: list[int] = []
        lock = threading.Lock()

        def work(i: int) -> None:
            body = {
                "model": "all-MiniLM-L6-v2",
                "input": [f"{i} {j} {sentence}" for j in range(200)],
            }
            r = httpx.post(srv.base_url + "/embeddings", json=body, timeout=120)
            assert len(r.json()["data"]) == 200 if r.status_code == 200 else True
            with lock:
                results.append(r.status_code)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # well inside the several seconds these need on 2 cores
        assert not results, "requests finished before the signal; make them heavier"
        signal_at = time.monotonic()
        srv.signal(signal.SIGTERM)
        time.sleep(0.3)

        ready = httpx.get(srv.url + "/ready", timeout=5)
        assert ready.status_code == 503 and ready.json()["error"]["code"] == "draining"
        assert httpx.get(srv.url + "/health", timeout=5).status_code == 200
        refused = httpx.post(
            srv.base_url + "/embeddings", json={"model": "all-MiniLM-L6-v2", "input": "late"}
        )
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "draining"
        assert refused.headers["retry-after"] == "1"

        for t in threads:
            t.join(120)
        assert results == [200] * 6
        assert srv.proc.wait(60) == 0
        assert time.monotonic() - signal_at < 60
        assert "drained; shutting down" in srv.output()
    finally:
        srv.stop()


def test_sigterm_when_idle_exits_zero_quickly() -> None:
    srv = RemoteServer()
    try:
        start = time.monotonic()
        srv.signal(signal.SIGTERM)
        assert srv.proc.wait(30) == 0
        assert time.monotonic() - start < 15
    finally:
        srv.stop()
