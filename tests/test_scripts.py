"""Operator scripts run against a live server (smoke) or in their short mode (bench)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.utils import RemoteServer

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


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

    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bench.py"),
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
            "--out-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
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
