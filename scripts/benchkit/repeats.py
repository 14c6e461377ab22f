"""--repeats FRACTION: a corpus that repeats itself (issue #29): ours with the exact cache on,
ours with it off, and the same engine in-process, fed the same stream of requests.

Each request carries --inputs texts; each text is, with probability FRACTION, one of the texts
already sent in this run (uniformly), else a new one (a real corpus's 36.9% of repeated rows
is this at 0.37). Every round uses a new stream (a new seed), so no cache carries over.
Writes repeats.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from benchkit.inprocess import InProcess
from benchkit.load import sentences
from benchkit.systems import MODEL_SETTINGS, start_ours, wait_ready


def stream(n_requests: int, inputs: int, fraction: float, seed: int) -> list[list[str]]:
    """The texts of each request: repeats of earlier texts with probability `fraction`."""
    rng = random.Random(seed)
    fresh = iter(sentences(n_requests * inputs, seed * 7919 + 1))
    sent: list[str] = []
    out = []
    for _ in range(n_requests):
        texts = []
        for _ in range(inputs):
            text = rng.choice(sent) if sent and rng.random() < fraction else next(fresh)
            sent.append(text)
            texts.append(text)
        out.append(texts)
    return out


async def drive_stream(
    url: str | None,
    engine: Any,
    requests: list[list[str]],
    served: str,
    concurrency: int,
    duration: float,
) -> dict[str, Any]:
    """Send the requests in order, `concurrency` in flight, for `duration` seconds (or until
    the stream ends): to `url`, or straight to an in-process `engine`."""
    bodies = [orjson.dumps({"model": served, "input": t}) for t in requests] if url else []
    position = {"next": 0, "done": 0, "inputs": 0}
    latencies: list[float] = []
    end = time.perf_counter() + duration
    session = (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) if url else None
    )

    async def worker() -> None:
        while time.perf_counter() < end and position["next"] < len(requests):
            i = position["next"]
            position["next"] += 1
            t0 = time.perf_counter()
            if session is not None:
                async with session.post(
                    url, data=bodies[i], headers={"Content-Type": "application/json"}
                ) as resp:
                    await resp.read()
                    assert resp.status == 200, resp.status
            else:
                await engine.embed(requests[i])
            t1 = time.perf_counter()
            if t1 <= end:
                position["done"] += 1
                position["inputs"] += len(requests[i])
                latencies.append((t1 - t0) * 1000)

    started = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        if session is not None:
            await session.close()
    seconds = min(time.perf_counter(), end) - started
    latencies.sort()
    return {
        "inputs_per_s": round(position["inputs"] / seconds, 1),
        "requests": position["done"],
        "p50_ms": round(latencies[len(latencies) // 2], 1) if latencies else None,
        "p99_ms": round(latencies[int(len(latencies) * 0.99)], 1) if latencies else None,
    }


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
