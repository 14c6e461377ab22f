#!/usr/bin/env python3
"""#53's measurement: page images per second, served vs the library's own `encode_document` on
the same pages in one process (same batch size); and the p50 latency of one text query,
served vs `encode_query`. ColPali built offline (tests/fixtures/tiny_vision.py): the tiny
model (56 px pages: 16 image tokens) and a mid-size one (224 px pages: 256 image tokens, the
per-page token count of a real ColPali at a quarter of its 1,024; hidden 256, 4 layers).

    python scripts/pages_bench.py --rounds 3 --pages 64 --out bench-results/pages.json

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
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def build(kind: str, out: Path) -> Path:
    from tests.fixtures import tiny_vision

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
        {"model": "colpali", "modality": "image", "encoding_format": "base64",
         "input": [uri(p) for p in imgs[i : i + per_request]]}
        for i in range(0, len(imgs), per_request)
    ]  # fmt: skip
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
        [sys.executable, "-m", "openai_compat", "serve", "--config", str(config),
         "--host", "127.0.0.1", "--port", str(port), "--cache-bytes", "0",
         "--no-access-log"],
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
    )  # fmt: skip
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("tiny", "mid"), action="append")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pages", type=int, default=64, help="pages per round and system")
    parser.add_argument("--batch", type=int, default=16, help="batch size, both systems")
    parser.add_argument("--per-request", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--queries", type=int, default=30)
    parser.add_argument("--port", type=int, default=8791)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "pages.json")
    args = parser.parse_args()
    from sentence_transformers import MultiVectorEncoder

    results = []
    for kind in args.model or ["tiny", "mid"]:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            folder = build(kind, work / "colpali")
            model = MultiVectorEncoder(str(folder), device="cpu")
            server = start_server(folder, args.port, args.batch, work)
            try:
                queries = [f"what is the total amount {i}" for i in range(args.queries)]
                library_round(model, pages(4, 999), args.batch, queries[:3])  # warm both
                asyncio.run(served_round(f"http://127.0.0.1:{args.port}", pages(4, 998),
                                         4, 1, queries[:3]))  # fmt: skip
                rounds: list[dict[str, Any]] = []
                for r in range(args.rounds):
                    order = ["library", "served"] if r % 2 == 0 else ["served", "library"]
                    row: dict[str, Any] = {"round": r + 1}
                    for system in order:
                        imgs = pages(args.pages, seed=r * 2 + (system == "served"))
                        if system == "library":
                            row[system] = library_round(model, imgs, args.batch, queries)
                        else:
                            row[system] = asyncio.run(served_round(
                                f"http://127.0.0.1:{args.port}", imgs, args.per_request,
                                args.concurrency, queries,
                            ))  # fmt: skip
                    row["pages_ratio"] = (
                        row["served"]["pages_per_s"] / row["library"]["pages_per_s"]
                    )
                    row["query_p50_ratio"] = (
                        row["served"]["query_p50_ms"] / row["library"]["query_p50_ms"]
                    )
                    print(kind, json.dumps(row), flush=True)
                    rounds.append(row)
            finally:
                server.terminate()
                server.wait(60)
        results.append({"model": kind, "rounds": rounds})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    args.out.write_text(
        json.dumps(
            {
                "scenario": "pages",
                "date": time.strftime("%Y-%m-%d"),
                "commit": commit,
                "hardware": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
                "settings": {k: v for k, v in vars(args).items() if k != "out"}
                | {"out": str(args.out)},
                "results": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
