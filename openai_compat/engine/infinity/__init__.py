"""infinity-emb's engine (optional: its own environment, requirements/infinity.txt), and
everything that knows its internals: `engine.py` (InfinityEngine: engine/contract.py's Engine
on infinity-emb's AsyncEmbeddingEngine; built, stopped, its refusals read), `internals.py`
(the attributes of its engine, replicas, batching queue and tokenizers this server reads,
checked as a contract), `hooks.py` (what we install in it: token counts, token-id inputs, raw
logits), `splade.py` (sparse vectors inside its batching), `feeder.py` (wave batching above
its queue). Nothing outside this folder imports infinity-emb or reads its internals.
"""

from __future__ import annotations

import importlib.util

PACKAGE = "infinity_emb"  # its import name (and its logger's)


def installed() -> bool:
    """Whether infinity-emb is installed in this environment."""
    return importlib.util.find_spec(PACKAGE) is not None
