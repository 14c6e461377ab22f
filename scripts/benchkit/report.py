"""The table, per-round ratios and the throughput plot."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from benchkit.load import Result, Scenario


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def _round_ratios(mine: list[Result], other: list[Result]) -> list[float]:
    """ours/other per round (the runs of one round were back to back)."""
    return [a.rps / b.rps for a, b in zip(mine, other, strict=False) if b.rps]


def print_table(results: list[Result]) -> list[dict[str, Any]]:
    """Median over rounds per (scenario, system), min-max spread; ratios of medians against
    ours, with the range of the per-round ratios."""
    by: dict[str, dict[str, list[Result]]] = {}
    order: list[Scenario] = []
    for r in results:
        if r.scenario.key not in by:
            order.append(r.scenario)
        by.setdefault(r.scenario.key, {}).setdefault(r.system, []).append(r)

    header = (
        f"{'scenario':<40} {'system':<13} {'req/s':>9} {'spread':>15} {'inputs/s':>10} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'peak MiB':>9} {'vs infinity':>22} {'vs in-proc':>22}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for sc in order:
        systems = by[sc.key]
        for name, rs in systems.items():
            rps_all = [r.rps for r in rs]
            rps = statistics.median(rps_all)
            spread = f"{min(rps_all):.1f}-{max(rps_all):.1f}"
            cells: dict[str, str] = {}
            ratios: dict[str, dict[str, float]] = {}
            if name.startswith("ours"):  # ours and its variants (ours-nocount, ours-direct)
                for other in ("infinity", "inprocess"):
                    if other in systems:
                        per_round = _round_ratios(rs, systems[other])
                        med = rps / statistics.median(r.rps for r in systems[other])
                        cells[other] = (
                            f"{med:.2f}x ({min(per_round):.2f}-{max(per_round):.2f})"
                            if per_round
                            else "-"
                        )
                        ratios[other] = {
                            "median": round(med, 3),
                            "min": round(min(per_round), 3) if per_round else 0.0,
                            "max": round(max(per_round), 3) if per_round else 0.0,
                        }
            p50 = statistics.median(r.pct(0.5) for r in rs)
            p99 = statistics.median(r.pct(0.99) for r in rs)
            peak = max(r.peak_rss_kib for r in rs) / 1024
            short = any(not r.window_ok for r in rs)
            print(
                f"{sc.key:<40} {name:<13} {rps:>9.1f} {spread:>15} {rps * sc.inputs:>10.1f} "
                f"{p50:>8.1f} {p99:>8.1f} {peak:>9.0f} {cells.get('infinity', ''):>22} "
                f"{cells.get('inprocess', ''):>22}" + ("  (window < 100 requests)" if short else "")
            )
            rows.append(
                {
                    "scenario": sc.key,
                    "system": name,
                    "rounds": len(rs),
                    "requests_per_s": round(rps, 2),
                    "requests_per_s_min": round(min(rps_all), 2),
                    "requests_per_s_max": round(max(rps_all), 2),
                    "inputs_per_s": round(rps * sc.inputs, 1),
                    "p50_ms": round(p50, 2),
                    "p99_ms": round(p99, 2),
                    "peak_rss_mib": round(peak, 1),
                    "window_ok": not short,
                    "ours_vs_infinity": ratios.get("infinity"),
                    "ours_vs_inprocess": ratios.get("inprocess"),
                }
            )
    return rows


def plot(results: list[Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple[str, int, str, str], dict[str, list[tuple[int, float, float]]]] = {}
    for r in results:
        sc = r.scenario
        g = groups.setdefault((sc.model, sc.inputs, sc.fmt, sc.kind), {})
        g.setdefault(r.system, []).append((sc.concurrency, r.rps, r.pct(0.99)))
    groups = {k: v for k, v in groups.items() if k[3] == "text"}
    fig, axes = plt.subplots(2, max(1, len(groups)), figsize=(4.2 * max(1, len(groups)), 7))
    if len(groups) == 1:
        axes = [[axes[0]], [axes[1]]]
    for col, (key, systems) in enumerate(sorted(groups.items())):
        top, bottom = axes[0][col], axes[1][col]
        for system, points in sorted(systems.items()):
            agg: dict[int, list[tuple[float, float]]] = {}
            for c, rps, p99 in points:
                agg.setdefault(c, []).append((rps, p99))
            cs = sorted(agg)
            rps_med = [statistics.median(v[0] for v in agg[c]) for c in cs]
            p99_med = [statistics.median(v[1] for v in agg[c]) for c in cs]
            top.plot(cs, rps_med, marker="o", label=system)
            bottom.plot(cs, p99_med, marker="o", label=system)
        model, n, fmt, _ = key
        top.set_title(f"{model}, {n} inputs/req, {fmt}", fontsize=9)
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrency")
            ax.grid(alpha=0.3)
        top.set_ylabel("requests/s")
        bottom.set_ylabel("p99 latency (ms)")
        top.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
