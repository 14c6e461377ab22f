"""The CPUs this process may really use, and the thread pools sized to them.

A pod with a CPU limit, a container given two cores of a 64-core host, or `taskset` all leave
`os.cpu_count()` saying the host's number; torch (OpenMP), the tokenizers (Rayon) and MKL
then start one thread per host core and fight over the few they may run on, which is how a
shared machine turns into a collapse. Here: the affinity mask, capped by the smallest cgroup
CPU quota from the process's own cgroup up to the root (v2 `cpu.max`, v1
`cpu.cfs_quota_us`), rounded up; the pools get that many threads unless
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


def cgroup_quota(
    root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self/cgroup")
) -> float | None:
    """CPUs the cgroup CPU quotas allow this process (e.g. 1.5), or None without one: the
    smallest quota on the path from the process's own cgroup (named in /proc/self/cgroup)
    up to the hierarchy's root, since a parent's quota caps every child. cgroup v2's
    `cpu.max`, else v1's `cpu.cfs_quota_us` / `cpu.cfs_period_us`."""
    v2_path, v1_path = _own_cgroups(proc)
    quotas = [q for level in _levels(root, v2_path) if (q := _v2_quota(level)) is not None]
    if not quotas:
        mount = root / "cpu"
        quotas = [q for level in _levels(mount, v1_path) if (q := _v1_quota(level)) is not None]
    return min(quotas) if quotas else None


def _own_cgroups(proc: Path) -> tuple[str, str]:
    """This process's cgroup path in the v2 hierarchy and in v1's cpu controller ("/" where
    /proc does not say)."""
    v2 = v1 = "/"
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return v2, v1
    for line in lines:
        hierarchy, controllers, path = [*line.split(":", 2), "", ""][:3]
        if hierarchy == "0" and controllers == "":
            v2 = path or "/"
        elif "cpu" in controllers.split(","):
            v1 = path or "/"
    return v2, v1


def _levels(mount: Path, path: str) -> list[Path]:
    """The cgroup folder of `path` under `mount` and each parent up to the mount, deepest
    first; the mount alone where it has no such folder (inside a cgroup namespace, a
    container's own cgroup is the mount's root)."""
    here = mount / path.strip("/")
    if not path.strip("/") or not here.is_dir():
        return [mount]
    levels = [here]
    while here != mount:
        here = here.parent
        levels.append(here)
    return levels


def _v2_quota(folder: Path) -> float | None:
    try:
        text = (folder / "cpu.max").read_text().split()  # "max 100000" or "150000 100000"
        return int(text[0]) / int(text[1]) if text and text[0] != "max" else None
    except (OSError, ValueError, IndexError, ZeroDivisionError):
        return None


def _v1_quota(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def available(
    root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self/cgroup")
) -> tuple[int, str]:
    """(CPUs this process may use, what decided it)."""
    try:
        count, source = len(os.sched_getaffinity(0)), "affinity"
    except AttributeError:  # not Linux
        count, source = os.cpu_count() or 1, "cpu_count"
    quota = cgroup_quota(root, proc)
    if quota is not None and math.ceil(quota) < count:
        count, source = max(1, math.ceil(quota)), f"cgroup quota {quota:g}"
    return count, source


# GNU OpenMP (torch's CPU wheel ships libgomp) lets idle threads spin 300,000 times before
# sleeping: beside another busy process, a forward's threads spun at every barrier for a core
# someone else held (one lane of two threads: 3.4-5.9x slower beside a busy process than with
# OMP_WAIT_POLICY=PASSIVE, which sleeps at once). Under load the native engine's lanes now run
# one thread each (engine/scheduler.py), so no team waits at a barrier there; a team forms for
# a lone batch, where sleeping at once costs each of a forward's many parallel regions a
# wake-up. A short spin serves both (`scripts/bench.py run shared-cpu` and `one-client`;
# the retired wait_policy.py, docs/benchmarks-history.md; MiniLM, 2 vCPUs): 16 texts x 32
# in flight within 1% of PASSIVE quiet and beside a busy core (477.9 / 252.8 vs 477.9 /
# 256.0 sentences/s, medians of 3 rounds); one client's p50 13.5-13.7 ms vs 15.1-16.7 for
# one input and 51.1-51.6 vs 60.8-61.0 for 16 (two runs, the policies interleaved). An
# operator's OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
SPIN_COUNT = "10000"


def size_pools(environ: Any = os.environ) -> tuple[int, str]:
    """Before the engine is imported: each pool's variable set to the CPUs we may use, and
    OpenMP's idle threads to spin briefly before they sleep (SPIN_COUNT), unless set already
    (the operator's choice wins)."""
    count, source = available()
    for name in THREAD_VARIABLES:
        environ.setdefault(name, str(count))
    if "OMP_WAIT_POLICY" not in environ:
        environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)
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
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
    }
