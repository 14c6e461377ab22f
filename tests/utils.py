"""Helpers for tests that run the real server as a subprocess on 127.0.0.1."""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent

SERVER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "INFINITY_ANONYMOUS_USAGE_STATS": "0",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RemoteServer:
    """`python -m openai_compat serve ...` on a free loopback port; stops only its own process."""

    def __init__(
        self,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str | None] | None = None,
        wait_ready: bool = True,
        timeout: float = 240.0,
        slow_engine: bool = False,
        cpus: set[int] | None = None,
    ) -> None:
        """`slow_engine`: run tests/slow_engine.py (engine timing set by the environment);
        `cpus`: the CPUs the server may run on (its affinity)."""
        self.port = free_port()
        self.host = "127.0.0.1"
        self.url = f"http://{self.host}:{self.port}"
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in stop()
            prefix="openai-compat-", suffix=".log", delete=False
        )
        # Each server its own Batch API data dir (a --data-dir argument still wins): servers
        # sharing one would contend for its lock.
        self.data_dir = tempfile.mkdtemp(prefix="openai-compat-data-")
        full_env = {
            **os.environ,
            **SERVER_ENV,
            "OPENAI_COMPAT_DATA_DIR": self.data_dir,
            # the slow test engine stands for engine time per call: the exact cache would
            # answer repeated texts without it
            **({"OPENAI_COMPAT_CACHE_BYTES": "0"} if slow_engine else {}),
            **(env or {}),
        }
        full_env = {k: v for k, v in full_env.items() if v is not None}  # None: unset it
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.slow_engine" if slow_engine else "openai_compat",
                "serve",
                "--host",
                self.host,
                "--port",
                str(self.port),
                *args,
            ],
            env=full_env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
        if wait_ready:
            self.wait_ready(timeout)

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def wait_ready(self, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.proc.returncode}:\n{self.output()[-5000:]}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.output()[-5000:]}")

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        return self.proc.returncode

    def __enter__(self) -> RemoteServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _key(key: str) -> str:
    """A TOML key: bare where it may be, else quoted (`"node:__internal_head__"`)."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml(value: Any) -> str:
    """One TOML value: strings (JSON's escapes are TOML's), numbers, booleans, arrays, inline
    tables, and paths as strings."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (str, Path)):
        return json.dumps(str(value))
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def write_config(path: Path, models: Sequence[Mapping[str, Any]], **options: Any) -> Path:
    """A server config file: top-level `options`, then one [[models]] table per mapping."""
    lines = [f"{key} = {_toml(value)}" for key, value in options.items()]
    for model in models:
        lines.append("[[models]]")
        lines += [f"{key} = {_toml(value)}" for key, value in model.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@contextlib.contextmanager
def server_with(
    folder: Path,
    models: Sequence[Mapping[str, Any]],
    args: Sequence[str] = (),
    **options: Any,
) -> Iterator[RemoteServer]:
    """A server on a config of `models` (and top-level `options`) written into `folder`."""
    config = write_config(folder / "models.toml", models, **options)
    with RemoteServer(["--config", str(config), *args]) as server:
        yield server


@contextlib.asynccontextmanager
async def app_client(settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An in-process app on `settings` with its lifespan run, and a client for it, once
    /ready answers 200. Its models run float32 unless `settings` names a dtype (the suite
    compares served numbers with the library's float32 ones; conftest.py does the same for
    server processes)."""
    import asyncio

    from asgi_lifespan import LifespanManager

    from openai_compat.web.app import create_app

    if "dtype" not in settings.model_fields_set:
        settings = settings.model_copy(update={"dtype": "float32"})

    app = create_app(settings)
    async with LifespanManager(app, startup_timeout=120) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            for _ in range(600):
                if (await client.get("/ready")).status_code == 200:
                    break
                await asyncio.sleep(0.05)
            client.app_state = app.state  # type: ignore[attr-defined]  # for tests that look inside
            yield client


VOLATILE_KEYS = ("id", "created", "unix", "meta")


def strip_volatile(body: Any) -> Any:
    """An answer without what differs between two servers by nature (ids, clocks)."""
    if isinstance(body, dict):
        return {k: strip_volatile(v) for k, v in body.items() if k not in VOLATILE_KEYS}
    if isinstance(body, list):
        return [strip_volatile(v) for v in body]
    return body


def assert_same_answer(a: Any, b: Any, path: str = "") -> None:
    """Equal in shape and keys; numbers within 1e-5, base64 embeddings (OpenAI's
    `encoding_format = "base64"`) decoded to their float32s and compared the same way: a
    batch pads its rows differently from a lone request, which moves the last bits."""
    if path.endswith(".embedding") and isinstance(a, str) and isinstance(b, str):
        x = np.frombuffer(base64.b64decode(a), dtype="<f4")
        y = np.frombuffer(base64.b64decode(b), dtype="<f4")
        assert x.shape == y.shape and np.allclose(x, y, rtol=0, atol=1e-5), (path, a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (path, a, b)
        for k in a:
            assert_same_answer(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), (path, a, b)
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_answer(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert abs(float(a) - float(b)) <= 1e-5, (path, a, b)
    else:
        assert a == b, (path, a, b)


def live_pids(marker: bytes) -> set[int]:
    """PIDs of live processes (zombies excluded) whose command line contains `marker`."""
    found = set()
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in cmdline and state != "Z":
            found.add(int(proc.name))
    return found


def _tcp_address(hexed: str) -> str:
    """An address from /proc/net/tcp{,6} (little-endian 32-bit words) as text."""
    host = bytes.fromhex(hexed.split(":")[0])
    words = b"".join(host[i : i + 4][::-1] for i in range(0, len(host), 4))
    return str(ipaddress.ip_address(words))


def off_loopback_sockets(pids: set[int]) -> list[str]:
    """The TCP connections of `pids` (listening sockets aside) whose peer is not on loopback:
    'pid local -> peer' each (empty when every connection stays on 127.0.0.0/8 or ::1)."""
    owner: dict[str, int] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        owner[target[8:-1]] = pid
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            local, peer, state, inode = fields[1], fields[2], fields[3], fields[9]
            if inode not in owner or state == "0A":  # 0A: LISTEN
                continue
            address = ipaddress.ip_address(_tcp_address(peer))
            mapped = getattr(address, "ipv4_mapped", None) or address
            if not mapped.is_loopback:
                found.append(f"{owner[inode]} {_tcp_address(local)} -> {mapped}")
    return found


def haproxy_env(root: Path) -> dict[str, str]:
    """Ray Serve's HAProxy mode keeps its config, sockets and state under /tmp/haproxy-serve and
    binds fixed metrics and stats ports (9101, 8404) on every node that runs a proxy: a node's
    own, so that clusters on one machine do not collide."""
    base = root / "haproxy"
    return {
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": f"{base}/haproxy.cfg",
        "RAY_SERVE_HAPROXY_SOCKET_PATH": f"{base}/admin.sock",
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(base),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": f"{base}/server-state",
        "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": f"{base}/metrics.sock",
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port()),
        "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()),
    }


def record_batches(engine: Any) -> list[list[int]]:
    """Spies on a native engine's forward thread: each batch it runs, as its rows' lengths."""
    batches: list[list[int]] = []
    inner = engine.runner.run

    def spy(rows: Any) -> Any:
        batches.append([r.length for r in rows])
        return inner(rows)

    engine.runner.run = spy
    return batches


def projected(features: Any) -> Any:
    """What transformers' get_text/image/audio_features gives: a tensor up to 4.x, a model
    output whose pooler_output is that tensor from 5.0 on."""
    return getattr(features, "pooler_output", features)


def run_batch(client: Any, lines: Sequence[dict[str, Any]], timeout: float = 60.0) -> Any:
    """Upload `lines` as a JSONL file with the openai SDK `client`, start a batch on
    /v1/embeddings and wait until it is completed or failed; the Batch object."""
    jsonl = "\n".join(json.dumps(line) for line in lines).encode()
    upload = client.files.create(file=("in.jsonl", jsonl), purpose="batch")
    job = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    deadline = time.monotonic() + timeout
    while (job := client.batches.retrieve(job.id)).status not in ("completed", "failed"):
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
    return job
