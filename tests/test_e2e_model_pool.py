"""Six models of every kind (text embeddings, classifier, reranker, SPLADE, CLIP, CLAP) served
lazily with --max-loaded-models 2, under round-robin traffic from several clients: every
answer equals an eager server's, never more than two are resident, the process RSS stays
under a bound measured here, and /health stays fast while models load and unload."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.utils import RemoteServer, write_config

pytestmark = pytest.mark.slow

ADMIN = {"Authorization": "Bearer pool-admin"}
TEXTS = ["A man is eating food.", "The stock market crashed today.", "Bread and cheese."]
MiB = 2**20


def _models(trained: dict[str, Path], media: dict[str, Path], splade: Path) -> list[dict[str, Any]]:
    return [
        {"name": "minilm", "model": "builtin:all-MiniLM-L6-v2"},
        {"name": "sentiment", "model": trained["classifier"]},
        {"name": "reranker", "model": trained["reranker"]},
        {"name": "splade", "model": splade, "max_length": 256},
        {"name": "clip", "model": media["clip"]},
        {"name": "clap", "model": media["clap"]},
    ]


def _serve(folder: Path, models: list[dict[str, Any]], *args: str) -> RemoteServer:
    config = write_config(folder / "models.toml", models)
    return RemoteServer(["--config", str(config), "--cache-bytes", "0", *args])


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory,
    trained_models: dict[str, Path],
    tiny_media_models: dict[str, Path],
    splade_path: Path,
) -> Iterator[tuple[RemoteServer, RemoteServer]]:
    models = _models(trained_models, tiny_media_models, splade_path)
    eager = _serve(tmp_path_factory.mktemp("eager"), models)
    try:
        lazy_models = [{**m, "load": "lazy"} for m in models]
        lazy = _serve(
            tmp_path_factory.mktemp("lazy"),
            lazy_models,
            "--max-loaded-models",
            "2",
            "--admin-key",
            "pool-admin",
        )
        try:
            yield eager, lazy
        finally:
            lazy.stop()
    finally:
        eager.stop()


# One request per model: (path, body, how to read the numbers out of the answer)
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "minilm": ("/v1/embeddings", {"model": "minilm", "input": TEXTS, "encoding_format": "float"}),
    "sentiment": ("/v1/classify", {"model": "sentiment", "input": TEXTS}),
    "reranker": ("/v1/rerank", {"model": "reranker", "query": "food", "documents": TEXTS}),
    "splade": ("/v1/embeddings", {"model": "splade", "input": TEXTS, "encoding_format": "float"}),
    "clip": ("/v1/embeddings", {"model": "clip", "input": TEXTS, "encoding_format": "float"}),
    "clap": ("/v1/embeddings", {"model": "clap", "input": TEXTS, "encoding_format": "float"}),
}


def _numbers(name: str, body: dict[str, Any]) -> list[float]:
    if name == "sentiment":
        return [s["score"] for item in body["data"] for s in item["labels"]]
    if name == "reranker":
        return [r["relevance_score"] for r in sorted(body["results"], key=lambda r: r["index"])]
    if name == "splade":
        return [v for d in body["data"] for v in d["embedding"]["values"]]
    return [v for d in body["data"] for v in d["embedding"]]


def _ask(server: RemoteServer, name: str) -> list[float]:
    path, body = REQUESTS[name]
    r = httpx.post(server.url + path, json=body, timeout=120)
    # a failed load says why in the server's log only: show its end
    assert r.status_code == 200, (name, r.text[:300], server.output()[-3000:])
    return _numbers(name, r.json())


def _rss(server: RemoteServer) -> int:
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class Watch:
    """Samples, until stopped: how many models are in memory (loading, loaded or unloading),
    the server's RSS, and how long /health takes."""

    def __init__(self, server: RemoteServer) -> None:
        self.server = server
        self.resident: list[int] = []
        self.rss: list[int] = []
        self.steady_rss: list[int] = []  # sampled while no model was loading or unloading
        self.health: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                assert client.get(self.server.url + "/health").status_code == 200
                self.health.append(time.perf_counter() - started)
                states = client.get(self.server.url + "/admin/models", headers=ADMIN).json()
                kinds = [m["state"] for m in states["data"]]
                self.resident.append(sum(k in ("loading", "loaded", "unloading") for k in kinds))
                rss = _rss(self.server)
                self.rss.append(rss)
                after = client.get(self.server.url + "/admin/models", headers=ADMIN).json()
                if not {"loading", "unloading"} & {
                    m["state"] for m in [*states["data"], *after["data"]]
                }:
                    self.steady_rss.append(rss)
                self._stop.wait(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def test_unloading_gives_the_memory_back(servers: tuple[RemoteServer, RemoteServer]) -> None:
    """20 load/unload cycles of one model do not grow the RSS: the allocator's arenas are
    trimmed after each unload, so what stays is fragmentation noise (a few MiB either way),
    never a model's worth (a model kept alive by a reference would add its whole size every
    cycle)."""
    _, lazy = servers
    for m in httpx.get(lazy.url + "/admin/models", headers=ADMIN).json()["data"]:
        httpx.post(f"{lazy.url}/admin/models/{m['id']}/unload", headers=ADMIN, timeout=60)
    after_first: int | None = None
    series = []
    for cycle in range(20):
        r = httpx.post(lazy.url + "/admin/models/minilm/load", headers=ADMIN, timeout=120)
        assert r.status_code == 200 and r.json()["state"] == "loaded"
        loaded_size = r.json()["resident_bytes"]
        r = httpx.post(lazy.url + "/admin/models/minilm/unload", headers=ADMIN, timeout=60)
        assert r.json()["state"] == "unloaded"
        series.append(round(_rss(lazy) / MiB))
        if cycle == 1:
            after_first = _rss(lazy)
    assert after_first is not None
    growth = _rss(lazy) - after_first
    print(f"rss after each of 20 load/unload cycles (MiB): {series}")
    # 18 cycles after the first two: less than half of one load's size in all
    assert growth < loaded_size / 2, (growth / MiB, loaded_size / MiB, series)


def test_round_robin_traffic_on_two_slots_answers_as_the_eager_server(
    servers: tuple[RemoteServer, RemoteServer],
) -> None:
    eager, lazy = servers
    want = {name: np.asarray(_ask(eager, name)) for name in REQUESTS}
    for name in REQUESTS:  # each kind's runtime set up once (torch's pools, processors)
        httpx.post(f"{lazy.url}/admin/models/{name}/load", headers=ADMIN, timeout=120)
        httpx.post(f"{lazy.url}/admin/models/{name}/unload", headers=ADMIN, timeout=60)
    floor = _rss(lazy)  # nothing loaded, the runtime warm
    names = list(REQUESTS)
    # three clients, each its own order over the six, twice: the two slots churn
    orders = [names * 2, names[::-1] * 2, (names[2:] + names[:2]) * 2]
    watch = Watch(lazy)
    try:
        with ThreadPoolExecutor(len(orders)) as pool:
            results = list(pool.map(lambda order: [(n, _ask(lazy, n)) for n in order], orders))
    finally:
        watch.stop()
    for client in results:
        for name, got in client:
            np.testing.assert_allclose(got, want[name], atol=1e-5, err_msg=name)
    assert watch.resident and max(watch.resident) <= 2, watch.resident
    states = httpx.get(lazy.url + "/admin/models", headers=ADMIN).json()["data"]
    assert sum(m["loads"] for m in states) > 6  # they really came and went
    sizes = {m["id"]: m["resident_bytes"] or 0 for m in states}
    two = sum(sorted(sizes.values())[-2:])
    assert two > 10 * MiB  # measured, not guessed
    # Between loads: the two largest models resident, plus request buffers and the
    # allocator's slack. (During a load the new model briefly holds its weights twice.)
    bound = floor + two + 64 * MiB
    everything = floor + sum(sizes.values())
    # after the traffic: two models loaded, at rest (the watcher may have caught every sample
    # mid-load on a busy machine: this one is always steady)
    watch.steady_rss.append(_rss(lazy))
    print(
        f"rss floor {floor / MiB:.0f} MiB, steady max {max(watch.steady_rss) / MiB:.0f} MiB, "
        f"peak {max(watch.rss) / MiB:.0f} MiB, bound {bound / MiB:.0f} MiB, all six resident "
        f"~{everything / MiB:.0f} MiB; sizes (MiB): "
        f"{ {k: round(v / MiB) for k, v in sizes.items()} }"
    )
    assert bound < everything  # the bound tells two resident from all six
    assert max(watch.steady_rss) < bound
    health = sorted(watch.health)
    p99 = health[int(len(health) * 0.99) - 1]
    assert len(health) >= 20 and p99 < 0.1, health[-5:]
