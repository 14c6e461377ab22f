"""--model-pool: what lazy loading and unloading cost (issue #26).

One server (ours, pinned like every benchmark server) serves MiniLM three times: `eager`
(loaded at start), `lazy` and `other` (load = "lazy"), with an admin key. Per round:
- the time to the first answer of a cold lazy model (its load included) vs the eager one's
  (already loaded), one input each;
- live p50/p99 of `eager` (1 input, --concurrency in flight) over a window in which `other`
  loads and unloads, vs the same window length with nothing loading.
Then 20 load/unload cycles of `lazy`: the server's RSS after each. Writes model-pool.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from benchkit.load import Scenario, drive_http, sentences
from benchkit.systems import Server, _start, free_port, rss_kib, wait_ready

ADMIN = {"Authorization": "Bearer bench-admin"}


def _start_pool_server(workdir: Path) -> Server:
    cfg = workdir / "ours-pool.toml"
    model = 'model = "builtin:all-MiniLM-L6-v2"\ndevice = "cpu"\nbatch_size = 32\n'
    cfg.write_text(
        f'[[models]]\nname = "eager"\n{model}'
        f'[[models]]\nname = "lazy"\nload = "lazy"\n{model}'
        f'[[models]]\nname = "other"\nload = "lazy"\n{model}'
    )
    port = free_port()

    cmd = [sys.executable, "-m", "openai_compat", "serve", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--config", str(cfg), "--log-level", "warning"]
    cmd += ["--cache-bytes", "0", "--admin-key", "bench-admin"]
    return _start("ours-pool", cmd, port, workdir)


async def _post(session: aiohttp.ClientSession, url: str, body: Any = None) -> Any:
    headers = ADMIN if "/admin/" in url else {}
    async with session.post(url, json=body, headers=headers) as r:
        data = await r.json()
        if r.status != 200:
            raise RuntimeError(f"{url}: {r.status} {data}")
        return data


async def _first_answer(session: aiohttp.ClientSession, url: str, model: str) -> float:
    body = {"model": model, "input": sentences(1, 7)}
    started = time.perf_counter()
    await _post(session, url + "/v1/embeddings", body)
    return (time.perf_counter() - started) * 1000


def _pcts(latencies: list[float]) -> dict[str, float]:
    data = sorted(latencies)
    pick = lambda q: data[min(len(data) - 1, int(q * len(data)))]  # noqa: E731
    return {"p50_ms": round(pick(0.5), 2), "p99_ms": round(pick(0.99), 2), "n": len(data)}


async def model_pool(args: argparse.Namespace, out_dir: Path, workdir: Path) -> dict[str, Any]:
    srv = _start_pool_server(workdir)
    sc = Scenario("minilm", 1, "float", "text", args.concurrency[0])
    body = orjson.dumps({"model": "eager", "input": sentences(1, 3), "encoding_format": "float"})
    rounds: list[dict[str, Any]] = []
    try:
        await wait_ready(srv, "/ready", limit=600)
        async with aiohttp.ClientSession() as session:
            for i in range(args.rounds):
                row: dict[str, Any] = {"round": i + 1}
                row["eager_first_answer_ms"] = round(
                    await _first_answer(session, srv.url, "eager"), 1
                )
                row["lazy_first_answer_ms"] = round(
                    await _first_answer(session, srv.url, "lazy"), 1
                )
                await _post(session, srv.url + "/admin/models/lazy/unload")
                # live latency while `other` loads, then over a quiet window of the same length
                # (alternating which goes first)
                async with session.get(srv.url + "/admin/models", headers=ADMIN) as r:
                    load_s = {m["id"]: m["load_seconds"] for m in (await r.json())["data"]}
                window = max(4.0, 1.5 * (load_s["lazy"] or 2.0) + 1.0)
                row["window_s"] = round(window, 2)
                for mode in ("loading", "quiet") if i % 2 == 0 else ("quiet", "loading"):
                    live = asyncio.ensure_future(
                        drive_http(srv.url + "/v1/embeddings", body, sc, window, 0.0, 10**6)
                    )
                    if mode == "loading":  # `other` loads (and unloads) inside the window
                        await asyncio.sleep(0.3)
                        await _post(session, srv.url + "/admin/models/other/load")
                        await _post(session, srv.url + "/admin/models/other/unload")
                    _, err, _, lat = await live
                    row["while_loading" if mode == "loading" else "quiet"] = {
                        **_pcts(lat),
                        "errors": err,
                    }
                rounds.append(row)
                print(json.dumps(row), flush=True)
            cycles = []
            assert srv.proc is not None
            for _ in range(20):
                await _post(session, srv.url + "/admin/models/lazy/load")
                await _post(session, srv.url + "/admin/models/lazy/unload")
                cycles.append(round(rss_kib(srv.proc.pid)["rss"] / 1024, 1))
            async with session.get(srv.url + "/admin/models", headers=ADMIN) as r:
                states = await r.json()
    finally:
        srv.stop()
    sizes = {m["id"]: m["resident_bytes"] for m in states["data"]}
    result = {
        "concurrency": sc.concurrency,
        "rounds": rounds,
        "rss_mib_after_each_cycle": cycles,
        "rss_growth_mib_cycles_2_to_20": round(cycles[-1] - cycles[1], 1),
        "resident_bytes": sizes,
        "lazy_first_answer_ms_median": statistics.median(r["lazy_first_answer_ms"] for r in rounds),
        "eager_first_answer_ms_median": statistics.median(
            r["eager_first_answer_ms"] for r in rounds
        ),
    }
    (out_dir / "model-pool.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=2))
    return result
