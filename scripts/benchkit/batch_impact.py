"""--batch-impact: live latency alone vs beside a Batch API job, and the job alone."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from benchkit.inprocess import InProcess
from benchkit.load import Result, Scenario, drive_http, request_body, sentences
from benchkit.systems import MODEL_SETTINGS, start_ours, wait_ready


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
