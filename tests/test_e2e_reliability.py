"""Auth, limits, request ids, metrics, JSON logs, overload and disconnects on a live server."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import cohere
import httpx
import numpy as np
import openai
import pytest

from tests.utils import RemoteServer

pytestmark = pytest.mark.slow

MODEL = "all-MiniLM-L6-v2"


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> RemoteServer:
    """Two API keys from the environment, a small body cap, JSON logs."""
    srv = RemoteServer(
        ["--max-body-bytes", "20000", "--log-format", "json"],
        env={"OPENAI_COMPAT_API_KEYS": "key-one,key-two"},
        wait_ready=False,
    )
    srv.wait_ready()
    yield srv  # type: ignore[misc]
    srv.stop()


def test_keys_through_the_openai_sdk(secured: RemoteServer) -> None:
    bad = openai.OpenAI(base_url=secured.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.embeddings.create(model=MODEL, input="x")
    assert info.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    for key in ("key-one", "key-two"):
        good = openai.OpenAI(base_url=secured.base_url, api_key=key, max_retries=0)
        assert len(good.embeddings.create(model=MODEL, input="x").data[0].embedding) == 384


def test_keys_through_the_cohere_sdk(secured: RemoteServer) -> None:
    docs = ["Boil the pasta.", "Taxes rose."]
    with pytest.raises(cohere.UnauthorizedError):
        cohere.ClientV2(base_url=secured.url, api_key="nope").rerank(
            model=MODEL, query="pasta", documents=docs
        )
    ok = cohere.ClientV2(base_url=secured.url, api_key="key-two").rerank(
        model=MODEL, query="pasta", documents=docs
    )
    assert ok.results[0].index == 0


def test_probes_and_metrics_stay_open(secured: RemoteServer) -> None:
    assert httpx.get(secured.url + "/health").status_code == 200
    assert httpx.get(secured.url + "/ready").status_code == 200
    assert httpx.get(secured.url + "/metrics").status_code == 200
    r = httpx.post(secured.base_url + "/embeddings", json={"model": MODEL, "input": "x"})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"]["code"] == "invalid_api_key"


def test_docs_and_metrics_can_be_protected(tmp_path: Path) -> None:
    cfg = tmp_path / "debug.toml"
    cfg.write_text('[[models]]\nname = "d"\nmodel = "debug/engine"\nengine = "debugengine"\n')
    args = ["--api-key", "k", "--protect-docs-and-metrics", "--config", str(cfg)]
    with RemoteServer(args) as srv:  # /ready needs no key, so waiting works
        for path in ("/metrics", "/docs", "/openapi.json"):
            assert httpx.get(srv.url + path).status_code == 401
            r = httpx.get(srv.url + path, headers={"Authorization": "Bearer k"})
            assert r.status_code == 200


def test_oversized_bodies_get_413(secured: RemoteServer) -> None:
    headers = {"Authorization": "Bearer key-one"}
    big = {"model": MODEL, "input": ["word " * 1000] * 5}
    r = httpx.post(secured.base_url + "/embeddings", json=big, headers=headers)
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    assert "(the server's --max-body-bytes)" in r.json()["error"]["message"]  # #61.16

    def chunks():  # no Content-Length: the limit applies while streaming
        yield b'{"model": "all-MiniLM-L6-v2", "input": ["'
        for _ in range(30):
            yield b"x" * 1000
        yield b'"]}'

    r = httpx.post(secured.base_url + "/embeddings", content=chunks(), headers=headers)
    assert r.status_code == 413


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b"null",
        b'"text"',
        b'{"model": "all-MiniLM-L6-v2", "input": "x", "dimensions": 100000000000000000000000}',
        b'{"model": "all-MiniLM-L6-v2", "input": [[99999999999999999999999]]}',
        b'{"model": "all-MiniLM-L6-v2", "input": "x", "encoding_format": 5}',
        b'{"model": ["a"], "input": "x"}',
        b'{"model": "all-MiniLM-L6-v2", "input": [1.5, 2.5]}',
        b'{"model": "all-MiniLM-L6-v2", "input": "\\ud800"}',
    ],
)
def test_malformed_and_hostile_bodies_are_4xx(secured: RemoteServer, body: bytes) -> None:
    r = httpx.post(
        secured.base_url + "/embeddings",
        content=body,
        headers={"Authorization": "Bearer key-one", "Content-Type": "application/json"},
    )
    assert 400 <= r.status_code < 500, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    ("extra", "status", "param"),
    [
        ({"top_n": 10**30}, 200, None),  # more than there are documents: all of them
        ({"max_tokens_per_doc": 10**30}, 200, None),  # above the model's own limit: no cut
        ({"top_n": -5}, 400, "top_n"),
        ({"top_n": 0}, 400, "top_n"),
        ({"max_tokens_per_doc": 0}, 400, "max_tokens_per_doc"),
    ],
)
def test_hostile_rerank_numbers(
    secured: RemoteServer, extra: dict[str, int], status: int, param: str | None
) -> None:
    headers = {"Authorization": "Bearer key-one"}
    body = {"model": MODEL, "query": "q", "documents": ["a", "b"], **extra}
    r = httpx.post(secured.url + "/v2/rerank", json=body, headers=headers)
    assert r.status_code == status, r.text
    if status == 200:
        assert sorted(x["index"] for x in r.json()["results"]) == [0, 1]
    else:  # Cohere's error body: the message names the field
        assert set(r.json()) == {"message"} and f"'{param}'" in r.json()["message"]


def test_request_ids_are_honoured_or_made(secured: RemoteServer) -> None:
    headers = {"Authorization": "Bearer key-one", "X-Request-Id": "trace-42"}
    r = httpx.post(
        secured.base_url + "/embeddings", json={"model": MODEL, "input": "x"}, headers=headers
    )
    assert r.headers["x-request-id"] == "trace-42"
    made = httpx.get(secured.url + "/health").headers["x-request-id"]
    assert len(made) == 32 and made != "trace-42"


def test_json_access_log_line_per_request(secured: RemoteServer) -> None:
    headers = {"Authorization": "Bearer key-one", "X-Request-Id": "log-me-7"}
    httpx.post(
        secured.base_url + "/embeddings",
        json={"model": MODEL, "input": ["a", "b"]},
        headers=headers,
    )
    time.sleep(0.3)
    lines = [json.loads(ln) for ln in secured.output().splitlines() if ln.startswith("{")]
    (line,) = [ln for ln in lines if ln.get("request_id") == "log-me-7"]
    assert line["logger"] == "openai_compat.access" and line["route"] == "/v1/embeddings"
    assert line["model"] == MODEL and line["inputs"] == 2 and line["tokens"] == 6
    assert line["status"] == 200 and line["latency_ms"] > 0


def test_metrics_count_requests_inputs_tokens_and_models(secured: RemoteServer) -> None:
    headers = {"Authorization": "Bearer key-one"}
    before = httpx.get(secured.url + "/metrics").text
    for _ in range(3):
        httpx.post(
            secured.base_url + "/embeddings",
            json={"model": MODEL, "input": ["hello world"]},
            headers=headers,
        )
    httpx.post(
        secured.base_url + "/embeddings", json={"model": "nope", "input": "x"}, headers=headers
    )
    after = httpx.get(secured.url + "/metrics").text
    route = "/v1/embeddings"
    delta = lambda name, **lb: _metric(after, name, **lb) - _metric(before, name, **lb)  # noqa: E731
    assert delta("openai_compat_requests_total", route=route, model=MODEL, status="200") == 3
    assert delta("openai_compat_requests_total", route=route, status="404") == 1
    assert delta("openai_compat_inputs_total", model=MODEL) == 3
    assert delta("openai_compat_tokens_total", model=MODEL) == 3 * 4
    assert delta("openai_compat_request_duration_seconds_count", route=route) == 4
    assert _metric(after, "openai_compat_queued_inputs", model=MODEL) == 0
    assert _metric(after, "openai_compat_model_load_seconds", model=MODEL) > 0
    # the forward thread: the same text three times is one input of 4 tokens for the model
    # (the exact cache answers the others), in one batch
    assert delta("openai_compat_batch_inputs_total", model=MODEL) == 1
    assert delta("openai_compat_batch_tokens_total", model=MODEL) == 4
    assert delta("openai_compat_batch_padded_tokens_total", model=MODEL) == 4
    assert delta("openai_compat_batches_total", model=MODEL) == 1
    assert delta("openai_compat_forward_seconds_total", model=MODEL) > 0


def test_the_process_memory_and_collections_once_ready(secured: RemoteServer) -> None:
    """Collection, paused while the server imports (models/memory.py), runs again once it is
    ready: requests make garbage and generation 0 is collected; the resident memory /metrics
    reports is the process's own."""
    headers = {"Authorization": "Bearer key-one"}
    before = httpx.get(secured.url + "/metrics").text
    for i in range(20):
        r = httpx.post(
            secured.base_url + "/embeddings",
            json={"model": MODEL, "input": [f"collections {i} {j}" for j in range(8)]},
            headers=headers,
        )
        assert r.status_code == 200
    after = httpx.get(secured.url + "/metrics").text
    gen0 = "python_gc_collections_total"
    assert _metric(after, gen0, generation="0") > _metric(before, gen0, generation="0")
    reported = _metric(after, "process_resident_memory_bytes") / 1024
    assert abs(reported - _rss_kib(secured.proc.pid)) < 0.1 * reported


@pytest.fixture(scope="module")
def debug_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reliability") / "debug.toml"
    path.write_text('[[models]]\nname = "debug"\nmodel = "debug/engine"\nengine = "debugengine"\n')
    return path


def test_overload_answers_429_fast_and_stays_healthy(debug_config: Path) -> None:
    """60 requests of 16 inputs at once against a queue of 64 inputs, on an engine that takes
    0.2 s per batch (tests/slow_engine.py): the first 4 fit, the rest are refused at once."""
    with RemoteServer(
        ["--config", str(debug_config), "--max-queued-inputs", "64"],
        env={"OPENAI_COMPAT_TEST_BATCH_SECONDS": "0.2"},
        slow_engine=True,
    ) as srv:
        pid = srv.proc.pid
        text = "The quick brown fox jumps over the lazy dog by the river. "
        body = {"model": "debug", "input": [text] * 16, "encoding_format": "base64"}
        baseline = _rss_kib(pid)
        health_latencies: list[float] = []

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=120) as client:

                async def probe() -> None:
                    for _ in range(10):
                        t0 = time.perf_counter()
                        r = await client.get(srv.url + "/health")
                        assert r.status_code == 200
                        health_latencies.append(time.perf_counter() - t0)
                        await asyncio.sleep(0.2)

                tasks = [client.post("/embeddings", json=body) for _ in range(60)]
                results, _ = await asyncio.gather(asyncio.gather(*tasks), probe())
                return list(results)

        responses = asyncio.run(burst())
        statuses = [r.status_code for r in responses]
        assert set(statuses) <= {200, 429}
        assert statuses.count(200) >= 4 and statuses.count(429) >= 30, statuses
        for r in responses:
            if r.status_code == 429:
                assert r.headers["retry-after"] == "1"
                assert r.json()["error"]["type"] == "rate_limit_error"
            else:
                data = r.json()["data"]
                assert len(data) == 16
                first = np.frombuffer(__import__("base64").b64decode(data[0]["embedding"]), "<f4")
                np.testing.assert_array_equal(first, np.full(13, len(text)))  # debug engine
        assert max(health_latencies) < 1.0, health_latencies
        metrics = httpx.get(srv.url + "/metrics").text
        assert _metric(
            metrics, "openai_compat_rejected_requests_total", reason="overloaded"
        ) == statuses.count(429)
        assert _metric(metrics, "openai_compat_queued_inputs", model="debug") == 0
        time.sleep(1)
        assert _rss_kib(pid) < baseline + 150 * 1024  # back near the baseline (MiB slack)


def test_clients_that_disconnect_leave_no_work_behind(debug_config: Path) -> None:
    """Three requests of 1024 inputs (32 batches of 0.5 s each: 48 s of work) whose clients
    give up after 1 s: their queued items are skipped, not computed. One each on OpenAI's
    route and on two whose paths are templates (Azure's deployment, Gemini's model)."""
    with RemoteServer(
        ["--config", str(debug_config)],
        env={"OPENAI_COMPAT_TEST_BATCH_SECONDS": "0.5"},
        slow_engine=True,
    ) as srv:
        texts = [f"{i} words" for i in range(1024)]
        gemini = {"requests": [{"content": {"parts": [{"text": t}]}} for t in texts]}
        for path, body in (
            ("/v1/embeddings", {"model": "debug", "input": texts}),
            ("/openai/deployments/debug/embeddings", {"input": texts}),
            ("/v1beta/models/debug:batchEmbedContents", gemini),
        ):
            with pytest.raises(httpx.TimeoutException):
                httpx.post(srv.url + path, json=body, timeout=1.0)
        gone = time.perf_counter()
        time.sleep(0.5)
        metrics = httpx.get(srv.url + "/metrics").text
        assert _metric(metrics, "openai_compat_cancelled_requests_total") == 3
        assert _metric(metrics, "openai_compat_queued_inputs", model="debug") == 0
        assert _metric(metrics, "openai_compat_requests_total", status="499") == 3
        # Only the batches already handed to the model finish: the engine queue empties
        # long before 3072 inputs (48 s) could have been computed.
        while _metric(httpx.get(srv.url + "/metrics").text, "openai_compat_engine_queue_items") > 0:
            assert time.perf_counter() - gone < 10, "cancelled work is being computed"
            time.sleep(0.2)
        t0 = time.perf_counter()
        r = httpx.post(
            srv.base_url + "/embeddings", json={"model": "debug", "input": "hi"}, timeout=60
        )
        assert r.status_code == 200
        # behind at most the few batches infinity had already taken from its queue
        assert time.perf_counter() - t0 < 10
