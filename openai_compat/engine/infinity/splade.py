"""SPLADE sparse vectors from a masked-LM model folder, served inside infinity-emb's batching.

An embedder replica's forward and post-processing steps are swapped (serve_sparse); it reads
infinity-emb's internals through internals.py's helpers and owns nothing else. The
vectors themselves (SparseVector, top_k, encodings) are openai_compat/formats/sparse.py.
"""

from __future__ import annotations

import weakref
from typing import Any

from openai_compat.engine import folders
from openai_compat.engine.infinity.internals import attr, kind_of, multivector

# Logits one forward chunk may hold (rows x tokens x vocabulary): 64 M floats = 256 MB.
_SPARSE_LOGITS_BUDGET = 64 * 1024 * 1024


def is_masked_lm(source: str) -> bool:
    """A local model folder whose config names a masked-LM architecture (SPLADE's form)."""
    return any(a.endswith("ForMaskedLM") for a in folders.architectures(source) or [])


def serve_sparse(replica: Any, source: str, trust_remote_code: bool = False) -> None:
    """Make an embedder replica answer SPLADE sparse vectors, inside infinity-emb's batching.

    infinity-emb has no sparse path, but it runs every batch as encode_pre (tokenise) ->
    encode_core (forward) -> encode_post (to results) on its own threads, queue, priorities
    and cancellation. The sentence-transformers transformer is swapped for the folder's
    masked-LM model (one copy of the weights; the MLM head added); encode_core computes
    max over tokens of log(1 + relu(logits)), padding masked, in chunks that bound the logits'
    memory; encode_post turns each row into a SparseVector carrying its token count.
    """
    import torch
    from transformers import AutoModelForMaskedLM

    from openai_compat.formats.sparse import SparseVector

    if kind_of(replica) != "embedder" or multivector(replica):
        raise ValueError(f"a {type(replica).__name__} model cannot serve sparse vectors")
    first = attr(replica, "_first_module", "SentenceTransformer")()
    dense = attr(first, "auto_model", "sentence_transformers Transformer")
    try:
        mlm = AutoModelForMaskedLM.from_pretrained(
            source, dtype=dense.dtype, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as exc:
        raise ValueError(f"kind = 'sparse' needs a masked-LM model: {exc}") from exc
    device = dense.device
    mlm.to(device).eval()
    first.auto_model = mlm  # the encoder's weights once, in the model that has the head
    vocab = int(mlm.config.vocab_size)
    _SPARSE[replica] = vocab

    def encode_core(features: dict[str, Any]) -> tuple[Any, list[int]]:
        mask = features["attention_mask"]
        rows = max(1, _SPARSE_LOGITS_BUDGET // (int(mask.shape[1]) * vocab))
        pooled = []
        with torch.inference_mode():
            on_device = {k: v.to(device) for k, v in features.items()}
            for start in range(0, int(mask.shape[0]), rows):
                part = {k: v[start : start + rows] for k, v in on_device.items()}
                logits = mlm(**part).logits
                weights = torch.log1p(torch.relu(logits.float()))
                weights *= part["attention_mask"].unsqueeze(-1).to(weights.dtype)
                pooled.append(weights.amax(dim=1).cpu())
        return torch.cat(pooled), mask.sum(dim=1).tolist()

    def encode_post(packed: tuple[Any, list[int]]) -> list[SparseVector]:
        weights, counts = packed
        matrix = weights.numpy()
        return [SparseVector.from_dense(row, int(n)) for row, n in zip(matrix, counts, strict=True)]

    replica.encode_core, replica.encode_post = encode_core, encode_post


def sparse_size(replica: Any) -> int | None:
    """The vocabulary size (the sparse vectors' dimension) of a replica serve_sparse set up;
    None for any other replica."""
    return _SPARSE.get(replica)


_SPARSE: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
