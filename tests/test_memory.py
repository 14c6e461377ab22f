"""The allocation policy around model loads (memory.weights_mapped): weights allocated during a
load are given back to the system when freed, even after glibc's dynamic mmap threshold has
risen, without a malloc_trim."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# Mimics a model load after an earlier model was unloaded: a freed 16 MiB mapped block raises
# glibc's threshold; then 64 weight-sized blocks are allocated and written, a small allocation
# that stays (a request's) lands after them, and the blocks are freed. Prints the MiB still
# resident.
SCRIPT = textwrap.dedent(
    """
    import contextlib, ctypes, sys
    from openai_compat.models import memory
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    def block(size):
        p = libc.malloc(size)
        ctypes.memset(p, 1, size)
        return p
    libc.free(block(16 << 20))
    before = memory.rss()
    mapped = memory.weights_mapped() if sys.argv[1] == "mapped" else contextlib.nullcontext()
    with mapped:
        weights = [block(1 << 20) for _ in range(64)]
    stays = block(960 << 10)  # larger than any hole the imports left: lands on top
    for p in weights:
        libc.free(p)
    print((memory.rss() - before) / 2**20)
    """
)


def _kept_mib(arm: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, arm], capture_output=True, text=True, check=True
    ).stdout
    return float(out.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_weights_allocated_while_loading_are_given_back_when_freed() -> None:
    assert _kept_mib("plain") > 48  # glibc's default keeps them: what the policy is for
    assert _kept_mib("mapped") < 8


def test_an_operators_threshold_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from openai_compat.models import memory

    calls: list[tuple[int, int]] = []

    class Libc:
        def mallopt(self, param: int, value: int) -> None:
            calls.append((param, value))

    monkeypatch.setattr(memory, "_libc", lambda: Libc())
    with memory.weights_mapped():
        assert calls == [(-3, 128 * 1024)]
    assert calls[1:] == [(-3, 32 * 2**20), (-1, 64 * 2**20)]
    calls.clear()
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    with memory.weights_mapped():
        pass
    assert calls == []


def test_collection_paused_at_start_runs_again_with_the_imports_frozen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """cli.serve pauses collection while it imports; once the imports are done (or no model
    is to load) collection runs again with what exists then frozen out of it. gc.freeze is
    recorded, not run: a real one would freeze this test process's objects for good."""
    import gc

    from openai_compat.models import memory

    frozen: list[bool] = []  # whether collection was still paused at each freeze
    monkeypatch.setattr(memory.gc, "freeze", lambda: frozen.append(not gc.isenabled()))
    assert gc.isenabled()
    try:
        memory.pause_collection()
        assert not gc.isenabled()
        memory.resume_collection()
        assert gc.isenabled() and frozen == [True]  # frozen before collection resumed
        memory.resume_collection()  # running already: nothing is frozen again
        assert frozen == [True]
        memory.pause_collection()
        memory.freeze_imports()  # the loader's call after the engine's import
        assert gc.isenabled() and frozen == [True, True]
    finally:
        gc.enable()


def test_mkl_keeps_no_thread_buffers_unless_the_operator_says() -> None:
    from openai_compat.models import memory

    unset: dict[str, str] = {}
    memory.before_engine_import(unset)
    assert unset == {"MKL_DISABLE_FAST_MM": "1"}
    chosen = {"MKL_DISABLE_FAST_MM": "yes"}
    memory.before_engine_import(chosen)
    assert chosen == {"MKL_DISABLE_FAST_MM": "yes"}
    kept = {"MKL_DISABLE_FAST_MM": "0"}  # MKL reads any value as "off": 0 is removed
    memory.before_engine_import(kept)
    assert kept == {}


@pytest.mark.slow
def test_the_engine_imports_without_pandas_and_pyarrow_which_stay_importable() -> None:
    """#62.3: scikit-learn (which sentence-transformers imports) loads pandas, and pandas
    pyarrow, when a venv has them: 35 MiB resident that serving never uses."""
    pytest.importorskip("pandas")
    script = (
        "import sys\n"
        "from openai_compat.models import memory\n"
        "memory.import_engine('sentence_transformers')\n"
        "print(sorted(m for m in ('pandas', 'pyarrow', 'sklearn') if m in sys.modules))\n"
        "import pandas\n"
        "print(pandas.DataFrame({'a': [1]}).shape)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[:2] == ["['sklearn']", "(1, 1)"]
