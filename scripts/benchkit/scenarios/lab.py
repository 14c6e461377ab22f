"""The scenarios that run on the load kit (benchkit/sweep.py, grid.py, repeats.py,
ray_serve.py, model_pool.py, batch_impact.py): a generator pinned to its own CPU, the servers
to the others, each load alternated over rounds. Each runs the kit with its options
(benchkit/options.py: `python scripts/bench.py run SCENARIO -- --help` lists them) and turns
its report into rounds of figures."""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchkit import options as kit
from benchkit.record import Figure
from benchkit.systems import SERVER_CPUS


def _run(fn: Any, argv: list[str]) -> tuple[argparse.Namespace, dict[str, Any]]:
    args = kit.parse_args(argv)
    SERVER_CPUS.clear()
    SERVER_CPUS.update(args.server_cpus)
    os.sched_setaffinity(0, args.gen_cpus)  # the load generator keeps to its own CPUs
    out_dir = Path(tempfile.mkdtemp(prefix="bench-out-"))
    workdir = Path(tempfile.mkdtemp(prefix="bench-"))
    report: dict[str, Any] = asyncio.run(fn(args, out_dir, workdir))
    return args, report


def _by_round(runs: list[dict[str, Any]], key: Any) -> list[dict[str, float]]:
    """The kit's runs (in the order they ran) as rounds: the n-th run of each load is round n."""
    seen: dict[Any, int] = defaultdict(int)
    rounds: list[dict[str, float]] = []
    for run in runs:
        for name, value in key(run).items():
            n = seen[name]
            seen[name] += 1
            while len(rounds) <= n:
                rounds.append({})
            rounds[n][name] = value
    return rounds


class Lab:
    """One scenario on the kit: its name, what it publishes, how it runs the kit."""

    def __init__(
        self,
        name: str,
        description: str,
        figures: Any,
        argv: list[str],
        convert: Any,
    ) -> None:
        """`figures`: the list it publishes, or a function of the rounds (the loads run)."""
        self.NAME, self.DESCRIPTION, self._figures = name, description, figures
        self.argv, self.convert = argv, convert
        # every server the kit starts has the exact cache off (systems.start_ours, the Ray
        # config); only the cache scenario turns it on, on a stream that never repeats a round
        self.cache = "on vs off (512 MiB)" if "--repeats" in argv else "off (--cache-bytes 0)"
        self.extra: dict[str, Any] = {}

    def figures(self, rounds: list[dict[str, float]]) -> list[Figure]:
        found: list[Figure] = self._figures(rounds) if callable(self._figures) else self._figures
        return found

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("kit", nargs="*", help="more of the kit's options, after --")

    def measure(self, args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, float]]]:
        argv = [*self.argv, "--rounds", str(args.rounds), *args.kit]
        fn = self.argv_fn()
        kit_args, report = _run(fn, argv)
        self.extra = {k: report[k] for k in ("accuracy_vs_torch", "tokens_per_text") if k in report}
        params = {
            k: (sorted(v) if isinstance(v, set) else v)
            for k, v in vars(kit_args).items()
            if k
            in (
                "models",
                "systems",
                "inputs",
                "concurrency",
                "durations",
                "formats",
                "kinds",
                "lengths",
                "server_cpus",
                "gen_cpus",
                "repeats",
                "ray_phases",
            )
        }
        params["cache"] = self.cache
        return params, self.convert(report)

    def argv_fn(self) -> Any:
        from benchkit.batch_impact import batch_impact
        from benchkit.grid import grid
        from benchkit.model_pool import model_pool
        from benchkit.ray_serve import ray_serve
        from benchkit.repeats import repeats
        from benchkit.sweep import sweep

        for flag, fn in (
            ("--repeats", repeats),
            ("--grid", grid),
            ("--ray", ray_serve),
            ("--model-pool", model_pool),
            ("--batch-impact", batch_impact),
        ):
            if flag in self.argv:
                return fn
        return sweep


def _sweep_rounds(report: dict[str, Any]) -> list[dict[str, float]]:
    def key(run: dict[str, Any]) -> dict[str, float]:
        if run["fmt"] != "float" or run["kind"] != "text":
            return {}
        load = f"n{run['inputs']}.c{run['concurrency']}"
        return {
            f"{run['system']}.{load}.rps": run["requests_per_s"],
            f"{run['system']}.{load}.p50_ms": run["p50_ms"],
            f"{run['system']}.{load}.p99_ms": run["p99_ms"],
        }

    return _by_round(report["runs"], key)


def _grid_rounds(report: dict[str, Any]) -> list[dict[str, float]]:
    def key(run: dict[str, Any]) -> dict[str, float]:
        load = f"{run['fmt']}.c{run['concurrency']}"  # fmt holds "t<tokens>" here
        return {f"{run['system']}.{load}.inputs_per_s": run["inputs_per_s"]}

    return _by_round(report["runs"], key)


def _repeats_rounds(report: dict[str, Any]) -> list[dict[str, float]]:
    return [
        {
            f"{system}.inputs_per_s": r[system]["inputs_per_s"]
            for system in ("cache-on", "cache-off", "inprocess")
        }
        for r in report["rounds"]
    ]


def _ray_rounds(report: dict[str, Any]) -> list[dict[str, float]]:
    rounds: list[dict[str, float]] = []
    for phase in ("overhead", "scaling"):
        for i, r in enumerate(report.get(phase, {}).get("rounds", [])):
            while len(rounds) <= i:
                rounds.append({})
            for system, value in r.items():
                if isinstance(value, dict) and "inputs_per_s" in value:
                    rounds[i][f"{phase}.{system}.inputs_per_s"] = value["inputs_per_s"]
    return rounds


def _pool_rounds(report: dict[str, Any]) -> list[dict[str, float]]:
    growth = report["rss_growth_mib_cycles_2_to_20"]
    return [
        {
            "lazy_first_answer_ms": r["lazy_first_answer_ms"],
            "eager_first_answer_ms": r["eager_first_answer_ms"],
            "rss_growth_mib_20_cycles": growth,
        }
        for r in report["rounds"]
    ]


def _batch_rounds(report: dict[str, Any]) -> list[dict[str, float]]:
    alone, with_batch = report["runs"]["alone"], report["runs"]["with-batch"]
    return [
        {
            "alone.p50_ms": a["p50_ms"],
            "with-batch.p50_ms": b["p50_ms"],
            "alone.p99_ms": a["p99_ms"],
            "with-batch.p99_ms": b["p99_ms"],
            "batch_lines_per_s": lines,
        }
        for a, b, lines in zip(alone, with_batch, report["batch_lines_per_s"], strict=True)
    ]


def _loads(rounds: list[dict[str, float]]) -> list[str]:
    """The loads a sweep ran ("n16.c64": inputs a request, requests in flight), in order."""
    found = {
        k.split(".", 1)[1].rsplit(".", 1)[0] for r in rounds for k in r if k.startswith("ours.")
    }

    def order(load: str) -> tuple[int, int]:
        n, c = load.split(".")
        return int(n[1:]), int(c[1:])

    return sorted(found, key=order)


def _load_figures(prefix: str, anchors: list[str], rounds: list[dict[str, float]]) -> list[Figure]:
    figures = []
    present = {k.split(".")[0] for r in rounds for k in r}
    anchors = [a for a in anchors if a in present]
    for load in _loads(rounds):
        for anchor in anchors:
            figures.append(
                Figure(
                    f"ours.{load}.rps",
                    f"{prefix} {load}: requests/s",
                    "req/s",
                    "higher",
                    f"{anchor}.{load}.rps",
                )
            )
        figures.append(
            Figure(
                f"ours.{load}.p50_ms",
                f"{prefix} {load}: p50",
                "ms",
                "lower",
                f"{anchors[-1]}.{load}.p50_ms" if anchors else None,
            )
        )
    return figures


def _grid_figures(rounds: list[dict[str, float]]) -> list[Figure]:
    keys = sorted({k for r in rounds for k in r}, key=lambda k: (k.split(".")[1:], k))
    return [
        Figure(
            k,
            f"{k.split('.')[0]}, ~{k.split('.')[1][1:]} tokens, {k.split('.')[2][1:]} in flight",
            "inputs/s",
            "higher",
            "torch." + k.split(".", 1)[1],
        )
        for k in keys
        if not k.startswith("torch.")
    ]


SCENARIOS = [
    Lab(
        "throughput",
        "MiniLM by concurrency: ours vs infinity-emb's server vs our engine in-process",
        lambda rounds: _load_figures("MiniLM", ["inprocess", "infinity"], rounds),
        ["--models", "minilm"],
        _sweep_rounds,
    ),
    Lab(
        "http-layer",
        "the HTTP layer alone (the model-free debug engine): ours vs infinity-emb's server",
        lambda rounds: _load_figures("debug engine", ["infinity"], rounds),
        ["--models", "debug", "--systems", "ours,infinity"],
        _sweep_rounds,
    ),
    Lab(
        "cache",
        "a corpus with 37% repeated texts: the exact cache on vs off vs in-process",
        [
            Figure(
                "cache-on.inputs_per_s",
                "cache on, 37% repeats",
                "inputs/s",
                "higher",
                "inprocess.inputs_per_s",
            ),
            Figure(
                "cache-off.inputs_per_s",
                "cache off, the same stream",
                "inputs/s",
                "higher",
                "inprocess.inputs_per_s",
            ),
        ],
        ["--repeats", "0.37", "--inputs", "16", "--concurrency", "32"],
        _repeats_rounds,
    ),
    Lab(
        "backends",
        "every CPU backend at 16/128/256 tokens, 1 and 16 in flight (one text a request)",
        _grid_figures,
        ["--grid", "--concurrency", "1,16"],
        _grid_rounds,
    ),
    Lab(
        "ray-serve",
        "Ray Serve: one replica vs the single process; two replicas vs one",
        [
            Figure(
                "overhead.ray.inputs_per_s",
                "Ray Serve, one replica",
                "inputs/s",
                "higher",
                "overhead.single.inputs_per_s",
            ),
            Figure(
                "scaling.ray_2.inputs_per_s",
                "two replicas",
                "inputs/s",
                "higher",
                "scaling.ray_1.inputs_per_s",
            ),
        ],
        ["--ray"],
        _ray_rounds,
    ),
    Lab(
        "model-pool",
        "lazy models: the first answer of a cold model, and memory over load/unload cycles",
        [
            Figure(
                "lazy_first_answer_ms",
                "first answer of a lazy model (load included)",
                "ms",
                "lower",
                "eager_first_answer_ms",
            ),
            Figure(
                "rss_growth_mib_20_cycles",
                "memory growth over 20 load/unload cycles",
                "MiB",
                "lower",
            ),
        ],
        ["--model-pool", "--concurrency", "4"],
        _pool_rounds,
    ),
    Lab(
        "batch-impact",
        "live latency beside a Batch API job",
        [
            Figure(
                "with-batch.p50_ms", "live p50 beside a batch job", "ms", "lower", "alone.p50_ms"
            ),
            Figure(
                "with-batch.p99_ms", "live p99 beside a batch job", "ms", "lower", "alone.p99_ms"
            ),
        ],
        ["--batch-impact", "--models", "minilm", "--concurrency", "4", "--duration", "20"],
        _batch_rounds,
    ),
]
