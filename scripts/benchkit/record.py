"""One output format for every scenario: a JSON line per run in docs/bench/results/SCENARIO.jsonl
with where it ran (hardware, versions, commit, date), what it ran (the parameters), and each
figure with its rounds, median and spread; ratios to the figure's anchor are taken round by
round (both read in the same round), then summarised the same way."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "bench" / "results"  # published: docs/benchmarks.md reads these
SCRATCH = ROOT / "bench-results"  # a run without --publish (untracked)


@dataclass(frozen=True)
class Figure:
    """One published number: `key` in each round's dict; `anchor` another key of the same
    round it is compared to (the ratio key/anchor is published beside it)."""

    key: str
    label: str
    unit: str
    better: str = "higher"  # or "lower"
    anchor: str | None = None
    goal: float | None = None  # the ratio to the anchor an issue asks for (<= for "lower")


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
        return out.stdout.strip()
    except OSError:
        return ""


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


# Run by the interpreter whose packages a result depends on: the versions of `packages` there.
_VERSIONS = """
import json, platform, sys
from importlib.metadata import PackageNotFoundError, version
found = {"python": platform.python_version()}
for package in sys.argv[1:]:
    try:
        found[package] = version(package)
    except PackageNotFoundError:
        pass
print(json.dumps(found))
"""


def versions(python: str, packages: tuple[str, ...]) -> dict[str, str]:
    """The installed versions of `packages` (and "python") in `python`'s environment; those
    not installed are left out, and nothing where `python` cannot run."""
    try:
        out = subprocess.run(
            [python, "-c", _VERSIONS, *packages],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return dict(json.loads(out.stdout))
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}


# What decides a measurement: the package, the tool, the dependencies (not the docs).
_CODE = ("status", "-s", "--", "openai_compat", "scripts", "pyproject.toml", "requirements")


def environment(python: str = sys.executable) -> dict[str, Any]:
    """Where a run ran: the machine, the versions of the install that ran our server
    (`python`), the commit (dirty if the code had changes), the date."""
    packages = ("openai-compat", "torch", "transformers", "sentence-transformers", "numpy")
    found: dict[str, str] = versions(python, packages)
    infinity = os.environ.get("INFINITY_PYTHON")
    if infinity:
        found["infinity-emb"] = versions(infinity, ("infinity-emb",)).get("infinity-emb", "")
    return {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "commit": _git("rev-parse", "--short", "HEAD") + ("-dirty" if _git(*_CODE) else ""),
        "hardware": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0)),
            "memory_gib": _memory_gib(),
            "gpu": None,
        },
        "versions": {k: v for k, v in found.items() if v},
    }


def summarise(figures: list[Figure], rounds: list[dict[str, float]]) -> dict[str, Any]:
    """Each figure's median and spread over rounds, and its ratio to its anchor per round
    (keyed "KEY / ANCHOR": one key may be published against two anchors)."""
    out: dict[str, Any] = {}
    for f in figures:
        values = [r[f.key] for r in rounds if r.get(f.key) is not None]
        if not values:
            continue
        entry: dict[str, Any] = {**asdict(f), **spread(values), "rounds": values}
        if f.anchor is not None:
            ratios = [
                r[f.key] / r[f.anchor]
                for r in rounds
                if r.get(f.key) is not None and r.get(f.anchor)
            ]
            if ratios:
                entry["ratio"] = {**spread(ratios), "rounds": [round(x, 4) for x in ratios]}
        out[f.key if f.anchor is None else f"{f.key} / {f.anchor}"] = entry
    return out


def write(
    scenario: str,
    params: dict[str, Any],
    figures: list[Figure],
    rounds: list[dict[str, float]],
    extra: dict[str, Any] | None = None,
    results: Path = RESULTS,
) -> dict[str, Any]:
    """Append the run's line to results/SCENARIO.jsonl and return it."""
    line = {
        "scenario": scenario,
        # one-client and shared-cpu run ours from OURS_PYTHON (benchkit/install.py) and say so
        **environment(params.get("ours_python", sys.executable)),
        "params": params,
        "figures": summarise(figures, rounds),
        "rounds": rounds,
        **(extra or {}),
    }
    results.mkdir(parents=True, exist_ok=True)
    with (results / f"{scenario}.jsonl").open("a") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")
    for key, fig in line["figures"].items():
        ratio = fig.get("ratio")
        tail = f"  x{ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})" if ratio else ""
        print(
            f"[{scenario}] {key}: {fig['median']:.4g} {fig['unit']} "
            f"({fig['min']:.4g}-{fig['max']:.4g}){tail}",
            file=sys.stderr,
        )
    return line


def latest(results: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """The newest line of each scenario's results file."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(results.glob("*.jsonl")):
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
        if lines:
            found[path.stem] = json.loads(lines[-1])
    return found
