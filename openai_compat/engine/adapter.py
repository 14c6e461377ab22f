"""What the server reads of a model's engine, for either engine: the native engine answers
from its own objects (native.py, public library attributes only); infinity-emb's questions
go to engine/infinity/internals.py, the one place that knows its internals.

Callers pass an engine or its replica (a native engine is its own replica) and never ask
which engine it is.
"""

from __future__ import annotations

from typing import Any

from openai_compat.engine.infinity import internals
from openai_compat.engine.infinity.internals import (  # noqa: F401 (re-exported)
    EngineContractError,
    Kind,
    attr,
    bettertransformer_available,
)
from openai_compat.engine.usage import (  # noqa: F401 (re-exported)
    TokenCountedArray,
    TokenIds,
    engine_token_count,
    features_from_ids,
    length_estimate,
    raw_vectors,
)

# Tokenizers report this (or larger) when no limit is configured.
_NO_LIMIT = 1_000_000


def is_native(obj: Any) -> bool:
    """Whether `obj` is a NativeEngine (a native engine is its own replica)."""
    from openai_compat.engine.native import NativeEngine

    return isinstance(obj, NativeEngine)


def sentence_transformer(replica: Any) -> Any:
    """An embedder's SentenceTransformer: the native engine's model, or infinity-emb's
    replica itself (a subclass of it)."""
    return replica.model if is_native(replica) else replica


def multivector(replica: Any) -> bool:
    """One vector per token (ColBERT-style), on either engine."""
    if is_native(replica):
        return bool(replica.runner.multivector)
    return internals.multivector(replica)


# ---------------------------------------------------------------- engine and batcher


def replica_of(engine: Any) -> Any:
    """The engine's (first) model replica: the object that holds weights and tokenizer."""
    return engine if is_native(engine) else internals.replica_of(engine)


def batch_stats(engine: Any) -> dict[str, Any] | None:
    """What the native engine's forward thread has done (scheduler.BatchStats.as_dict);
    None for engines that do not say (infinity-emb's, a Ray Serve deployment's handle)."""
    return engine.scheduler.stats.as_dict() if is_native(engine) else None


def queue_length(engine: Any) -> int:
    """Items waiting in the engine's batching queue (0 before the batcher exists)."""
    if is_native(engine):
        return int(engine.queue_length())
    return internals.queue_length(engine)


def batcher_alive(engine: Any) -> bool:
    """False once the engine stopped or its result-pushing task died."""
    if is_native(engine):
        return bool(engine.is_running)
    return internals.batcher_alive(engine)


def kind_of(replica: Any) -> Kind:
    if is_native(replica):
        kind: Kind = replica.kind
        return kind
    return internals.kind_of(replica)


# ---------------------------------------------------------------- tokenizers and limits


def hf_tokenizer(replica: Any) -> Any | None:
    """The transformers tokenizer the model applies its limit with."""
    if is_native(replica):
        return replica.runner.tokenizer
    return internals.hf_tokenizer(replica)


def backend_tokenizer(replica: Any) -> Any | None:
    """The fast (Rust) tokenizer behind the model's own tokenizer, for counting."""
    backend = getattr(hf_tokenizer(replica), "backend_tokenizer", None)
    if backend is None:  # debug or other engines: any tokenizer the replica carries
        for name in ("_infinity_tokenizer", "tokenizer"):
            backend = getattr(getattr(replica, name, None), "backend_tokenizer", None)
            if backend is not None:
                break
    return backend


def folder_prompts(replica: Any) -> tuple[dict[str, str], str | None]:
    """The prompts sentence-transformers read from the model folder
    (config_sentence_transformers.json) and its default prompt name, for text embedders
    (dense or sparse); none for other kinds."""
    kind = kind_of(replica)
    # a native "clip" is also a vision-language embedder, whose prompts are system messages
    if kind not in ("embedder", "sparse") and not (kind == "clip" and is_native(replica)):
        return {}, None
    replica = sentence_transformer(replica)
    prompts = attr(replica, "prompts", "SentenceTransformer") or {}
    default = attr(replica, "default_prompt_name", "SentenceTransformer")
    if not any(prompts.values()):
        # sentence-transformers 6 gives every model {"query": "", "document": ""} for its
        # encode_query / encode_document: empty prefixes are no prompts (a folder without
        # any, as 3.x reported it), so input types stay ignored for such a model.
        return {}, None
    return {str(k): str(v) for k, v in prompts.items()}, default


def _torch_model(replica: Any) -> Any | None:
    if is_native(replica):  # the transformers model inside the library's object
        return replica.model.transformers_model
    return internals.torch_model(replica)


def torch_modules(engine: Any) -> list[Any]:
    """The engine's replicas and the torch models inside them (memory.tensor_bytes)."""
    if is_native(engine):
        return list(engine.torch_modules())
    return internals.torch_modules(engine)


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
    if is_native(replica):
        value = replica.model.max_seq_length
    else:
        value = internals.applied_max_length(replica)
    return value if isinstance(value, int) and 0 < value < _NO_LIMIT else None


def apply_max_length(replica: Any, max_length: int | None) -> int | None:
    """Make the engine truncate at `max_length` (default: the model's own limit).

    Returns the limit now applied. Raises ValueError where it cannot be applied.
    """
    ceiling = position_limit(replica)
    if max_length is not None and ceiling is not None and max_length > ceiling:
        raise ValueError(f"max_length {max_length} is more than this model takes ({ceiling})")
    if is_native(replica):  # sentence-transformers' own setting, every kind
        limit = max_length or default_limit(replica)
        if limit is not None:
            replica.model.max_seq_length = limit
    else:
        internals.apply_max_length(replica, max_length, default_limit(replica))
    return applied_max_length(replica)


# ---------------------------------------------------------------- media models


def image_tokens(replica: Any) -> int:
    """Tokens one image is to a ViT: (image_size / patch_size)^2 patches plus a class token."""
    if is_native(replica):
        return int(replica.runner.image_tokens)
    return internals.image_tokens(replica)


def sampling_rate(replica: Any) -> int | None:
    rate = getattr(replica, "sampling_rate", None)
    return rate if isinstance(rate, int) else None


# ---------------------------------------------------------------- the contract


def contract_problems(engine: Any) -> list[str]:
    """infinity-emb's internals this server reads, checked on a started engine ([] when all
    are there, and always for the native engine, which reads public attributes only)."""
    return [] if is_native(engine) else internals.contract_problems(engine)
