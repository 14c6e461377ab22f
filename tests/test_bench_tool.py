"""The benchmark tool's one output format and the doc table generated from it
(scripts/benchkit/record.py, table.py), on results written here: ratios are taken within a
round, a goal is judged on the ratio's median, and the doc's generated block is replaced
whole while the text around it stays."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from benchkit import record, table

FIGURES = [
    record.Figure("ours.p99", "p99", "ms", "lower", "peer.p99", 1.0),
    record.Figure("ours.rss", "memory", "MiB", "lower", "peer.rss", 1.0),
    record.Figure("peer.p99", "the peer's p99", "ms", "lower"),
]
ROUNDS = [
    {"ours.p99": 90.0, "peer.p99": 100.0, "ours.rss": 700.0, "peer.rss": 600.0},
    {"ours.p99": 120.0, "peer.p99": 100.0, "ours.rss": 650.0, "peer.rss": 650.0},
    {"ours.p99": 80.0, "peer.p99": 40.0, "ours.rss": 610.0, "peer.rss": 600.0},
]


def test_ratios_are_read_within_each_round() -> None:
    found = record.summarise(FIGURES, ROUNDS)
    p99 = found["ours.p99 / peer.p99"]
    assert p99["rounds"] == [90.0, 120.0, 80.0] and p99["median"] == 90.0
    assert p99["ratio"]["rounds"] == [0.9, 1.2, 2.0]  # not median(ours) / median(peer)
    assert p99["ratio"]["median"] == 1.2 and p99["ratio"]["min"] == 0.9
    assert found["peer.p99"]["median"] == 100.0 and "ratio" not in found["peer.p99"]


def test_a_run_is_one_line_and_the_table_shows_it(tmp_path: Path) -> None:
    results = tmp_path / "results"
    record.write("one-client", {"sizes": [1, 16]}, FIGURES, ROUNDS, results=results)
    record.write("one-client", {"sizes": [1, 16]}, FIGURES, ROUNDS[:1], results=results)
    lines = (results / "one-client.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["params"] == {"sizes": [1, 16]}
    newest = record.latest(results)["one-client"]
    assert len(newest["rounds"]) == 1  # the newest line is the one published
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# Benchmarks\n\nintro\n\n{table.BEGIN}\nold\n{table.END}\n\n## Method\n")
    record.write("one-client", {}, FIGURES, ROUNDS, results=results)
    table.CHARTS = tmp_path / "charts"  # no chart for these figures; nothing written there
    table.generate(doc, results, readme=None)
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nintro\n\n") and text.endswith("## Method\n")
    assert "\nold\n" not in text
    (p99,) = [ln for ln in text.splitlines() if "| p99 (ms)" in ln]
    assert "90.0 (80.0-120)" in p99 and "1.20 (0.90-2.00)x" in p99 and "**not met**" in p99
    (rss,) = [ln for ln in text.splitlines() if "| memory (MiB)" in ln]
    assert "1.02 (1.00-1.17)x" in rss and "**not met**" in rss


def test_a_doc_without_the_generated_block_is_refused(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n")
    with pytest.raises(SystemExit, match="no generated block"):
        table.generate(doc, tmp_path, readme=None)


def test_the_readme_lines_name_their_scenario(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "results"
    record.write("one-client", {}, FIGURES, ROUNDS, results=results)
    monkeypatch.setattr(table, "HEADLINES", [("one-client", "ours.p99 / peer.p99"), ("x", "y")])
    doc, readme = tmp_path / "benchmarks.md", tmp_path / "README.md"
    doc.write_text(f"{table.BEGIN}\n{table.END}\n")
    readme.write_text(f"## Performance\n\n{table.BEGIN}\n{table.END}\n\n## Next\n")
    table.CHARTS = tmp_path / "charts"
    table.generate(doc, results, readme=readme)
    lines = readme.read_text().splitlines()
    assert lines[3] == "- p99: 90.0 (80.0-120) ms, 1.20 (0.90-2.00)x peer.p99 (`one-client`)"
    assert lines[4] == table.END and lines[-1] == "## Next"  # a scenario not run: no line


def test_the_install_measured_is_named(tmp_path: Path) -> None:
    """benchkit/install.py: the README's install steps are what `bench.py venv` runs, and a
    results line says whether the interpreter measured holds more than the runtime
    dependencies (this test venv holds the test extra: pandas among them)."""
    from benchkit import install

    steps = install.readme_install_steps()
    assert steps[-1] == "pip install -e ." and steps[0].startswith("pip install torch==")
    said = install.describe(sys.executable)
    assert said["ours_python"] == sys.executable
    extra = said["ours_extra_packages"]
    assert isinstance(extra, list)
    assert said["ours_install"] == f"runtime dependencies and {len(extra)} more packages"
    assert {"pytest", "pandas", "openai"} <= set(extra)  # the test extra's
    # what the server needs, directly or through its dependencies, is not extra
    assert not {"torch", "fastapi", "sentence-transformers", "scikit-learn", "uvicorn"} & set(extra)


def test_a_run_publishes_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """#61.19: a run without --results appended to the tracked docs/bench/results/."""
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_cli", Path(__file__).resolve().parent.parent / "scripts" / "bench.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    class Scenario:
        NAME, DESCRIPTION, FIGURES = "fake", "a fake scenario", FIGURES

        @staticmethod
        def add_arguments(p: argparse.ArgumentParser) -> None: ...

        @staticmethod
        def measure(args: argparse.Namespace) -> tuple[dict[str, object], list[dict[str, float]]]:
            return {}, ROUNDS

    monkeypatch.setattr(bench, "scenarios", lambda: {"fake": Scenario})
    monkeypatch.setattr(record, "RESULTS", tmp_path / "published")
    monkeypatch.setattr(record, "SCRATCH", tmp_path / "scratch")
    assert bench.main(["run", "fake"]) == 0
    assert (tmp_path / "scratch" / "fake.jsonl").is_file()
    assert not (tmp_path / "published").exists()
    assert bench.main(["run", "fake", "--publish"]) == 0
    assert len((tmp_path / "published" / "fake.jsonl").read_text().splitlines()) == 1
