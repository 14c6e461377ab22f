"""POST /v1/files against a live server: a 200 MB upload streams to disk (the server's memory
barely moves), and a refused, malformed or abandoned upload leaves nothing behind."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.utils import RemoteServer, server_with

pytestmark = pytest.mark.slow

BOUNDARY = "oc-test-boundary-7d1f"
DEBUG = [{"name": "debug", "model": "debug/engine", "engine": "debugengine"}]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("uploads-data")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Iterator[RemoteServer]:
    folder = tmp_path_factory.mktemp("uploads-cfg")
    with server_with(folder, DEBUG, ["--data-dir", str(data_dir)]) as server:
        yield server


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _multipart(file_chunks: Iterator[bytes], purpose: str = "batch") -> Iterator[bytes]:
    yield (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n{purpose}\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; '
        'filename="big.jsonl"\r\nContent-Type: application/jsonl\r\n\r\n'
    ).encode()
    yield from file_chunks
    yield f"\r\n--{BOUNDARY}--\r\n".encode()


def _lines(megabytes: int) -> Iterator[bytes]:
    line = b'{"custom_id": "x", "method": "POST", "url": "/v1/embeddings", "body": {}}\n'
    chunk = line * (1024 * 1024 // len(line))
    for _ in range(megabytes):
        yield chunk


def _leftovers(data_dir: Path) -> list[str]:
    return sorted(p.name for p in (data_dir / "files").glob(".upload-*"))


def test_a_200_mb_upload_streams_to_disk(srv: RemoteServer, data_dir: Path) -> None:
    """Peak RSS during the upload stays within 64 MB of the idle server's (it was +454 MB
    for 149 MB when the body was read whole); the stored file is every byte sent."""
    # warm the upload path once (imports, the store opening) before measuring
    small = httpx.post(
        srv.base_url + "/files",
        files={"file": ("s.jsonl", b"{}\n")},
        data={"purpose": "batch"},
    )
    assert small.status_code == 200, small.text
    megabytes = 190
    sent = sum(len(c) for c in _lines(megabytes))
    idle = _rss_kib(srv.proc.pid)
    peak = idle
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _rss_kib(srv.proc.pid))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        r = httpx.post(
            srv.base_url + "/files",
            content=_multipart(_lines(megabytes)),
            headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"},
            timeout=300,
        )
    finally:
        done.set()
        watcher.join()
    assert r.status_code == 200, r.text[:300]
    assert r.json()["bytes"] == sent
    assert (peak - idle) / 1024 < 64, f"RSS grew by {(peak - idle) / 1024:.0f} MB"
    content = httpx.get(srv.base_url + f"/files/{r.json()['id']}/content", timeout=120)
    assert len(content.content) == sent
    assert _leftovers(data_dir) == []


def test_refused_uploads_leave_nothing_behind(srv: RemoteServer, data_dir: Path) -> None:
    headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    wrong = httpx.post(
        srv.base_url + "/files",
        content=b"".join(_multipart(_lines(2), "fine-tune")),
        headers=headers,
    )
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "purpose"
    broken = b"".join(_multipart(_lines(1)))[:-30]  # no closing boundary
    r = httpx.post(srv.base_url + "/files", content=broken, headers=headers)
    assert r.status_code == 400, r.text
    assert _leftovers(data_dir) == []


def test_an_upload_over_the_limit_is_a_413_and_leaves_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    args = ["--data-dir", str(data), "--batch-max-file-bytes", "3000000"]
    with server_with(tmp_path, DEBUG, args) as srv:
        r = httpx.post(
            srv.base_url + "/files",
            content=_multipart(_lines(3)),  # 3 MiB of file: over 3,000,000 bytes
            headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"},
            timeout=60,
        )
        assert r.status_code == 413, r.text
        assert _leftovers(data) == []


def test_abandoned_uploads_leave_nothing_and_uploads_are_capped(
    srv: RemoteServer, data_dir: Path
) -> None:
    """Four uploads that stall take every upload slot: a fifth gets 429 at once; when their
    clients vanish, their temp files go, and uploads work again."""
    head = (
        f"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
        "Content-Length: 100000000\r\n\r\n"
    ).encode()
    first = next(_multipart(iter([])))
    socks = []
    for _ in range(4):
        sock = socket.create_connection((srv.host, srv.port))
        sock.sendall(head + first + b"x" * 200_000)
        socks.append(sock)
    deadline = time.monotonic() + 10
    while len(_leftovers(data_dir)) < 4:
        assert time.monotonic() < deadline, _leftovers(data_dir)
        time.sleep(0.05)
    fifth = httpx.post(
        srv.base_url + "/files", files={"file": ("a.jsonl", b"{}\n")}, data={"purpose": "batch"}
    )
    assert fifth.status_code == 429, fifth.text
    assert fifth.headers["retry-after"] == "1"
    for sock in socks:
        sock.close()
    deadline = time.monotonic() + 10
    while _leftovers(data_dir):
        assert time.monotonic() < deadline, _leftovers(data_dir)
        time.sleep(0.05)
    again = httpx.post(
        srv.base_url + "/files", files={"file": ("a.jsonl", b"{}\n")}, data={"purpose": "batch"}
    )
    assert again.status_code == 200, again.text


def test_an_upload_the_disk_cannot_take_is_a_507(tmp_path: Path) -> None:
    data = tmp_path / "data"
    floor = str(10**18)  # more free disk to keep than any disk has
    args = ["--data-dir", str(data), "--batch-min-free-bytes", floor]
    with server_with(tmp_path, DEBUG, args) as srv:
        r = httpx.post(
            srv.base_url + "/files",
            files={"file": ("a.jsonl", b"{}\n")},
            data={"purpose": "batch"},
        )
        assert r.status_code == 507, r.text
        assert "batch_min_free_bytes" in r.json()["error"]["message"]
        assert _leftovers(data) == []
