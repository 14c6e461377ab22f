#!/usr/bin/env python3
"""One client, OpenMP's wait policies side by side: our server started once per policy, all at
the same time, and one request at a time sent to each in turn (new texts every time: the
exact cache off), so every policy is measured over the same minutes of this machine. MiniLM,
1 input and 16; p50 after 20 warm-up requests each. Loopback only, bounded in time.

    python scripts/wait_policy.py [REQUESTS]

OURS_PYTHON (default: this interpreter) runs the servers. The policies: `passive`
(OMP_WAIT_POLICY=PASSIVE: idle threads sleep at once), `spin10k` (GOMP_SPINCOUNT=10000, the
server's default: cpus.SPIN_COUNT), `spin300k` (libgomp's own default).
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import time

import httpx
from benchkit.load import _WORDS as WORDS
from shared_cpu import free_port

POLICIES = {
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin10k": {"GOMP_SPINCOUNT": "10000"},
    "spin300k": {"GOMP_SPINCOUNT": "300000"},
}
WARMUP = 20


def start(extra: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(extra, HF_HUB_OFFLINE="1", DO_NOT_TRACK="1")
    command = [os.environ.get("OURS_PYTHON", sys.executable), "-m", "openai_compat", "serve"]
    command += ["--port", str(port), "--cache-bytes", "0", "--log-level", "warning"]
    command += ["--no-access-log"]
    proc = subprocess.Popen(command, env=env, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def main() -> None:
    requests = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    rng, serial = random.Random(1), [0]

    def texts(k: int) -> list[str]:
        serial[0] += 1
        return [
            f"{serial[0]} {j} " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14)))
            for j in range(k)
        ]

    servers = {name: start(extra) for name, extra in POLICIES.items()}
    try:
        with httpx.Client(timeout=60) as client:
            for name, (proc, url) in servers.items():
                for _ in range(600):
                    if proc.poll() is not None:
                        raise SystemExit(f"{name}: the server exited")
                    try:
                        if client.get(url + "/ready").status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.2)
            for k in (1, 16):
                took: dict[str, list[float]] = {name: [] for name in servers}
                for i in range(WARMUP + requests):
                    for name, (_, url) in servers.items():
                        body = {"model": "all-MiniLM-L6-v2", "input": texts(k)}
                        started = time.perf_counter()
                        answer = client.post(url + "/v1/embeddings", json=body)
                        elapsed = time.perf_counter() - started
                        answer.raise_for_status()
                        if i >= WARMUP:
                            took[name].append(1000 * elapsed)
                line = "  ".join(f"{n} {statistics.median(t):.2f}" for n, t in took.items())
                print(f"{k:2d} input(s), p50 ms: {line}", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
