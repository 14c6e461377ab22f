"""The one place that knows infinity-emb's internals (0.0.78), with engine/splade.py for the
sparse head it adds to an embedder replica.

Everything the server needs beyond infinity-emb's public API (its model replicas, batching
queue and push task, tokenizers, classification pipeline, where each model kind applies its
token limit) is read here and nowhere else. When an engine release moves an attribute,
`contract_problems` names it and loading fails loudly instead of degrading silently; the
contract test runs the same checks against the installed release.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from openai_compat.engine.usage import (  # noqa: F401 (re-exported)
    TokenCountedArray,
    TokenIds,
    engine_token_count,
    features_from_ids,
    length_estimate,
    raw_vectors,
)

Kind = Literal["embedder", "crossencoder", "classifier", "clip", "clap", "other"]

# Class names of infinity-emb's torch replicas -> what kind of model they hold.
_KINDS: dict[str, Kind] = {
    "SentenceTransformerPatched": "embedder",
    "CrossEncoderPatched": "crossencoder",
    "SentenceClassifier": "classifier",
    "TIMM": "clip",
    "TorchAudioModel": "clap",
}
# Tokenizers report this (or larger) when no limit is configured.
_NO_LIMIT = 1_000_000


class EngineContractError(RuntimeError):
    """infinity-emb no longer has an internal this server relies on."""


def attr(obj: Any, name: str, where: str) -> Any:
    try:
        return getattr(obj, name)
    except AttributeError:
        raise EngineContractError(
            f"infinity-emb changed: {where}.{name} is gone (openai_compat/engine/adapter.py "
            "must follow the new release)"
        ) from None


def bettertransformer_available() -> bool:
    """Whether infinity-emb can apply BetterTransformer (else it skips it without a word)."""
    from infinity_emb.transformer import acceleration

    return "BetterTransformerManager" in vars(acceleration)


# ---------------------------------------------------------------- engine and batcher


def replica_of(engine: Any) -> Any:
    """The engine's (first) model replica: the object that holds weights and tokenizer."""
    replicas = attr(engine, "_model_replicas", "AsyncEmbeddingEngine")
    if not replicas:
        raise EngineContractError("infinity-emb changed: the engine has no model replicas")
    return replicas[0]


def queue_length(engine: Any) -> int:
    """Items waiting in the engine's batching queue (0 before the batcher exists)."""
    handler = getattr(engine, "_batch_handler", None)
    if handler is None:
        return 0
    return len(attr(handler, "_queue_prio", "BatchHandler"))


def batcher_alive(engine: Any) -> bool:
    """False once the engine stopped or its result-pushing task died."""
    if not engine.is_running:
        return False
    handler = getattr(engine, "_batch_handler", None)
    push = getattr(handler, "_push_task", None)
    return not (push is not None and push.done())


def kind_of(replica: Any) -> Kind:
    return _KINDS.get(type(replica).__name__, "other")


# ---------------------------------------------------------------- tokenizers and limits


def hf_tokenizer(replica: Any) -> Any | None:
    """The transformers tokenizer the model applies its limit with."""
    kind = kind_of(replica)
    if kind == "embedder":
        return getattr(replica, "tokenizer", None)
    if kind == "crossencoder":
        return attr(replica, "tokenizer", "CrossEncoderPatched")
    if kind == "classifier":
        return attr(attr(replica, "_pipe", "SentenceClassifier"), "tokenizer", "pipeline")
    if kind in ("clip", "clap"):
        return getattr(attr(replica, "processor", type(replica).__name__), "tokenizer", None)
    return getattr(replica, "_infinity_tokenizer", None) or getattr(replica, "tokenizer", None)


def backend_tokenizer(replica: Any) -> Any | None:
    """The fast (Rust) tokenizer behind the model's own tokenizer, for counting."""
    backend = getattr(hf_tokenizer(replica), "backend_tokenizer", None)
    if backend is None:  # debug or other engines: any tokenizer the replica carries
        for attr in ("_infinity_tokenizer", "tokenizer"):
            backend = getattr(getattr(replica, attr, None), "backend_tokenizer", None)
            if backend is not None:
                break
    return backend


def folder_prompts(replica: Any) -> tuple[dict[str, str], str | None]:
    """The prompts sentence-transformers read from the model folder
    (config_sentence_transformers.json) and its default prompt name; none for other kinds."""
    if kind_of(replica) != "embedder":
        return {}, None
    prompts = attr(replica, "prompts", "SentenceTransformer") or {}
    default = attr(replica, "default_prompt_name", "SentenceTransformer")
    return {str(k): str(v) for k, v in prompts.items()}, default


def _torch_model(replica: Any) -> Any | None:
    kind = kind_of(replica)
    if kind == "embedder":
        first = replica[0] if len(replica) else None
        return getattr(first, "auto_model", None)
    if kind == "classifier":
        return attr(replica, "_pipe", "SentenceClassifier").model
    return getattr(replica, "model", None)


def torch_modules(engine: Any) -> list[Any]:
    """The engine's replicas and the torch models inside them (memory.tensor_bytes)."""
    replicas = attr(engine, "_model_replicas", "AsyncEmbeddingEngine")
    return [m for r in replicas for m in (r, _torch_model(r)) if m is not None]


def position_limit(replica: Any) -> int | None:
    """The most tokens the model's (text) encoder can take at all: its position embeddings
    (the tokenizer's model_max_length where those are unknown)."""
    model = _torch_model(replica)
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None) or config
    positions = getattr(text, "max_position_embeddings", None)
    model_type = str(getattr(text, "model_type", ""))
    if isinstance(positions, int) and ("roberta" in model_type or model_type == "clap_text_model"):
        # RoBERTa-style position ids start after the padding index: two fewer usable slots.
        positions -= int(getattr(text, "pad_token_id", 1) or 1) + 1
    if isinstance(positions, int) and 0 < positions < _NO_LIMIT:
        return positions
    return _tokenizer_limit(replica)


def _tokenizer_limit(replica: Any) -> int | None:
    value = getattr(hf_tokenizer(replica), "model_max_length", None)
    return value if isinstance(value, int) and 0 < value < _NO_LIMIT else None


def default_limit(replica: Any) -> int | None:
    """The limit a model is served with unless configured: what its tokenizer says (the
    length it was trained for), within what its encoder can take."""
    limits = [v for v in (position_limit(replica), _tokenizer_limit(replica)) if v is not None]
    return min(limits) if limits else None


def id2label(replica: Any) -> dict[str, str]:
    """The model's label names by class index (its config's id2label), for TEI's /info."""
    labels = getattr(getattr(_torch_model(replica), "config", None), "id2label", None) or {}
    return {str(k): str(v) for k, v in labels.items()}


def labels_of(engine: Any) -> dict[str, str]:
    """id2label of an engine here, or of one a Ray Serve deployment runs (its description)."""
    remote = getattr(engine, "id2label", None)  # ray_serve.remote.RemoteEngine
    return remote if isinstance(remote, dict) else id2label(replica_of(engine))


def applied_max_length(replica: Any) -> int | None:
    """The token limit the engine really truncates each input to."""
    kind = kind_of(replica)
    if kind == "embedder":
        value = replica.max_seq_length
    elif kind in ("crossencoder", "classifier"):
        # infinity-emb calls these tokenizers with truncation and no max_length.
        value = getattr(hf_tokenizer(replica), "model_max_length", None)
    elif kind in ("clip", "clap"):
        value = attr(replica, "max_length", type(replica).__name__)
    else:
        return None
    return value if isinstance(value, int) and 0 < value < _NO_LIMIT else None


def apply_max_length(replica: Any, max_length: int | None) -> int | None:
    """Make the engine truncate at `max_length` (default: the model's own limit).

    Returns the limit now applied. Raises ValueError where it cannot be applied.
    """
    kind = kind_of(replica)
    ceiling = position_limit(replica)
    if max_length is not None and ceiling is not None and max_length > ceiling:
        raise ValueError(f"max_length {max_length} is more than this model takes ({ceiling})")
    if kind == "embedder":
        if max_length is not None:
            replica.max_seq_length = max_length
    elif kind in ("crossencoder", "classifier"):
        limit = max_length or default_limit(replica)
        if limit is not None:
            for tok in (hf_tokenizer(replica), getattr(replica, "_infinity_tokenizer", None)):
                if tok is not None:
                    tok.model_max_length = limit
    elif kind in ("clip", "clap"):
        # infinity-emb reads `config.max_length`, which for these models is transformers'
        # generation default (20), not the text encoder's limit: texts would be cut at 20.
        limit = max_length or default_limit(replica)
        if limit is not None:
            replica.max_length = limit
    elif max_length is not None:
        raise ValueError(
            f"max_length cannot be applied to a {type(replica).__name__} model; remove it"
        )
    return applied_max_length(replica)


def use_transformer_module(replica: Any, module: Any) -> None:
    """Run an embedder's transformer through another backend's module (ONNX Runtime): the
    engine keeps batching, tokenising, pooling and normalising as before."""
    if kind_of(replica) != "embedder" or getattr(replica, "mode_colbert", False):
        raise ValueError(
            f"a {type(replica).__name__} model cannot run on this backend; only "
            "sentence-transformers embedding models can"
        )
    replica[0] = module


# ---------------------------------------------------------------- media models


def image_tokens(replica: Any) -> int:
    """Tokens one image is to a ViT: (image_size / patch_size)^2 patches plus a class token."""
    config = getattr(getattr(replica, "model", None), "config", None)
    vision = getattr(config, "vision_config", None)
    size, patch = getattr(vision, "image_size", None), getattr(vision, "patch_size", None)
    if isinstance(size, int) and isinstance(patch, int) and patch > 0:
        return (size // patch) ** 2 + 1
    return 0


def sampling_rate(replica: Any) -> int | None:
    rate = getattr(replica, "sampling_rate", None)
    return rate if isinstance(rate, int) else None


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
    def for_replica(cls, replica: Any, name: str) -> LogitsRunner | None:
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


# ---------------------------------------------------------------- the contract


def contract_problems(engine: Any) -> list[str]:
    """Every internal this module reads, checked on a started engine; [] when all are there."""
    problems = []
    for check in (
        lambda: replica_of(engine),
        lambda: queue_length(engine),
        lambda: hf_tokenizer(replica_of(engine)),
        lambda: applied_max_length(replica_of(engine)),
    ):
        try:
            check()
        except EngineContractError as exc:
            problems.append(str(exc))
        except AttributeError as exc:
            problems.append(f"infinity-emb changed: {exc}")
    handler = getattr(engine, "_batch_handler", None)
    if handler is not None and not hasattr(handler, "_push_task"):
        problems.append("infinity-emb changed: BatchHandler._push_task is gone")
    return problems


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
    if kind_of(replica) != "embedder" or getattr(replica, "mode_colbert", False):
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
            matrix = np.asarray(results, dtype=np.float32)
            norms = np.linalg.norm(matrix, axis=1, keepdims=True)
            results = matrix / np.maximum(norms, 1e-12)  # what the engine would have done
        if counts is None or len(counts) != len(results):
            return results
        counted = []
        for i, (row, n) in enumerate(zip(results, counts, strict=True)):
            array = np.asarray(row).view(TokenCountedArray)
            array.tokens = int(n)
            if norms is not None:
                array.norm = float(norms[i, 0])
            counted.append(array)
        return counted

    replica.encode_pre, replica.encode_core = encode_pre, encode_core
    replica.encode_post = encode_post
    replica.openai_compat_token_ids = True  # TokenIds inputs are embedded as given
    return True


def accepts_token_ids(replica: Any) -> bool:
    """Whether the engine embeds TokenIds inputs exactly (count_tokens_in_engine installed)."""
    return getattr(replica, "openai_compat_token_ids", False) is True
