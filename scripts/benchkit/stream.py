"""A stream of requests whose texts repeat earlier ones with a given probability, and its
driver (to a server's URL or straight to an in-process engine): shared by --repeats
(repeats.py) and the in-process worker (inprocess.py), which therefore import neither
each other."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import aiohttp
import orjson

from benchkit.load import sentences


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
