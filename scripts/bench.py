#!/usr/bin/env python3
"""The project's one benchmark tool: every figure docs/benchmarks.md and the README publish
comes from a scenario run here with --publish, and the doc's current table and charts are
generated from the results it writes.

    python scripts/bench.py list                      # the scenarios and what each measures
    python scripts/bench.py run SCENARIO [--rounds N] [--publish] [scenario options]
    python scripts/bench.py run throughput -- --duration 10     # options of the load kit
    python scripts/bench.py table                     # docs/benchmarks.md's table and charts
    python scripts/bench.py venv DIR                  # a user's install (README) to measure:
    OURS_PYTHON=DIR/bin/python python scripts/bench.py run one-client   # benchkit/install.py

Every scenario alternates its systems round by round (at least 3 rounds for a published
figure), reads ratios within a round, targets 127.0.0.1 only and stops by itself. A run
appends one JSON line to bench-results/SCENARIO.jsonl (untracked), or with --publish to
docs/bench/results/SCENARIO.jsonl: the machine, the versions, the commit, the parameters,
every figure's rounds, median and spread (benchkit/record.py).
infinity-emb's server runs from its own environment: INFINITY_PYTHON=.venv-infinity/bin/python
(requirements/infinity.txt).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchkit
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests (fixtures' models)


def scenarios() -> dict[str, Any]:
    from benchkit.scenarios import (
        bge_m3,
        families,
        lab,
        one_client,
        pages,
        precision,
        shared_cpu,
        tenants,
    )

    modules: list[ModuleType | Any] = [
        one_client,
        shared_cpu,
        precision,
        families,
        pages,
        tenants,
        bge_m3,
    ]
    return {m.NAME: m for m in [*modules, *lab.SCENARIOS]}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--inprocess-worker"]:  # benchkit/inprocess.py's worker process
        from benchkit.inprocess import inprocess_worker

        asyncio.run(inprocess_worker(argv[1]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the scenarios")
    commands.add_parser("table", help="regenerate docs/benchmarks.md's table and charts")
    venv = commands.add_parser("venv", help="make a venv as the README's first command does")
    venv.add_argument("dir", type=Path)
    run = commands.add_parser("run", help="run one scenario and record its results")
    run_commands = run.add_subparsers(dest="scenario", required=True)
    known = scenarios()
    for name, scenario in known.items():
        sub = run_commands.add_parser(name, help=scenario.DESCRIPTION)
        sub.add_argument("--rounds", type=int, default=3, help="alternated rounds (>= 3)")
        sub.add_argument(
            "--results",
            type=Path,
            default=None,
            help="results folder (default: bench-results/, untracked; --publish: the docs')",
        )
        sub.add_argument(
            "--publish",
            action="store_true",
            help="append to docs/bench/results/ (tracked: what docs/benchmarks.md reads)",
        )
        scenario.add_arguments(sub)
    args = parser.parse_args(argv)
    if args.command == "list":
        for name, scenario in known.items():
            print(f"{name:14s} {scenario.DESCRIPTION}")
        return 0
    if args.command == "table":
        from benchkit import table

        table.generate(definitions=known)
        return 0
    if args.command == "venv":
        from benchkit import install

        print(install.make_venv(args.dir))
        return 0
    from benchkit import record

    scenario = known[args.scenario]
    params, rounds = scenario.measure(args)
    figures = scenario.figures(rounds) if hasattr(scenario, "figures") else scenario.FIGURES
    extra = getattr(scenario, "extra", None)
    where = args.results or (record.RESULTS if args.publish else record.SCRATCH)
    record.write(scenario.NAME, params, figures, rounds, extra, results=where)
    return 0


if __name__ == "__main__":
    sys.exit(main())
