"""The CPUs this process may really use, and the thread pools sized to them.

A pod with a CPU limit, a container given two cores of a 64-core host, or `taskset` all leave
`os.cpu_count()` saying the host's number; torch (OpenMP), the tokenizers (Rayon) and MKL
then start one thread per host core and fight over the few they may run on, which is how a
shared machine turns into a collapse. Here: the affinity mask, capped by a cgroup CPU quota
(v2 `cpu.max`, v1 `cpu.cfs_quota_us`), rounded up; the pools get that many threads unless
the operator set their variables.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import Any

# The variables the engine's pools read when they start (before torch is imported).
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "RAYON_NUM_THREADS",
)


def cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs a cgroup CPU quota allows (e.g. 1.5), or None without one."""
    try:
        text = (root / "cpu.max").read_text().split()  # v2: "max 100000" or "150000 100000"
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:  # v1
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def available(root: Path = Path("/sys/fs/cgroup")) -> tuple[int, str]:
    """(CPUs this process may use, what decided it)."""
    try:
        count, source = len(os.sched_getaffinity(0)), "affinity"
    except AttributeError:  # not Linux
        count, source = os.cpu_count() or 1, "cpu_count"
    quota = cgroup_quota(root)
    if quota is not None and math.ceil(quota) < count:
        count, source = max(1, math.ceil(quota)), f"cgroup quota {quota:g}"
    return count, source


def size_pools(environ: Any = os.environ) -> tuple[int, str]:
    """Before the engine is imported: each pool's variable set to the CPUs we may use, unless
    it is set already (the operator's choice wins)."""
    count, source = available()
    for name in THREAD_VARIABLES:
        environ.setdefault(name, str(count))
    return count, source


def engine_threads() -> int:
    """Threads for a runtime we size by hand (ONNX Runtime, OpenVINO): OMP_NUM_THREADS when
    set (size_pools sets it; the operator's value wins), else the CPUs we may use."""
    try:
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    except (KeyError, ValueError):
        return available()[0]


def apply_to_torch(count: int) -> None:
    """After torch is imported, before any model: its intra-op pool to `count` threads (it
    may have been sized before our variables, e.g. imported by the embedding app) and its
    inter-op pool to as many (settable once only, before any parallel work)."""
    import torch

    if "OMP_NUM_THREADS" not in os.environ or os.environ["OMP_NUM_THREADS"] == str(count):
        torch.set_num_threads(count)
    with contextlib.suppress(RuntimeError):  # already started: it keeps its size (reported)
        torch.set_num_interop_threads(count)


def report(count: int, source: str) -> dict[str, Any]:
    """What /ready and the start-up log say about CPUs and threads."""
    import sys

    torch = sys.modules.get("torch")
    return {
        "available": count,
        "source": source,
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "torch_interop_threads": torch.get_num_interop_threads() if torch is not None else None,
        "tokenizer_threads": int(os.environ.get("RAYON_NUM_THREADS", count)),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
