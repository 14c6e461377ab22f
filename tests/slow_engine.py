"""Test-only server entry point whose engine timing the test controls, not this machine.

`python -m tests.slow_engine serve ...` runs the real CLI after two patches, both read from
the environment:
- OPENAI_COMPAT_TEST_BATCH_SECONDS: the model-free debug engine, and every sparse (SPLADE)
  model, sleeps this long per batch on the native engine's forward thread (so "a request that
  takes 20 s" is 20 batches, on any hardware);
- OPENAI_COMPAT_TEST_LOAD_SECONDS: every model load sleeps this long first (a slow start).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any


def install() -> None:
    from openai_compat.engine import native
    from openai_compat.engine.debug import DebugRunner
    from openai_compat.engine.text import TextRunner

    batch = float(os.environ.get("OPENAI_COMPAT_TEST_BATCH_SECONDS", "0"))
    load = float(os.environ.get("OPENAI_COMPAT_TEST_LOAD_SECONDS", "0"))
    debug_run, text_run, native_load = DebugRunner.run, TextRunner.run, native.load

    def slow_debug_run(self: Any, rows: Sequence[Any]) -> list[Any]:
        time.sleep(batch)
        return debug_run(self, rows)

    def slow_text_run(self: Any, rows: Sequence[Any]) -> list[Any]:
        if self.kind == "sparse":
            time.sleep(batch)
        return text_run(self, rows)

    def slow_load(*args: Any, **kwargs: Any) -> Any:
        time.sleep(load)
        return native_load(*args, **kwargs)

    DebugRunner.run = slow_debug_run  # type: ignore[method-assign]
    TextRunner.run = slow_text_run  # type: ignore[method-assign]
    native.load = slow_load


if __name__ == "__main__":
    install()
    from openai_compat.cli import main

    main()
