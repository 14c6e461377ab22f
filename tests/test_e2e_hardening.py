"""A live server under hostile-sized work: the event loop keeps answering probes while the
biggest allowed request is parsed, decoded and tokenised; uploads cut short are 499s."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import orjson
import pytest

from tests.utils import RemoteServer

pytestmark = pytest.mark.slow

MODEL = "all-MiniLM-L6-v2"
BODY_LIMIT = 16_000_000


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(
            f'{k}="{v}"' in line for k, v in labels.items()
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(scope="module")
def server() -> RemoteServer:
    srv = RemoteServer(["--max-body-bytes", str(BODY_LIMIT)])
    yield srv  # type: ignore[misc]
    srv.stop()


def _probe_while(srv: RemoteServer, work: threading.Thread) -> list[float]:
    latencies: list[float] = []
    with httpx.Client(timeout=10) as client:
        client.get(srv.url + "/health")  # connection made before timing
        work.start()
        while work.is_alive():
            t0 = time.perf_counter()
            assert client.get(srv.url + "/health").status_code == 200
            latencies.append(time.perf_counter() - t0)
            time.sleep(0.02)
    work.join()
    return latencies


@pytest.mark.parametrize("kind", ["long texts", "token ids"])
def test_health_answers_within_100ms_during_a_maximum_size_request(
    server: RemoteServer, kind: str
) -> None:
    if kind == "long texts":
        payload: object = [f"{i} " + "word " * 199_000 for i in range(16)]  # 16 x ~1 MB
    else:
        payload = [[279, 315] * 333_000 for i in range(6)]  # " the of" x 333k: ~16 MB
    body = {"model": MODEL, "input": payload, "encoding_format": "base64"}
    content = orjson.dumps(body)  # compact, as every httpx release since 0.28 writes JSON
    assert BODY_LIMIT * 0.9 < len(content) <= BODY_LIMIT  # as big as this server takes
    result: list[httpx.Response] = []

    def work() -> None:
        result.append(
            httpx.post(
                server.base_url + "/embeddings",
                content=content,
                headers={"Content-Type": "application/json"},
                timeout=300,
            )
        )

    latencies = _probe_while(server, threading.Thread(target=work))
    (response,) = result
    assert response.status_code == 200, response.text[:500]
    data = response.json()
    assert len(data["data"]) == len(payload)
    assert data["usage"]["prompt_tokens"] == 256 * len(payload)  # truncated to the model's max
    assert len(latencies) >= 5
    assert max(latencies) < 0.1, sorted(latencies)[-5:]


def test_a_client_gone_while_uploading_is_a_499_not_a_500(server: RemoteServer) -> None:
    before = httpx.get(server.url + "/metrics").text
    head = (
        f"POST /v1/embeddings HTTP/1.1\r\nHost: {server.host}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    )
    for _ in range(3):
        with socket.create_connection((server.host, server.port)) as sock:
            sock.sendall(head.encode() + b'{"model": "all-MiniLM-L6-v2", "input": ["a')
            time.sleep(0.2)
    time.sleep(0.5)
    after = httpx.get(server.url + "/metrics").text
    route = "/v1/embeddings"
    assert (
        _metric(after, "openai_compat_requests_total", route=route, status="499")
        - _metric(before, "openai_compat_requests_total", route=route, status="499")
        == 3
    )
    assert _metric(after, "openai_compat_requests_total", route=route, status="500") == 0
    assert "Traceback" not in server.output()
