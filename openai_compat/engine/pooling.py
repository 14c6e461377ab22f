"""The pooling a model's config asks for (`pooling_method`), applied to a SentenceTransformer.

infinity-emb takes a pooling method but its sentence-transformers embedder keeps the model
folder's own Pooling module, so `pooling_method = "cls"` used to change nothing. Here the
model's Pooling module is switched to the method asked for; "auto" keeps the folder's. Both
engines call it on their model as they are built (engine/build.py).
"""

from __future__ import annotations

from typing import Any

# pooling_method -> the sentence-transformers Pooling flag that selects it
METHODS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens"}
_FLAGS = (
    *METHODS.values(),
    "pooling_mode_max_tokens",
    "pooling_mode_lasttoken",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
)


def apply_pooling(model: Any, method: str, *, pooled: bool, sparse: bool = False) -> None:
    """Make `model` (a SentenceTransformer where `pooled`: an embedder with one vector per
    input) pool with `method`; ValueError (start-up stops, naming the model) if it is unknown
    or the model has no pooling to change."""
    if method == "auto":
        return
    if sparse:
        raise ValueError("pooling_method does not apply to a sparse model (SPLADE max-pools)")
    if method not in METHODS:
        raise ValueError(f"pooling_method {method!r} is not one of auto, {', '.join(METHODS)}")
    if not pooled:
        raise ValueError(
            f"pooling_method applies to embedding models; a {type(model).__name__} model "
            "has no pooling to change (leave it 'auto')"
        )
    from sentence_transformers.models import Pooling

    poolers = [m for m in model if isinstance(m, Pooling)]
    if len(poolers) != 1:
        raise ValueError(
            f"pooling_method needs exactly one Pooling module in the model, found {len(poolers)}"
        )
    (pooler,) = poolers
    if hasattr(pooler, "pooling_mode"):  # sentence-transformers >= 6: one attribute, read
        module: Any = pooler  # at each forward ("cls", "mean"), no flags
        module.pooling_mode = method
        return
    for flag in _FLAGS:  # 3.x (infinity-emb's pin): a flag per mode
        setattr(pooler, flag, flag == METHODS[method])
