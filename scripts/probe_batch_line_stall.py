"""How long the event loop is held by one huge Batch API line (#61 item 5): a server on
127.0.0.1 with the packaged model, a batch whose one line is /v1/embeddings with N one-word
strings (5,000,000: a 20 MB line, refused with its 400), and /health polled every 5 ms from
before the batch until it ends. Prints the slowest probe before the batch and overall.

Usage: python scripts/probe_batch_line_stall.py [--inputs 5000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_round(inputs: int) -> tuple[float, float]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="stall-") as data:
        env = {**os.environ, "OPENAI_COMPAT_DATA_DIR": data}
        cmd = [sys.executable, "-m", "openai_compat", "serve", "--port", str(port)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 180
            while True:
                try:
                    if httpx.get(url + "/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "not ready"
                time.sleep(0.2)
            body = {"model": "all-MiniLM-L6-v2", "input": ["a"] * inputs}
            line = {"custom_id": "big", "method": "POST", "url": "/v1/embeddings", "body": body}
            raw = json.dumps(line, separators=(",", ":")).encode()
            files = {"file": ("in.jsonl", raw)}
            up = httpx.post(url + "/v1/files", data={"purpose": "batch"}, files=files, timeout=120)
            probes: list[float] = []
            done = threading.Event()

            def poll() -> None:
                with httpx.Client() as client:
                    while not done.is_set():
                        t0 = time.perf_counter()
                        client.get(url + "/health")
                        probes.append(time.perf_counter() - t0)
                        time.sleep(0.005)

            poller = threading.Thread(target=poll)
            poller.start()
            time.sleep(0.5)
            before = max(probes)
            job = {"input_file_id": up.json()["id"], "endpoint": "/v1/embeddings"}
            created = httpx.post(url + "/v1/batches", json={**job, "completion_window": "24h"})
            batch_id = created.json()["id"]
            while httpx.get(f"{url}/v1/batches/{batch_id}").json()["status"] not in (
                "completed",
                "failed",
            ):
                time.sleep(0.2)
            time.sleep(0.5)
            done.set()
            poller.join()
            return before, max(probes)
        finally:
            proc.terminate()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=5_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for i in range(args.rounds):
        before, worst = one_round(args.inputs)
        print(
            f"round {i + 1}: slowest /health before {before * 1e3:.1f} ms, "
            f"during the batch {worst * 1e3:.1f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
