"""--repeats FRACTION: a corpus that repeats itself (issue #29): ours with the exact cache on,
ours with it off, and the same engine in-process, fed the same stream of requests.

Each request carries --inputs texts; each text is, with probability FRACTION, one of the texts
already sent in this run (uniformly), else a new one (a real corpus's 36.9% of repeated rows
is this at 0.37). Every round uses a new stream (a new seed), so no cache carries over.
Writes repeats.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from benchkit.inprocess import InProcess
from benchkit.stream import drive_stream, stream
from benchkit.systems import MODEL_SETTINGS, start_ours, wait_ready


async def repeats(args: argparse.Namespace, out_dir: Path, workdir: Path) -> dict[str, Any]:
    setting = "minilm"
    served = MODEL_SETTINGS[setting][0]
    inputs, concurrency = args.inputs[0], args.concurrency[0]
    duration = args.durations[setting]
    n_requests = 4000  # far more than a run sends: the stream never runs out
    cached = start_ours(setting, workdir, extra=("--cache-bytes", str(512 * 2**20)))
    plain = start_ours(setting, workdir)
    inproc = InProcess(setting)
    rounds: list[dict[str, Any]] = []
    try:
        for srv in (cached, plain):
            await wait_ready(srv, "/ready", limit=600)
        await inproc.start()
        for rnd in range(args.rounds):
            seed = 1000 + rnd
            requests = stream(n_requests, inputs, args.repeats, seed)
            order = ["cache-on", "cache-off", "inprocess"]
            if rnd % 2:
                order.reverse()
            row: dict[str, Any] = {"round": rnd + 1}
            for system in order:
                if system == "inprocess":
                    job = {
                        "stream": [n_requests, inputs, args.repeats, seed],
                        "served": served,
                        "concurrency": concurrency,
                        "duration": duration,
                    }
                    row[system] = await inproc.run(job)
                else:
                    srv = cached if system == "cache-on" else plain
                    row[system] = await drive_stream(
                        srv.url + "/v1/embeddings", None, requests, served, concurrency, duration
                    )
                print(f"[bench] round {rnd + 1} {system}: {row[system]}", file=sys.stderr)
            row["ratio_cache_on_vs_inprocess"] = round(
                row["cache-on"]["inputs_per_s"] / row["inprocess"]["inputs_per_s"], 3
            )
            row["ratio_cache_off_vs_inprocess"] = round(
                row["cache-off"]["inputs_per_s"] / row["inprocess"]["inputs_per_s"], 3
            )
            rounds.append(row)
            print(json.dumps(row), flush=True)
    finally:
        inproc.stop()
        cached.stop()
        plain.stop()
    ratios = [r["ratio_cache_on_vs_inprocess"] for r in rounds]
    result = {
        "repeat_fraction": args.repeats,
        "inputs_per_request": inputs,
        "concurrency": concurrency,
        "seconds_per_run": duration,
        "rounds": rounds,
        "ratio_cache_on_vs_inprocess": {
            "median": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
        },
    }
    (out_dir / "repeats.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result["ratio_cache_on_vs_inprocess"]))
    return result
