#!/usr/bin/env python3
"""Where a server's time goes under load: the forward lanes' busy share, the batch size they
reach and its padding, read from the server's own metrics (openai_compat_forward_seconds_total
and the batch counters) over a bounded run. MiniLM, 16 never-repeating texts per request (the
exact cache off), IN_FLIGHT requests in flight, the server unpinned; loopback only.

    python scripts/forward_busy.py [IN_FLIGHT,...] [SECONDS]

Each line: requests/s, the forward lanes busy on average (the rate of forward seconds summed
over the model's lanes: 2.0 on two CPUs is both lanes always running; 1.0 with one lane is
never waiting for work), inputs per batch, padded / real tokens, milliseconds per batch (on
whatever share of the threads each batch ran). $OURS_PYTHON runs the server
(default: this interpreter).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import subprocess
import sys
import time

import aiohttp
from families_bench import texts
from shared_cpu import free_port, ready

MODEL = "all-MiniLM-L6-v2"


def metric(text: str, name: str) -> float:
    found = re.search(rf'^{name}{{model="{MODEL}"}} ([0-9.e+]+)$', text, re.M)
    if found is None:
        raise SystemExit(f"{name} is not in /metrics")
    return float(found.group(1))


async def drive(url: str, flight: int, seconds: float) -> str:
    rng, serial = random.Random(flight), [0]

    def body() -> dict[str, object]:
        return {"model": MODEL, "input": texts(rng, 16, serial)}  # never a repeat

    async with aiohttp.ClientSession() as session:

        async def worker(end: float, count: list[int]) -> None:
            while time.monotonic() < end:
                async with session.post(url + "/v1/embeddings", json=body()) as answer:
                    await answer.read()
                    assert answer.status == 200, answer.status
                count[0] += 1

        await asyncio.gather(*(worker(time.monotonic() + 2, [0]) for _ in range(flight)))
        async with session.get(url + "/metrics") as answer:
            before = await answer.text()
        started, count = time.monotonic(), [0]
        await asyncio.gather(*(worker(started + seconds, count) for _ in range(flight)))
        wall = time.monotonic() - started
        async with session.get(url + "/metrics") as answer:
            after = await answer.text()

    def delta(name: str) -> float:
        return metric(after, name) - metric(before, name)

    batches = delta("openai_compat_batches_total")
    busy = delta("openai_compat_forward_seconds_total")
    return (
        f"{flight:3d} in flight: {count[0] / wall:6.1f} req/s  lanes busy {busy / wall:.2f}  "
        f"inputs/batch {delta('openai_compat_batch_inputs_total') / batches:5.1f}  "
        f"padded/real {delta('openai_compat_batch_padded_tokens_total') / delta('openai_compat_batch_tokens_total'):.2f}  "  # noqa: E501
        f"ms/batch {1000 * busy / batches:4.0f}"
    )


def main() -> None:
    flights = [int(f) for f in (sys.argv[1] if len(sys.argv) > 1 else "8,32").split(",")]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
    python = os.environ.get("OURS_PYTHON", sys.executable)
    for flight in flights:
        port = free_port()
        command = [python, "-m", "openai_compat", "serve", "--port", str(port)]
        command += ["--cache-bytes", "0", "--no-access-log", "--log-level", "warning"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1"}
        server = subprocess.Popen(command, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            asyncio.run(ready(url))
            print(asyncio.run(drive(url, flight, seconds)), flush=True)
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
