"""Measured memory: the process's resident size, giving freed memory back to the system, and
the size of a model's weight files (what it costs before it was ever loaded)."""

from __future__ import annotations

import gc
import importlib
import itertools
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from openai_compat.frame.settings import ModelConfig
from openai_compat.ground.heap import libc as _libc
from openai_compat.ground.heap import trim

_WEIGHTS = (".safetensors", ".bin", ".onnx", ".pt", ".pth", ".xml", ".h5", ".msgpack")


def rss() -> int:
    """Resident bytes of this process (Linux /proc; 0 where that is not available)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


# glibc's mallopt parameters and the two thresholds we use. Blocks of at least the mmap
# threshold get mappings of their own, returned to the system when freed; smaller ones come
# from the arenas, where freed memory stays unless whole pages at an arena's top are free.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MAPPED = 128 * 1024  # glibc's starting threshold
_RUNNING = 32 * 2**20  # where glibc's dynamic threshold ends up (DEFAULT_MMAP_THRESHOLD_MAX)


def _operator_tuned() -> bool:
    return "MALLOC_MMAP_THRESHOLD_" in os.environ or "mmap_threshold" in os.environ.get(
        "GLIBC_TUNABLES", ""
    )


@contextmanager
def weights_mapped() -> Iterator[None]:
    """While a model loads: each allocation of 128 KiB or more (every weight matrix) gets a
    mapping of its own, so unloading the model gives it back to the system whole.

    glibc's default raises its mmap threshold each time a mapped block is freed (up to
    32 MiB), so after the first unload the next model's weights land in the arenas between
    the small allocations of requests and threads, and stay resident after it is unloaded
    too (measured: 6 models churning on 2 slots, RSS at rest 1026 MiB against 767 with this;
    tests/test_e2e_model_pool.py). Outside loads the threshold is fixed at 32 MiB, where the
    dynamic one settles anyway: a low threshold for every forward pass's activations costs
    about 25% throughput (a mapping and fresh zeroed pages per tensor). An operator who set
    MALLOC_MMAP_THRESHOLD_ or the glibc tunable keeps their choice."""
    libc = _libc()
    if libc is None or _operator_tuned():
        yield
        return
    libc.mallopt(_M_MMAP_THRESHOLD, _MAPPED)
    try:
        yield
    finally:
        libc.mallopt(_M_MMAP_THRESHOLD, _RUNNING)
        if "MALLOC_TRIM_THRESHOLD_" not in os.environ:  # an operator's value stays
            libc.mallopt(_M_TRIM_THRESHOLD, 2 * _RUNNING)  # as glibc's dynamic rule would


def before_engine_import(environ: Any = os.environ) -> None:
    """Before torch is imported: MKL's own memory manager off (MKL_DISABLE_FAST_MM=1) unless
    the operator chose. It keeps every thread's GEMM buffers for reuse, and the server runs
    more threads through GEMMs than one encode call does (two forward lanes, each with its
    OpenMP team). Measured on 2 cores, MiniLM, 16 texts x 32 in flight for 15 s, resident
    memory after the run: 675-689 MiB with it off against 684-690 on (0.4-9.5 MiB less in
    each of 3 alternated rounds; an earlier A/B: 675-676 against 691-692), throughput the
    same (466-493 sentences/s against 467-478; docs/bench/experiments/). MKL reads the
    variable's presence, not its value (with MKL_DISABLE_FAST_MM=0 passed through the
    server held what it holds with 1), so an operator's 0 (keep MKL's allocator) is removed
    here and MKL runs as it does by default."""
    value = environ.get("MKL_DISABLE_FAST_MM")
    if value is None:
        environ["MKL_DISABLE_FAST_MM"] = "1"
    elif value.strip() == "0":
        del environ["MKL_DISABLE_FAST_MM"]


# Libraries a serving process never uses that the engine's imports would load when they are
# installed: scikit-learn (which sentence-transformers imports) loads pandas, and pandas
# pyarrow, where a venv has them (any data-science venv; the ray extra's).
UNUSED = ("pandas", "pyarrow")


def import_engine(package: str, unused: tuple[str, ...] = UNUSED) -> None:
    """Import the engine's package with `unused` looking absent (None in sys.modules: an
    import raises ModuleNotFoundError and importlib.util.find_spec answers None), as
    scikit-learn and the rest take them to be optional (measured: 35 MiB resident of pyarrow
    and pandas in a venv that holds them, for nothing). They import normally afterwards (Ray
    Data's batch runner needs them); anything already imported stays."""
    hidden = [name for name in unused if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        importlib.import_module(package)
    finally:
        for name in hidden:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]


def pause_collection() -> None:
    """No garbage collection while the server starts (until freeze_imports). Importing torch,
    transformers and the web stack makes about 800,000 objects that live as long as the
    process, and each full collection on the way scans all of them: measured on 2 cores,
    importing sentence-transformers took 5.64 s with collection and 4.95 s without, the web
    stack and our routes after it 0.74 s and 0.46 s. Imports make little cyclic garbage (10k
    objects here), and it is never collected: freeze_imports keeps it with the rest."""
    gc.disable()


def freeze_imports() -> None:
    """Exclude everything alive now (the imported engine: torch, transformers) from garbage
    collection, so that collecting an unloaded model's cycles (release) scans only what was
    made since: milliseconds instead of a 300 ms pause of the event loop (a full collection
    over the imports took 360-410 ms on 2 cores, the same with them frozen 0 ms); then
    collection runs again if pause_collection stopped it. Call it before any model is
    loaded, or that model could never be freed."""
    gc.freeze()
    gc.enable()


def resume_collection() -> None:
    """Where no engine is imported and no model loaded (every model given built): collection
    back on if pause_collection stopped it, the imports frozen out of it as freeze_imports
    does. Nothing if it runs."""
    if not gc.isenabled():
        freeze_imports()


def release() -> None:
    """After dropping a model: collect its cycles, empty torch's device caches, trim."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        mps = getattr(torch, "mps", None)
        if mps is not None and torch.backends.mps.is_available():
            mps.empty_cache()
    trim()


def tensor_bytes(modules: Iterable[Any]) -> int | None:
    """Bytes of the torch tensors (parameters and buffers) of `modules`, each storage counted
    once; None when none is a torch module (ONNX, OpenVINO). What a model itself costs,
    unlike the process's RSS growth during its load, which also takes in whatever else the
    process allocated meanwhile."""
    import torch

    storages: dict[int, int] = {}
    found = False
    for module in modules:
        if not isinstance(module, torch.nn.Module):
            continue
        found = True
        for tensor in itertools.chain(module.parameters(), module.buffers()):
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values()) if found else None


def model_file_bytes(config: ModelConfig) -> int:
    """The weight files of a model: a local folder's, or a hub id's snapshot in the local
    cache (never fetched here); 0 when neither is found."""
    try:
        folder = Path(config.source)
    except Exception:  # a builtin whose package is missing: the load will say so
        return 0
    if not folder.is_dir():
        folder = _cached_snapshot(config.model, config.revision) or folder
    if not folder.is_dir():
        return 0
    total = 0
    for path in folder.rglob("*"):
        if path.suffix in _WEIGHTS and path.is_file():
            total += path.stat().st_size  # a hub cache's symlinks: the blob's size
    return total


def _cached_snapshot(repo: str, revision: str | None) -> Path | None:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo, revision=revision, local_files_only=True))
    except Exception:  # not cached, not a hub id, or no hub library: unknown
        return None


def human(size: int | None) -> str:
    if size is None:
        return "unknown"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
