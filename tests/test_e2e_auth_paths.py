"""Auth as attackers test it (#41): with keys configured, no spelling of a path, no Host header
and no request-target form reaches a model or data without a key; and every route the server
documents asks for one, except the probes and the docs pages.

The server decides on the raw ASGI path (the one routing uses), never on a URL rebuilt from
`Host` (vLLM's CVE-2026-48746). Requests are written on a raw socket so that nothing on the
client side normalises them; a real server process on 127.0.0.1."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import httpx
import pytest

from tests.utils import RemoteServer

pytestmark = pytest.mark.slow

KEY = "sekret"
BODY = b'{"model": "debug", "input": ["abc"]}'
# Open without a key (middleware.PROBE_PATHS, DOC_PATHS and the pages' GETs)
OPEN = {"/health", "/ready", "/docs", "/redoc", "/openapi.json", "/metrics", "/", "/playground"}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RemoteServer]:
    config = tmp_path_factory.mktemp("auth") / "models.toml"
    config.write_text(
        '[[models]]\nname = "debug"\nmodel = "debug/engine"\nengine = "debugengine"\n'
    )
    with RemoteServer(
        ["--config", str(config), "--api-key", KEY, "--admin-key", "adm", "--cache-bytes", "0"]
    ) as server:
        yield server


def raw(srv: RemoteServer, method: str, target: str, host: str, body: bytes = b"") -> int:
    """The status of one request written byte for byte."""
    head = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    with socket.create_connection((srv.host, srv.port), timeout=30) as s:
        s.sendall(head.encode("latin-1") + b"\r\n" + body)
        answer = b""
        while b"\r\n" not in answer:
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
    match = re.match(rb"HTTP/1\.1 (\d{3}) ", answer)
    assert match, answer[:200]
    return int(match.group(1))


def inputs_embedded(srv: RemoteServer) -> float:
    text = httpx.get(srv.url + "/metrics", timeout=30).text
    pattern = r'^openai_compat_inputs_total\{[^}]*model="debug"[^}]*\} (\S+)$'
    samples = re.findall(pattern, text, re.M)
    return sum(float(v) for v in samples)


HOSTS = ["127.0.0.1", "x/v1?", "localhost:8000/health#", "127.0.0.1/health?", "evil.example"]
TARGETS = [
    "/v1/embeddings",
    "//v1/embeddings",
    "/v1/embeddings/",
    "/v1/%65mbeddings",
    "/V1/embeddings",
    "/v1/./embeddings",
    "/health/../v1/embeddings",
    "/docs/assets/../../v1/embeddings",
    "/docs/assets/%2e%2e/%2e%2e/v1/embeddings",
    "/embeddings",
    "/embed",
    "/health/%2e%2e/v1/embeddings",
    "/v1/embeddings?x=/health",
    "/v1/embeddings#/health",
]


def test_no_spelling_of_a_path_and_no_host_header_skips_the_key(srv: RemoteServer) -> None:
    before = inputs_embedded(srv)
    seen: dict[tuple[str, str], int] = {}
    for host in HOSTS:
        for target in TARGETS:
            seen[(host, target)] = raw(srv, "POST", target, host, BODY)
        # absolute-form request targets, naming a probe's host and path
        for absolute in (
            f"http://{host}/v1/embeddings",
            f"http://127.0.0.1:{srv.port}/v1/embeddings",
            f"http://{host}/health/../v1/embeddings",
        ):
            seen[(host, absolute)] = raw(srv, "POST", absolute, host, BODY)
    reached = {k: v for k, v in seen.items() if v < 400}
    assert not reached, reached
    assert all(v in (400, 401, 404, 405) for v in seen.values()), seen
    assert inputs_embedded(srv) == before  # not one input reached the model
    # the same request with the key is answered, and counted: the counter can move
    assert raw(srv, "POST", "/v1/embeddings", "127.0.0.1", BODY) == 401
    r = httpx.post(
        srv.url + "/v1/embeddings",
        content=BODY,
        headers={"Authorization": f"Bearer {KEY}", "content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 200
    assert inputs_embedded(srv) == before + 1


def test_every_documented_route_needs_the_key_but_probes_and_pages(srv: RemoteServer) -> None:
    schema = httpx.get(srv.url + "/openapi.json", timeout=30).json()
    checked = 0
    for path, operations in schema["paths"].items():
        target = re.sub(r"\{[^}]+\}", "x", path)
        for method in operations:
            if method.upper() not in ("GET", "POST", "DELETE", "PUT", "PATCH"):
                continue
            status = raw(srv, method.upper(), target, "127.0.0.1", BODY)
            if path.startswith("/admin"):
                assert status == 401, (method, path, status)  # the admin key's, not the API's
            elif path in OPEN and method.upper() == "GET":
                assert status != 401, (method, path)
            elif path.startswith("/v1beta/"):  # Google's 400 API_KEY_INVALID, as Gemini answers
                assert status == 400, (method, path, status)
            else:
                assert status == 401, (method, path, status)
            checked += 1
    assert checked > 40  # every dialect's routes, files, batches, tokenizers, the tutorial's
