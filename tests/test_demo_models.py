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


def test_the_demo_serves_visual_retrieval_offline_and_says_what_it_is(tmp_path: Path) -> None:
    """#61.6: the visual models are written beside the text ones, served by the demo's config
    (lazily), each a folder the server loads by its own files; the config says their weights
    are random."""
    import tomllib

    from openai_compat.engine import classes
    from openai_compat.models import demo_vision

    made = demo_vision.build(tmp_path)
    assert [p.name for p in made] == ["pages", "vl-embedder", "vl-reranker"]
    config_path = demo.write_config(tmp_path)
    config = tomllib.loads(config_path.read_text())
    served = {m["name"]: m for m in config["models"]}
    for name, folder in (
        ("demo-pages", "pages"),
        ("demo-vl-embedder", "vl-embedder"),
        ("demo-vl-reranker", "vl-reranker"),
    ):
        assert served[name]["model"] == f"./{folder}" and served[name]["load"] == "lazy"
        assert (tmp_path / folder / "config.json").is_file()
    assert "RANDOM weights" in config_path.read_text()
    # BGE-M3's outputs, offline too: built by demo.build (bge_m3.is_bge_m3 of what it writes)
    assert served["demo-bge-m3"]["model"] == "./bge-m3" and served["demo-bge-m3"]["load"] == "lazy"
    assert classes.architectures(str(tmp_path / "pages"), None, False) == ["ColPaliForRetrieval"]
    again = demo_vision.build(tmp_path)  # kept: nothing rebuilt
    assert [p.stat().st_mtime for p in again] == [p.stat().st_mtime for p in made]


def test_the_demo_builds_a_bge_m3_beside_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """demo.build writes the tiny BGE-M3 the config serves (the fine-tunings stubbed: their
    own test is above), once."""
    from openai_compat.engine import bge_m3

    def made(base: str, out: Path) -> Path:
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        return out

    monkeypatch.setattr(demo, "build_reranker", made)
    monkeypatch.setattr(demo, "build_classifier", made)
    demo.build(tmp_path, base="unused")
    assert bge_m3.is_bge_m3(tmp_path / "bge-m3")
    first = (tmp_path / "bge-m3" / "colbert_linear.pt").stat().st_mtime
    demo.build(tmp_path, base="unused")
    assert (tmp_path / "bge-m3" / "colbert_linear.pt").stat().st_mtime == first
