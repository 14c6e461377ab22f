#!/usr/bin/env python3
"""#53's measurement: page images per second, served vs the library's own `encode_document` on
the same pages in one process (same batch size); and the p50 latency of one text query,
served vs `encode_query`. ColPali built offline (openai_compat/models/demo_vision.py): the tiny
model (56 px pages: 16 image tokens) and a mid-size one (224 px pages: 256 image tokens, the
per-page token count of a real ColPali at a quarter of its 1,024; hidden 256, 4 layers).

    python scripts/bench.py run pages [--rounds 3] [--pages 64] [--model tiny --model mid]

Systems alternate round by round (library, served, library, ...), each on fresh pages (no
page repeats within a run: media is never cached anyway). The server runs on every CPU it
is given (`openai-compat serve`, the cache off); the client sends `--per-request` pages a
request with `--concurrency` requests in flight, as data URIs, from this process; the
library runs in this process while the server is idle. Loopback only; bounded by --pages.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchkit.record import Figure

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))


def build(kind: str, out: Path) -> Path:
    from openai_compat.models import demo_vision as tiny_vision

    if kind == "tiny":
        return tiny_vision.build_colpali(out)
    return tiny_vision.build_colpali(out, image_size=224, hidden=256, layers=4)


def pages(n: int, seed: int) -> list[Any]:
    """Document-like pages (a white sheet, lines of dark word boxes, a coloured figure),
    each different: a scanned page's PNG is tens of KB, not a photograph's noise."""
    from PIL import Image, ImageDraw

    rng = np.random.RandomState(seed)
    out = []
    for _ in range(n):
        page = Image.new("RGB", (425, 550), "white")
        draw = ImageDraw.Draw(page)
        y = 30
        while y < 500:
            x = 30
            while x < 380:
                w = int(rng.randint(12, 60))
                draw.rectangle([x, y, min(x + w, 395), y + 8], fill=(20, 20, 20))
                x += w + 6
            y += int(rng.randint(14, 22))
        fx, fy = int(rng.randint(40, 250)), int(rng.randint(60, 380))
        colour = tuple(int(c) for c in rng.randint(0, 255, 3))
        draw.rectangle([fx, fy, fx + 120, fy + 80], fill=colour)
        out.append(page)
    return out


def uri(img: Any) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def library_round(model: Any, imgs: list[Any], batch: int, queries: list[str]) -> dict[str, float]:
    start = time.perf_counter()
    model.encode_document(imgs, batch_size=batch)
    took = time.perf_counter() - start
    latencies = []
    for q in queries:
        t = time.perf_counter()
        model.encode_query([q])
        latencies.append(time.perf_counter() - t)
    return {"pages_per_s": len(imgs) / took, "query_p50_ms": statistics.median(latencies) * 1e3}


async def served_round(
    url: str, imgs: list[Any], per_request: int, concurrency: int, queries: list[str]
) -> dict[str, float]:
    bodies = [
        {
            "model": "colpali",
            "modality": "image",
            "encoding_format": "base64",
            "input": [uri(p) for p in imgs[i : i + per_request]],
        }
        for i in range(0, len(imgs), per_request)
    ]
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        todo = list(bodies)

        async def worker() -> None:
            while todo:
                body = todo.pop()
                r = await client.post("/v1/embeddings", json=body)
                r.raise_for_status()

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        took = time.perf_counter() - start
        latencies = []
        for q in queries:
            body = {"model": "colpali", "input": [q], "input_type": "query"}
            t = time.perf_counter()
            (await client.post("/v1/embeddings", json=body)).raise_for_status()
            latencies.append(time.perf_counter() - t)
    return {"pages_per_s": len(imgs) / took, "query_p50_ms": statistics.median(latencies) * 1e3}


def start_server(folder: Path, port: int, batch: int, work: Path) -> subprocess.Popen[bytes]:
    config = work / "pages.toml"
    config.write_text(f'[[models]]\nname = "colpali"\nmodel = "{folder}"\nbatch_size = {batch}\n')
    log = (work / "server.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "openai_compat",
            "serve",
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--cache-bytes",
            "0",
            "--no-access-log",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the server did not get ready: {work / 'server.log'}")


NAME = "pages"
DESCRIPTION = "ColPali page images/s and a text query's p50, served vs the library in-process"
FIGURES = [
    Figure(
        f"{kind}.served.pages_per_s",
        f"{kind} ColPali: page images",
        "pages/s",
        "higher",
        f"{kind}.library.pages_per_s",
    )
    for kind in ("mid", "tiny")
] + [
    Figure(
        f"{kind}.served.query_p50_ms",
        f"{kind} ColPali: one text query's p50",
        "ms",
        "lower",
        f"{kind}.library.query_p50_ms",
    )
    for kind in ("mid", "tiny")
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=("tiny", "mid"), action="append")
    parser.add_argument("--pages", type=int, default=64, help="pages per round and system")
    parser.add_argument("--batch", type=int, default=16, help="batch size, both systems")
    parser.add_argument("--per-request", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--queries", type=int, default=30)
    parser.add_argument("--port", type=int, default=8791)


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, float]]]:
    from sentence_transformers import MultiVectorEncoder

    kinds = args.model or ["tiny", "mid"]
    rounds: list[dict[str, float]] = [{} for _ in range(args.rounds)]
    for kind in kinds:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            folder = build(kind, work / "colpali")
            model = MultiVectorEncoder(str(folder), device="cpu")
            server = start_server(folder, args.port, args.batch, work)
            try:
                queries = [f"what is the total amount {i}" for i in range(args.queries)]
                library_round(model, pages(4, 999), args.batch, queries[:3])  # warm both
                asyncio.run(
                    served_round(f"http://127.0.0.1:{args.port}", pages(4, 998), 4, 1, queries[:3])
                )
                for r in range(args.rounds):
                    order = ["library", "served"] if r % 2 == 0 else ["served", "library"]
                    for system in order:
                        imgs = pages(args.pages, seed=r * 2 + (system == "served"))
                        if system == "library":
                            got = library_round(model, imgs, args.batch, queries)
                        else:
                            got = asyncio.run(
                                served_round(
                                    f"http://127.0.0.1:{args.port}",
                                    imgs,
                                    args.per_request,
                                    args.concurrency,
                                    queries,
                                )
                            )
                        rounds[r] |= {f"{kind}.{system}.{k}": v for k, v in got.items()}
                    print(kind, rounds[r], flush=True)
            finally:
                server.terminate()
                server.wait(60)
    params = {
        k: v
        for k, v in vars(args).items()
        if k in ("pages", "batch", "per_request", "concurrency", "queries")
    } | {
        "models": {
            "tiny": "56 px pages, 16 image tokens",
            "mid": "224 px, 256 image tokens, hidden 256, 4 layers",
        },
    }
    return params, rounds
