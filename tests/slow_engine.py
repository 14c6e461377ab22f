"""Test-only server entry point whose engine timing the test controls, not this machine.

`python -m tests.slow_engine serve ...` runs the real CLI after two patches, both read from
the environment:
- OPENAI_COMPAT_TEST_BATCH_SECONDS: infinity-emb's model-free debug engine, and every sparse
  (SPLADE) model, sleeps this long per batch (so "a request that takes 20 s" is 20 batches,
  on any hardware);
- OPENAI_COMPAT_TEST_LOAD_SECONDS: every model load sleeps this long first (a slow start).
"""

from __future__ import annotations

import os
import time
from typing import Any


def install() -> None:
    from infinity_emb import AsyncEmbeddingEngine
    from infinity_emb.transformer.embedder.dummytransformer import DummyTransformer

    batch = float(os.environ.get("OPENAI_COMPAT_TEST_BATCH_SECONDS", "0"))
    load = float(os.environ.get("OPENAI_COMPAT_TEST_LOAD_SECONDS", "0"))
    encode = DummyTransformer.encode_core

    def slow_encode(self: Any, features: Any) -> Any:
        time.sleep(batch)
        return encode(self, features)

    DummyTransformer.encode_core = slow_encode  # type: ignore[method-assign]
    from_args = AsyncEmbeddingEngine.from_args.__func__  # type: ignore[attr-defined]

    def slow_from_args(cls: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(load)
        return from_args(cls, *args, **kwargs)

    AsyncEmbeddingEngine.from_args = classmethod(slow_from_args)  # type: ignore[method-assign,assignment]

    from openai_compat.engine import splade

    serve_sparse = splade.serve_sparse

    def slow_serve_sparse(replica: Any, *args: Any, **kwargs: Any) -> None:
        serve_sparse(replica, *args, **kwargs)
        core = replica.encode_core

        def slow_core(features: Any) -> Any:
            time.sleep(batch)
            return core(features)

        replica.encode_core = slow_core

    splade.serve_sparse = slow_serve_sparse  # type: ignore[assignment]


if __name__ == "__main__":
    install()
    from openai_compat.cli import main

    main()
