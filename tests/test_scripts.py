"""Operator scripts run against a live server (smoke) or in their short mode (bench)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    out_dir: Path, *args: str, timeout: int, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """scripts/bench.py with `args`, writing into `out_dir`; it must exit 0."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench.py"), *args, "--out-dir", str(out_dir)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


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


def test_bench_short_mode_runs_and_writes_its_outputs(tmp_path: Path) -> None:
    """The benchmark itself (tiny counts on debugengine): it runs and reports; no speed asserted."""
    import json

    peer = {"INFINITY_PYTHON": infinity_python()}
    out = run_bench(
        tmp_path,
        "--models",
        "debug",
        "--systems",
        "ours,infinity,inprocess",
        "--inputs",
        "1",
        "--formats",
        "float,base64",
        "--concurrency",
        "2",
        "--duration",
        "0.5",
        "--warmup",
        "0.2",
        "--rounds",
        "2",
        timeout=600,
        env=peer,
    )
    assert "[bench] round 2/2" in out.stderr  # progress
    assert "vs infinity" in out.stdout and "debug/n1/float/text/c2" in out.stdout
    assert "spread" in out.stdout
    report = json.loads((tmp_path / "results.json").read_text())
    systems = {r["system"] for r in report["runs"]}
    assert systems == {"ours", "infinity", "inprocess"}
    for run in report["runs"]:
        assert run["requests"] > 0 and run["errors"] == 0
        assert run["p50_ms"] > 0
    assert report["machine"]["generator_cpus"] and report["machine"]["server_cpus"]
    ours = [r for r in report["summary"] if r["system"] == "ours"]
    for row in ours:
        ratio = row["ours_vs_infinity"]
        assert row["rounds"] == 2 and ratio["min"] <= ratio["max"] and ratio["median"] > 0
        assert row["requests_per_s_min"] <= row["requests_per_s"] <= row["requests_per_s_max"]
    png = (tmp_path / "throughput.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_batch_impact_runs_every_mode_and_reports_ratios(tmp_path: Path) -> None:
    """--batch-impact on debugengine (tiny counts): live load alone and beside a batch job,
    the job alone, and the engine in-process."""
    import json

    out = run_bench(
        tmp_path,
        "--batch-impact",
        "--models",
        "debug",
        "--concurrency",
        "2",
        "--duration",
        "3",
        "--warmup",
        "0.2",
        "--rounds",
        "2",
        "--batch-lines",
        "20000",
        timeout=600,
    )
    assert "with-batch / alone: p50" in out.stdout
    assert "the batch ended inside the window" not in out.stderr
    report = json.loads((tmp_path / "batch-impact.json").read_text())
    assert set(report["runs"]) == {"alone", "with-batch"}
    for runs in report["runs"].values():
        assert len(runs) == 2 and all(r["requests"] > 0 and r["errors"] == 0 for r in runs)
    assert len(report["ratio_p99"]) == 2 and all(r > 0 for r in report["ratio_p99"])
    assert all(x > 0 for x in report["batch_lines_per_s"])  # the batch moved meanwhile
    assert len(report["job_alone_lines_per_s"]) == 2 and all(
        x > 0 for x in report["job_alone_lines_per_s"]
    )
    assert len(report["inprocess_inputs_per_s"]) == 2
    assert report["job_vs_inprocess"] == pytest.approx(
        [
            16 * j / e
            for j, e in zip(
                report["job_alone_lines_per_s"], report["inprocess_inputs_per_s"], strict=True
            )
        ]
    )
    assert "job with no live traffic:" in out.stdout


def test_bench_grid_runs_every_backend_and_length_with_accuracy(tmp_path: Path) -> None:
    """--grid (tiny counts, torch and ONNX int8): every length x concurrency per backend,
    ratios to torch from the same rounds, and the served vectors' cosine to torch."""
    import json

    out = run_bench(
        tmp_path,
        "--grid",
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
        "--rounds",
        "2",
        timeout=900,
    )
    report = json.loads((tmp_path / "grid.json").read_text())
    rows = {(r["backend"], r["tokens"], r["concurrency"]): r for r in report["summary"]}
    assert set(rows) == {
        (b, t, c) for b in ("torch", "onnx-int8") for t in (16, 128) for c in (1, 4)
    }
    for (backend, _, _), row in rows.items():
        assert row["errors"] == 0 and row["inputs_per_s"] > 0
        assert row["inputs_per_s_min"] <= row["inputs_per_s"] <= row["inputs_per_s_max"]
        if backend == "torch":
            assert row["vs_torch_min"] == row["vs_torch_max"] == 1.0
    acc = report["accuracy_vs_torch"]
    assert min(acc["torch"].values()) == pytest.approx(1.0, abs=1e-6)
    assert 0.98 <= min(acc["onnx-int8"].values()) < 0.99999  # int8: close, not identical
    assert (
        15 <= report["tokens_per_text"]["16"] <= 17
        and 126 <= report["tokens_per_text"]["128"] <= 130
    )
    assert "onnx-int8" in out.stdout and "vs torch" in out.stdout
    assert (tmp_path / "grid.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_ray_measures_overhead_and_scaling(tmp_path: Path) -> None:
    """--ray (tiny counts, one round): a Ray node per phase, ours deployed by `serve --ray`,
    every run answered without errors, ratios from the same round, nothing of Ray left."""
    import json

    from tests.utils import live_pids

    run_bench(
        tmp_path,
        "--ray",
        "--inputs",
        "4",
        "--concurrency",
        "2",
        "--duration",
        "1",
        "--warmup",
        "0.5",
        "--rounds",
        "1",
        timeout=900,
    )
    report = json.loads((tmp_path / "ray-serve.json").read_text())
    assert report["inputs_per_request"] == 4 and report["concurrency"] == 2
    (overhead,) = report["overhead"]["rounds"]
    (scaling,) = report["scaling"]["rounds"]
    runs = [overhead["single"], overhead["ray"], scaling["ray_1"], scaling["ray_2"]]
    runs.append(scaling["single"])
    assert all(r["errors"] == 0 and r["requests"] > 0 for r in runs), runs
    ratio = overhead["ray"]["inputs_per_s"] / overhead["single"]["inputs_per_s"]
    assert report["overhead"]["ray_vs_single"]["median"] == pytest.approx(ratio, abs=1e-3)
    assert report["scaling"]["two_vs_one_replica"]["median"] == pytest.approx(
        scaling["ray_2"]["inputs_per_s"] / scaling["ray_1"]["inputs_per_s"], abs=1e-3
    )
    assert not live_pids(b"/tmp/rb-"), "Ray processes left behind"
