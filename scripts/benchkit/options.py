#!/usr/bin/env python3
"""The load kit's options (the scenarios in scenarios/lab.py pass theirs; more after `--`:
`python scripts/bench.py run throughput -- --duration 10 --concurrency 8,64`).

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
Loopback only; every run is bounded by --duration and --max-requests.
"""

from __future__ import annotations

import argparse
import os

from benchkit.grid import LABELS as GRID_SETTINGS
from benchkit.systems import MODEL_SETTINGS, parse_cpus


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
    p.add_argument(
        "--neighbour",
        action="store_true",
        help="a noisy neighbour: a busy process on the server CPUs for the whole sweep",
    )
    p.add_argument(
        "--repeats",
        type=float,
        default=None,
        metavar="FRACTION",
        help="instead: a corpus where FRACTION of the texts repeat earlier ones, ours with the "
        "exact cache on and off vs in-process (MiniLM, first --inputs and --concurrency)",
    )
    p.add_argument(
        "--model-pool",
        action="store_true",
        help="instead: lazy loading's costs (cold lazy vs eager first answer, live p99 while "
        "another model loads, RSS over 20 load/unload cycles; first --concurrency)",
    )
    p.add_argument(
        "--grid",
        action="store_true",
        help="instead: every CPU backend (torch, onnx, onnx int8, openvino, openvino int8) x "
        "--lengths x --concurrency, 1 text per request, with cosine to torch",
    )
    p.add_argument("--lengths", default="16,128,256", help="tokens per text (--grid)")
    p.add_argument(
        "--grid-report", default=None, metavar="GRID_JSON", help="print a --grid run's table again"
    )
    p.add_argument(
        "--ray",
        action="store_true",
        help="instead: Ray Serve with one model replica vs the single-process server on the "
        "same core (overhead), and two replicas vs one on two cores (scaling); first --inputs "
        "(default 16) and --concurrency (default 16)",
    )
    p.add_argument("--ray-phases", default="overhead,scaling", help="which of them (--ray)")
    p.add_argument(
        "--ray-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="--ray: the overhead phase also runs a second Ray node with this environment in "
        "the same rounds; the scaling phase runs its node with it",
    )
    p.add_argument(
        "--ray-tokens",
        type=int,
        default=None,
        help="tokens per text (--ray; default: short sentences of 8-16 words)",
    )
    p.add_argument("--inprocess-worker", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    full = a.full
    if a.grid:
        a.models = a.models or ",".join(GRID_SETTINGS)
        a.inputs = a.inputs or "1"
        a.concurrency = a.concurrency or "1,4,16,64"
    if a.ray:
        a.inputs = a.inputs or "16"
        a.concurrency = a.concurrency or "16"
    a.ray_phases = a.ray_phases.split(",")
    a.lengths = [int(x) for x in a.lengths.split(",")]
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
    a.gen_cpus = parse_cpus(a.gen_cpus) if a.gen_cpus else {cpus[-1]}
    a.server_cpus = (
        parse_cpus(a.server_cpus) if a.server_cpus else (set(cpus) - a.gen_cpus or a.gen_cpus)
    )
    return a
