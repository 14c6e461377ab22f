"""`openai-compat demo-models` shows its progress: a bar per fine-tuning (it ran 351 s in
silence for a new user whose docs said about a minute)."""

from __future__ import annotations

from pathlib import Path

import pytest

from openai_compat.models import demo


def test_each_fine_tuning_shows_a_progress_bar(
    minilm_path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = demo._finetune(
        minilm_path,
        tmp_path / "tiny-classifier",
        (["good", "bad"],),
        [1, 0],
        num_labels=2,
        steps=2,
        lr=1e-4,
    )
    err = capsys.readouterr().err
    assert "training tiny-classifier" in err and "2/2" in err
    assert (out / "config.json").is_file()
