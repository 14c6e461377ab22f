#!/usr/bin/env python3
"""Keys, fair shares and what they cost (issue #41), against real server processes on
127.0.0.1. Every input is new (the exact cache off); bounded in time.

    python scripts/tenants_bench.py [ROUNDS]

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

import asyncio
import hashlib
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit.load import _WORDS as WORDS
from shared_cpu import free_port, ready  # the same port and /ready wait

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


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    work = Path(tempfile.mkdtemp(prefix="tenants-bench-"))
    servers = {
        "fair": serve(work, "fair", MINILM, keys(("A", 1, ""), ("B", 1, ""))),
        "fifo": serve(work, "fifo", MINILM, None),
        "weights": serve(work, "weights", MINILM, keys(("A", 3, ""), ("B", 1, ""))),
        "nokeys": serve(work, "nokeys", DEBUG, None),
        "keyed": serve(work, "keyed", DEBUG, keys(("K", 1, "rpm = 100000000\ntpm = 100000000000"))),
    }
    try:
        for _, url in servers.values():
            asyncio.run(ready(url))
        print(
            f"cpus {os.cpu_count()}, {PER_REQUEST} inputs per request, {SECONDS:.0f} s per "
            f"measurement after {WARMUP:.0f} s",
            flush=True,
        )
        scenarios = ["alone", "flood", "fifo-flood", "weights", "cost-nokeys", "cost-keyed"]
        only = os.environ.get("SCENARIOS")  # a comma-separated subset, for a quick look
        if only:
            scenarios = [s for s in scenarios if s in only.split(",")]
        for r in range(rounds):
            order = scenarios if r % 2 == 0 else scenarios[::-1]
            out: dict[str, str] = {}
            for scenario in order:
                out[scenario] = run_scenario(scenario, servers, r)
            for scenario in scenarios:
                print(f"round {r + 1} {scenario:11s} {out[scenario]}", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
        for proc, _ in servers.values():
            proc.wait(timeout=60)


def run_scenario(
    scenario: str, servers: dict[str, tuple[subprocess.Popen[bytes], str]], r: int
) -> str:
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
        return (
            f"B p50 {pct(b.latencies, 0.5):6.0f} ms  p99 {pct(b.latencies, 0.99):6.0f} ms  "
            f"B 429s {b.refused}  B inputs/s {b.inputs / SECONDS:6.1f}  A inputs/s {a_rate:6.1f}"
        )
    if scenario == "weights":
        url = servers["weights"][1]
        a, b = Client(url, "A", "m", 32, seed + 3), Client(url, "B", "m", 32, seed + 4)
        asyncio.run(drive([a, b]))
        ratio = a.inputs / b.inputs if b.inputs else float("inf")
        return (
            f"A {a.inputs / SECONDS:6.1f} inputs/s  B {b.inputs / SECONDS:6.1f}  A/B {ratio:.2f}"
            f"  429s A {a.refused} B {b.refused}"
        )
    url = servers["nokeys" if scenario == "cost-nokeys" else "keyed"][1]
    c = Client(url, "shared" if scenario == "cost-nokeys" else "K", "m", 32, seed + 5)
    asyncio.run(drive([c]))
    rate = c.inputs / PER_REQUEST / SECONDS
    return f"requests/s {rate:7.1f}  p50 {pct(c.latencies, 0.5):5.1f} ms"


if __name__ == "__main__":
    main()
