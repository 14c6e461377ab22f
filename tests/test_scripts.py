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
