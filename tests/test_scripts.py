"""Operator scripts run against a live server (smoke) or in their short mode (bench)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.utils import RemoteServer

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def infinity_python() -> str:
    """infinity-emb's environment (requirements/infinity.txt), which CI builds beside the
    default one: the benchmark's peer server runs from there."""
    python = os.environ.get("INFINITY_PYTHON") or str(ROOT / ".venv-infinity" / "bin" / "python")
    if not Path(python).exists():
        pytest.skip("infinity-emb's environment (.venv-infinity, requirements/infinity.txt)")
    return python


def run_bench(
    results: Path,
    scenario: str,
    *kit: str,
    rounds: int = 2,
    timeout: int,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """`scripts/bench.py run SCENARIO` (the load kit's `kit` options after --), recording into
    `results`; it must exit 0. Its one results line."""
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bench.py"),
            "run",
            scenario,
            "--rounds",
            str(rounds),
            "--results",
            str(results),
            "--",
            *kit,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = (results / f"{scenario}.jsonl").read_text().splitlines()
    found: dict[str, Any] = json.loads(line)
    assert found["scenario"] == scenario and found["commit"] and found["hardware"]["cores"]
    assert found["versions"]["torch"] and len(found["rounds"]) == rounds
    return found


def test_smoke_script_passes_every_check_on_a_live_server(multi_server: RemoteServer) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "smoke.py"), "--base-url", multi_server.url],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "9 passed, 0 failed", out.stdout
    assert any(ln.startswith("PASS  rerank (reranker)") for ln in lines)
    assert any(ln.startswith("PASS  classify (sentiment)") for ln in lines)


def test_smoke_script_fails_loudly_against_nothing() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "smoke.py"), "--base-url", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    assert "FAIL  health & ready" in out.stdout


def test_bench_http_layer_records_every_system_with_ratios_from_the_same_round(
    tmp_path: Path,
) -> None:
    """The HTTP-layer scenario (tiny counts on debugengine): every system runs every round,
    and each published ratio is the figure over its anchor within a round."""
    peer = {"INFINITY_PYTHON": infinity_python()}
    line = run_bench(
        tmp_path,
        "http-layer",
        "--systems",
        "ours,infinity,inprocess",
        "--inputs",
        "1",
        "--concurrency",
        "2",
        "--duration",
        "0.5",
        "--warmup",
        "0.2",
        timeout=600,
        env=peer,
    )
    for r in line["rounds"]:
        assert {"ours.n1.c2.rps", "infinity.n1.c2.rps", "inprocess.n1.c2.rps"} <= set(r)
        assert all(v > 0 for v in r.values())
    fig = line["figures"]["ours.n1.c2.rps / infinity.n1.c2.rps"]
    assert fig["ratio"]["rounds"] == pytest.approx(
        [r["ours.n1.c2.rps"] / r["infinity.n1.c2.rps"] for r in line["rounds"]], abs=1e-3
    )
    assert fig["min"] <= fig["median"] <= fig["max"]
    assert line["params"]["concurrency"] == [2] and line["params"]["models"] == ["debug"]


def test_bench_batch_impact_records_live_latency_beside_the_job(tmp_path: Path) -> None:
    """batch-impact on debugengine (tiny counts): live load alone and beside a batch job."""
    line = run_bench(
        tmp_path,
        "batch-impact",
        "--models",
        "debug",
        "--concurrency",
        "2",
        "--duration",
        "3",
        "--warmup",
        "0.2",
        "--batch-lines",
        "20000",
        timeout=600,
    )
    p99 = line["figures"]["with-batch.p99_ms / alone.p99_ms"]
    assert len(p99["ratio"]["rounds"]) == 2 and all(x > 0 for x in p99["ratio"]["rounds"])
    assert all(r["batch_lines_per_s"] > 0 for r in line["rounds"])  # the batch moved meanwhile


def test_bench_backends_runs_every_backend_and_length_with_accuracy(tmp_path: Path) -> None:
    """backends (tiny counts, torch and ONNX int8): every length x concurrency per backend,
    ratios to torch from the same rounds, and the served vectors' cosine to torch."""
    line = run_bench(
        tmp_path,
        "backends",
        "--models",
        "minilm-int8",
        "--lengths",
        "16,128",
        "--concurrency",
        "1,4",
        "--duration",
        "0.5",
        "--warmup",
        "0.2",
        timeout=900,
    )
    keys = {
        f"{b}.t{t}.c{c}.inputs_per_s"
        for b in ("torch", "onnx-int8")
        for t in (16, 128)
        for c in (1, 4)
    }
    assert all(set(r) == keys for r in line["rounds"])
    assert set(line["figures"]) == {
        f"onnx-int8.t{t}.c{c}.inputs_per_s / torch.t{t}.c{c}.inputs_per_s"
        for t in (16, 128)
        for c in (1, 4)
    }
    acc = line["accuracy_vs_torch"]
    assert min(acc["torch"].values()) == pytest.approx(1.0, abs=1e-6)
    assert 0.98 <= min(acc["onnx-int8"].values()) < 0.99999  # int8: close, not identical
    tokens = line["tokens_per_text"]
    assert 15 <= tokens["16"] <= 17 and 126 <= tokens["128"] <= 130


def test_bench_ray_serve_measures_overhead_and_scaling(tmp_path: Path) -> None:
    """ray-serve (tiny counts, one round): a Ray node per phase, ours deployed by `serve
    --ray`, ratios from the same round, nothing of Ray left."""
    from tests.utils import live_pids

    line = run_bench(
        tmp_path,
        "ray-serve",
        "--inputs",
        "4",
        "--concurrency",
        "2",
        "--duration",
        "1",
        "--warmup",
        "0.5",
        rounds=1,
        timeout=900,
    )
    (r,) = line["rounds"]
    assert all(
        r[k] > 0
        for k in (
            "overhead.single.inputs_per_s",
            "overhead.ray.inputs_per_s",
            "scaling.ray_1.inputs_per_s",
            "scaling.ray_2.inputs_per_s",
        )
    )
    ratio = line["figures"]["overhead.ray.inputs_per_s / overhead.single.inputs_per_s"]["ratio"]
    assert ratio["median"] == pytest.approx(
        r["overhead.ray.inputs_per_s"] / r["overhead.single.inputs_per_s"], abs=1e-3
    )
    assert not live_pids(b"/tmp/rb-"), "Ray processes left behind"
