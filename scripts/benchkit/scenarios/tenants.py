#!/usr/bin/env python3
"""Keys, fair shares and what they cost (issue #41), against real server processes on
127.0.0.1. Every input is new (the exact cache off); bounded in time.

    python scripts/bench.py run tenants [--rounds N] [--only alone,flood,...]

fairness   MiniLM; keys A and B of weight 1. "alone": B with 2 requests in flight; "flood":
           A with 64 in flight beside B's 2. B's p50/p99 latency and 429s in each; the same
           flood on a server without a keys file (--api-key: one shared FIFO) for contrast.
weights    MiniLM; keys A (weight 3) and B (weight 1), 32 requests in flight each: the share
           of the inputs served to each while both wait (target 3:1 within 10%).
cost       the model-free debug engine (P1-style: the HTTP path alone), 32 in flight: requests/s
           with no keys vs with a keys file and a key that has rpm and tpm (headers computed
           on every answer, limits far above the load): target within 5%.
Every request carries 16 inputs of 6-14 words. Rounds alternate the order of the scenarios.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from benchkit.load import _WORDS as WORDS
from benchkit.record import Figure
from benchkit.scenarios.shared_cpu import ready  # the same /ready wait
from benchkit.systems import free_port

PER_REQUEST = 16
SECONDS = float(os.environ.get("BENCH_SECONDS", "12"))
WARMUP = 3.0


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def serve(
    work: Path, name: str, models: str, keys: str | None
) -> tuple[subprocess.Popen[bytes], str]:
    config = work / f"{name}.toml"
    config.write_text(models)
    port = free_port()
    command = [sys.executable, "-m", "openai_compat", "serve", "--config", str(config)]
    command += ["--port", str(port), "--cache-bytes", "0", "--log-level", "warning"]
    command += ["--no-access-log"]
    if keys is None:
        command += ["--api-key", "shared"]
    else:
        path = work / f"{name}.keys.toml"
        path.write_text(keys)
        command += ["--keys-file", str(path)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1"}
    return subprocess.Popen(command, env=env, start_new_session=True), f"http://127.0.0.1:{port}"


class Client:
    """`flight` workers of one key, each sending new 16-input requests back to back."""

    def __init__(self, url: str, key: str, model: str, flight: int, seed: int) -> None:
        self.url, self.key, self.model, self.flight = url, key, model, flight
        self.rng = random.Random(seed)
        self.serial = 0
        self.latencies: list[float] = []
        self.inputs = 0
        self.refused = 0

    def body(self) -> bytes:
        self.serial += 1
        texts = [
            f"{self.key} {self.serial} {j} "
            + " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(6, 14)))
            for j in range(PER_REQUEST)
        ]
        return orjson.dumps({"model": self.model, "input": texts})

    async def run(self, session: aiohttp.ClientSession, start: float, end: float) -> None:
        headers = {"content-type": "application/json", "authorization": f"Bearer {self.key}"}

        async def worker() -> None:
            while time.monotonic() < end:
                sent = time.monotonic()
                async with session.post(
                    self.url + "/v1/embeddings", data=self.body(), headers=headers
                ) as r:
                    await r.read()
                    status = r.status
                done = time.monotonic()
                if status == 429:
                    if sent >= start:
                        self.refused += 1
                    await asyncio.sleep(0.05)
                    continue
                if status != 200:
                    raise SystemExit(f"{self.key}: status {status}")
                if start <= done <= end:  # throughput: what completed in the window
                    self.inputs += PER_REQUEST
                    if sent >= start:  # latency: requests wholly inside it
                        self.latencies.append(done - sent)

        await asyncio.gather(*(worker() for _ in range(self.flight)))


async def drive(clients: list[Client]) -> None:
    start = time.monotonic() + WARMUP
    end = start + SECONDS
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as session:
        await asyncio.gather(*(c.run(session, start, end) for c in clients))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")


MINILM = '[[models]]\nname = "m"\nmodel = "builtin:all-MiniLM-L6-v2"\n'
DEBUG = '[[models]]\nname = "m"\nmodel = "debug/engine"\nengine = "debugengine"\n'


def keys(*entries: tuple[str, float, str]) -> str:
    return "".join(
        f'[[keys]]\nname = "{n}"\nkey_sha256 = "{sha(n)}"\nweight = {w}\n{extra}\n'
        for n, w, extra in entries
    )


NAME = "tenants"
DESCRIPTION = "keys: a flood beside a light key, weights 3:1, the cost of keys and limits"
FIGURES = [
    Figure(
        "flood.b_p50_ms",
        "light key's p50 beside a flood (fair shares)",
        "ms",
        "lower",
        "alone.b_p50_ms",
    ),
    Figure(
        "fifo-flood.b_p50_ms", "the same without keys (one FIFO)", "ms", "lower", "alone.b_p50_ms"
    ),
    Figure("weights.a_per_b", "served share, weight 3 vs weight 1", "x", "higher"),
    Figure(
        "cost-keyed.rps",
        "HTTP path with keys and limits",
        "requests/s",
        "higher",
        "cost-nokeys.rps",
        0.95,
    ),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--only", default=None, help="a comma-separated subset of the scenarios")


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, float]]]:
    work = Path(tempfile.mkdtemp(prefix="tenants-bench-"))
    servers = {
        "fair": serve(work, "fair", MINILM, keys(("A", 1, ""), ("B", 1, ""))),
        "fifo": serve(work, "fifo", MINILM, None),
        "weights": serve(work, "weights", MINILM, keys(("A", 3, ""), ("B", 1, ""))),
        "nokeys": serve(work, "nokeys", DEBUG, None),
        "keyed": serve(work, "keyed", DEBUG, keys(("K", 1, "rpm = 100000000\ntpm = 100000000000"))),
    }
    scenarios = ["alone", "flood", "fifo-flood", "weights", "cost-nokeys", "cost-keyed"]
    if args.only:
        scenarios = [s for s in scenarios if s in args.only.split(",")]
    rounds: list[dict[str, float]] = []
    try:
        for _, url in servers.values():
            asyncio.run(ready(url))
        for r in range(args.rounds):
            row: dict[str, float] = {}
            for scenario in scenarios if r % 2 == 0 else scenarios[::-1]:
                got = run_scenario(scenario, servers, r)
                row |= {f"{scenario}.{k}": v for k, v in got.items()}
                print(f"round {r + 1} {scenario:11s} {got}", flush=True)
            rounds.append(row)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
        for proc, _ in servers.values():
            proc.wait(timeout=60)
    params = {
        "inputs_per_request": PER_REQUEST,
        "seconds": SECONDS,
        "warmup_s": WARMUP,
        "scenarios": scenarios,
        "models": "MiniLM (fairness, weights); the debug engine (cost)",
        "cache": "off (every text new)",
    }
    return params, rounds


def run_scenario(
    scenario: str, servers: dict[str, tuple[subprocess.Popen[bytes], str]], r: int
) -> dict[str, float]:
    seed = 1000 * r
    if scenario in ("alone", "flood", "fifo-flood"):
        url = servers["fifo" if scenario == "fifo-flood" else "fair"][1]
        key_a, key_b = ("shared", "shared") if scenario == "fifo-flood" else ("A", "B")
        b = Client(url, key_b, "m", 2, seed + 1)
        clients = [b]
        if scenario != "alone":
            clients.append(Client(url, key_a, "m", 64, seed + 2))
        asyncio.run(drive(clients))
        a_rate = clients[1].inputs / SECONDS if len(clients) > 1 else 0.0
        return {
            "b_p50_ms": pct(b.latencies, 0.5),
            "b_p99_ms": pct(b.latencies, 0.99),
            "b_429s": b.refused,
            "b_inputs_per_s": b.inputs / SECONDS,
            "a_inputs_per_s": a_rate,
        }
    if scenario == "weights":
        url = servers["weights"][1]
        a, b = Client(url, "A", "m", 32, seed + 3), Client(url, "B", "m", 32, seed + 4)
        asyncio.run(drive([a, b]))
        ratio = a.inputs / b.inputs if b.inputs else float("inf")
        return {
            "a_inputs_per_s": a.inputs / SECONDS,
            "b_inputs_per_s": b.inputs / SECONDS,
            "a_per_b": ratio,
            "429s": a.refused + b.refused,
        }
    url = servers["nokeys" if scenario == "cost-nokeys" else "keyed"][1]
    c = Client(url, "shared" if scenario == "cost-nokeys" else "K", "m", 32, seed + 5)
    asyncio.run(drive([c]))
    return {"rps": c.inputs / PER_REQUEST / SECONDS, "p50_ms": pct(c.latencies, 0.5)}
