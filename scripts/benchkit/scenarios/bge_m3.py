#!/usr/bin/env python3
"""BGE-M3 whole (#63): what all three outputs cost beside the dense vector alone on our server
(one forward pass, not three), our dense path against the library's own encode of the same
folder, and our three outputs against FlagEmbedding's own. The model has BAAI/bge-m3's shape
(24 layers, 1024 wide, a 250,002-token vocabulary, both heads; random weights built offline:
models/demo_m3.py's REAL shape, its tokenizer a word list), run in float32 everywhere (the
library's and FlagEmbedding's dtype; `dtype = "float32"` on ours). 16 new texts a request
(6-14 words and two numbers: ~20 tokens each), 8 requests in flight, the exact cache off.
Loopback only, bounded in time.

    python scripts/bench.py run bge-m3 [--rounds N]

Per round, in alternating order:
    dense        our server, /v1/embeddings with no option (the dense vectors)
    all3         the same server, output_types dense + sparse + multivector (float JSON: the
                 ColBERT vectors are ~20 x 1024 numbers a text)
    all3-b64     the same with encoding_format base64 (the bytes of every part)
    lib-8x16     sentence-transformers' encode (BGE-M3's dense path) in one process, 8 threads
                 x 16 new texts
    lib-128      the same, one caller, 128 new texts a call (the batch our scheduler forms)
    flag-128     FlagEmbedding's BGEM3FlagModel.encode of all three outputs, 128 texts a call
                 ($FLAG_PYTHON or .venv-flag; skipped where absent)
Each line: requests/s of 16 texts; the published figures are seconds per request (all3 / dense:
the cost of the two heads and the bigger answer) and dense against the library's best.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from benchkit.load import _WORDS, closed_loop, new_texts  # noqa: E402
from benchkit.record import Figure  # noqa: E402
from benchkit.scenarios.families import library_run, serve  # noqa: E402
from benchkit.scenarios.shared_cpu import ready  # noqa: E402

IN_FLIGHT, PER_REQUEST = 8, 16
SECONDS = float(os.environ.get("BENCH_SECONDS", "20"))  # a smoke run sets it lower
WARMUP = 4.0
ALL3 = ["dense", "sparse", "multivector"]
FLAG_PYTHON = Path(os.environ.get("FLAG_PYTHON", ROOT / ".venv-flag" / "bin" / "python"))

NAME = "bge-m3"
DESCRIPTION = "BGE-M3's three outputs from one pass vs dense alone; dense vs the library"
FIGURES = [
    Figure(
        "all3.seconds",
        "BGE-M3: dense + sparse + ColBERT (float) vs dense alone, per request",
        "s/request",
        "lower",
        "dense.seconds",
        1.3,
    ),
    Figure(
        "all3-b64.seconds",
        "BGE-M3: dense + sparse + ColBERT (base64) vs dense alone, per request",
        "s/request",
        "lower",
        "dense.seconds",
        1.3,
    ),
    Figure(
        "dense.ours",
        "BGE-M3 dense: served vs the library's best encode",
        "requests/s",
        "higher",
        "dense.best-library",
        0.9,
    ),
    Figure(
        "all3-b64.ours",
        "BGE-M3 all three outputs: served (base64) vs FlagEmbedding's encode",
        "requests/s",
        "higher",
        "all3.flag-128",
    ),
]

FLAG = """
import json, random, sys, time
from FlagEmbedding import BGEM3FlagModel
folder, seconds, warmup, n = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
words = json.loads(sys.argv[5])
model = BGEM3FlagModel(folder, use_fp16=False, devices="cpu")
rng, serial = random.Random(7), [0]
def batch():
    serial[0] += 1
    return [f"{serial[0]} {j} " + " ".join(rng.choice(words) for _ in range(rng.randint(6, 14)))
            for j in range(n)]
def run(stop, counted):
    while time.monotonic() < stop:
        model.encode(batch(), batch_size=n, return_dense=True, return_sparse=True,
                     return_colbert_vecs=True)
        if counted is not None and time.monotonic() < stop:
            counted[0] += 1
run(time.monotonic() + warmup, None)
counted = [0]
run(time.monotonic() + seconds, counted)
print(counted[0] * n / seconds)
"""


def build(work: Path) -> Path:
    from openai_compat.models.demo_m3 import REAL, build_bge_m3

    return build_bge_m3(work / "bge-m3", shape=REAL, words=list(_WORDS))


async def drive(url: str, reading: str, seed: int) -> float:
    """Requests per second over SECONDS after WARMUP, IN_FLIGHT clients, every text new."""
    rng, serial = random.Random(seed), [seed * 1_000_000]
    extra: dict[str, Any] = {}
    if reading != "dense":
        extra["output_types"] = ALL3
    if reading == "all3-b64":
        extra["encoding_format"] = "base64"

    def request() -> tuple[str, bytes]:
        body = {"model": "bge-m3", "input": new_texts(rng, serial, PER_REQUEST), **extra}
        return "/v1/embeddings", orjson.dumps(body)

    return await closed_loop(url, request, IN_FLIGHT, SECONDS, WARMUP)


def ours(folder: Path, work: Path, order: list[str], seed: int) -> dict[str, float]:
    proc, url = serve("bge-m3", folder, work, 'dtype = "float32"\n')
    try:
        asyncio.run(ready(url))
        return {reading: asyncio.run(drive(url, reading, seed)) for reading in order}
    finally:
        proc.terminate()
        proc.wait(timeout=120)


def flag(folder: Path) -> float | None:
    """FlagEmbedding's requests/s (of 16 texts) encoding all three outputs, 128 texts a call."""
    if not FLAG_PYTHON.exists():
        return None
    merged = PER_REQUEST * IN_FLIGHT
    args = [str(folder), str(SECONDS), str(WARMUP), str(merged), json.dumps(list(_WORDS))]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [str(FLAG_PYTHON), "-c", FLAG, *args],
        capture_output=True,
        text=True,
        timeout=SECONDS * 6 + 300,
        env=env,
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    return float(done.stdout.strip().splitlines()[-1]) / PER_REQUEST


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model-dir", type=Path, default=None, help="build the model here once, and reuse it"
    )


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, float]]]:
    work = Path(tempfile.mkdtemp(prefix="bge-m3-bench-"))
    try:
        base = args.model_dir or work
        folder = base / "bge-m3"
        if not (folder / "sparse_linear.pt").exists():  # written last
            build(base)
        readings = ["dense", "all3", "all3-b64"]
        rounds: list[dict[str, float]] = []
        for r in range(args.rounds):
            got: dict[str, float] = {}
            steps = ["ours", "lib-8x16", "lib-128", "flag-128"]
            for step in steps if r % 2 == 0 else steps[::-1]:
                if step == "ours":
                    order = readings if r % 2 == 0 else readings[::-1]
                    for reading, rps in ours(folder, work, order, seed=r).items():
                        got[f"{reading}.ours"] = rps
                        got[f"{reading}.seconds"] = 1 / rps
                elif step == "flag-128":
                    if (rps := flag(folder)) is not None:
                        got["all3.flag-128"] = rps
                else:
                    how = "threads" if step == "lib-8x16" else "merged"
                    got[f"dense.{step}"] = library_run(folder, "SentenceTransformer", "encode", how)
            got["dense.best-library"] = max(got["dense.lib-8x16"], got["dense.lib-128"])
            rounds.append(got)
            print(f"round {r + 1}: " + json.dumps({k: round(v, 4) for k, v in got.items()}))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    params = {
        "inputs_per_request": PER_REQUEST,
        "in_flight": IN_FLIGHT,
        "seconds": SECONDS,
        "warmup_s": WARMUP,
        "dtype": "float32 (ours configured; the library's and FlagEmbedding's own)",
        "model": "BAAI/bge-m3's shape, random weights (models/demo_m3.REAL), both heads",
        "flag": "FlagEmbedding 1.4.2 BGEM3FlagModel.encode, 128 texts a call, all outputs",
    }
    return params, rounds
