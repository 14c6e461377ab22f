"""The throughput/latency sweep over systems and scenarios, and cold starts."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchkit.inprocess import InProcess
from benchkit.load import Result, drive_http, plan, request_body
from benchkit.report import plot, print_table
from benchkit.systems import (
    BACKEND_SETTINGS,
    MODEL_SETTINGS,
    Server,
    pin_to_server_cpus,
    rss_kib,
    start_infinity,
    start_ours,
    wait_ready,
)


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


async def sweep(args: argparse.Namespace, out_dir: Path, workdir: Path) -> dict[str, Any]:
    scenarios = plan(args)
    started_at = time.time()
    cold = await cold_starts(args, workdir) if args.cold_start else {}
    neighbour = start_neighbour() if args.neighbour else None
    try:
        return await _sweep(args, out_dir, workdir, scenarios, cold, started_at)
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait(10)


def start_neighbour() -> subprocess.Popen[bytes]:
    """A noisy neighbour: one process spinning on the server CPUs (as another tenant's job on
    a shared machine), the same for every system measured."""
    print("[bench] noisy neighbour: a busy process on the server CPUs", file=sys.stderr)
    return subprocess.Popen(
        [sys.executable, "-c", "while True: pass"], preexec_fn=pin_to_server_cpus
    )


async def _sweep(
    args: argparse.Namespace,
    out_dir: Path,
    workdir: Path,
    scenarios: list[Any],
    cold: dict[str, list[float]],
    started_at: float,
) -> dict[str, Any]:
    results: list[Result] = []
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
        "noisy_neighbour": bool(args.neighbour),
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
