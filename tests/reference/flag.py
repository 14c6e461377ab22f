"""FlagEmbedding's BGEM3FlagModel on a folder, run by flagembedding_m3.py in the environment
that has FlagEmbedding (requirements/flagembedding.txt, built by CI: `.venv-flag`, or
FLAG_PYTHON); a test without that environment is skipped, never passed."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLAG_PYTHON = Path(os.environ.get("FLAG_PYTHON", ROOT / ".venv-flag" / "bin" / "python"))


def flag_reference(
    folder: Path,
    texts: Sequence[str],
    pairs: Sequence[tuple[str, str]],
    weights: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Its dense, lexical and ColBERT outputs of `texts`, compute_score of `pairs` (and with
    `weights`, the hybrid with those: `weighted`)."""
    if not FLAG_PYTHON.exists():
        pytest.skip(
            f"no FlagEmbedding environment at {FLAG_PYTHON} (requirements/flagembedding.txt)"
        )
    script = Path(__file__).with_name("flagembedding_m3.py")
    args = [str(FLAG_PYTHON), str(script), str(folder), json.dumps(texts), json.dumps(pairs)]
    if weights is not None:
        args.append(json.dumps(list(weights)))
    done = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
