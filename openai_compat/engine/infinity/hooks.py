"""What this server installs into infinity-emb's replicas (the optional engine): token counts
and pre-normalisation norms carried with each embedding, and raw classification logits beside
its batcher. engine.InfinityEngine installs and asks them; the native engine (native.py)
does both itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from openai_compat.engine.infinity.internals import attr, kind_of, multivector
from openai_compat.engine.usage import TokenCountedArray, TokenIds, features_from_ids, unit_rows

# ---------------------------------------------------------------- classification logits


@dataclass
class LogitsRunner:
    """Raw classification logits, beside the batcher (infinity-emb's classify always applies
    softmax). One bounded executor per model, so this work cannot starve the shared thread
    pool (token counting, DNS, media decoding); chunked, so a cancelled request stops at the
    next chunk instead of running to the end."""

    pipe: Any
    executor: concurrent.futures.ThreadPoolExecutor
    chunk: int = 32

    @classmethod
    def for_replica(cls, replica: Any, name: str) -> Any | None:
        if kind_of(replica) != "classifier":
            return None
        pipe = attr(replica, "_pipe", "SentenceClassifier")
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"logits-{name}")
        return cls(pipe, pool)

    def _run(self, texts: Sequence[Any], stop: threading.Event) -> list[list[dict[str, Any]]]:
        out: list[list[dict[str, Any]]] = []
        for start in range(0, len(texts), self.chunk):
            if stop.is_set():
                break
            part = list(texts[start : start + self.chunk])
            rows = self.pipe(part, top_k=None, function_to_apply="none", truncation=True)
            out += [r if isinstance(r, list) else [r] for r in rows]
        return out

    async def logits(self, texts: Sequence[Any]) -> list[list[dict[str, Any]]]:
        """Per input (a text, or a {'text', 'text_pair'} dict), every label's logit."""
        stop = threading.Event()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.executor, self._run, texts, stop)
        except asyncio.CancelledError:
            stop.set()  # the running chunk finishes; no further chunk starts
            raise

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


# ---------------------------------------------------------------- usage from the engine
# (its types and readers in engine/usage.py, re-exported here)


def count_tokens_in_engine(replica: Any) -> bool:
    """Make the engine report each input's token count with its embedding, from the
    tokenisation it does anyway (no second tokeniser pass on the request path).

    infinity-emb runs encode_pre -> encode_core -> encode_post per batch, in that order, on
    three threads; the counts ride along with the batch from the first to the last. Only for
    sentence-transformers embedders with one vector per input; False where not installed.

    The engine L2-normalises every vector (`normalize_embeddings`) and drops the norm; where
    that switch exists it is turned off and the same normalisation is done here, on the same
    thread, keeping each row's norm, so that TEI's `normalize=false` can have the model's own
    output back (see raw_vectors).
    """
    if kind_of(replica) != "embedder" or multivector(replica):
        return False
    pre, core, post = replica.encode_pre, replica.encode_core, replica.encode_post
    normalize_here = getattr(replica, "normalize_embeddings", None) is True
    if normalize_here:
        replica.normalize_embeddings = False

    def encode_pre(sentences: list[str]) -> tuple[Any, list[int] | None]:
        if any(isinstance(s, TokenIds) for s in sentences):
            features = features_from_ids(replica, sentences)
        else:
            features = pre(sentences)
        mask = features.get("attention_mask") if isinstance(features, dict) else None
        return features, (mask.sum(dim=1).tolist() if mask is not None else None)

    def encode_core(packed: tuple[Any, list[int] | None]) -> tuple[Any, list[int] | None]:
        features, counts = packed
        return core(features), counts

    def encode_post(packed: tuple[Any, list[int] | None]) -> Any:
        out, counts = packed
        results = post(out)
        norms: Any = None
        if normalize_here:
            results, norms = unit_rows(results)  # what the engine would have done
        if counts is None or len(counts) != len(results):
            return results
        return [
            TokenCountedArray.of(row, n, None if norms is None else float(norms[i]))
            for i, (row, n) in enumerate(zip(results, counts, strict=True))
        ]

    replica.encode_pre, replica.encode_core = encode_pre, encode_core
    replica.encode_post = encode_post
    replica.openai_compat_token_ids = True  # TokenIds inputs are embedded as given
    return True


def accepts_token_ids(replica: Any) -> bool:
    """Whether the engine embeds TokenIds inputs exactly (count_tokens_in_engine installed)."""
    return getattr(replica, "openai_compat_token_ids", False) is True
