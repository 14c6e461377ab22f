"""What the server reads of a model's engine: the native engine's own answers (native.py,
public library attributes only), or, for the optional infinity-emb engine, the one place
that knows its internals (0.0.78), with engine/splade.py for the sparse head it adds to an
embedder replica.

Everything the server needs beyond infinity-emb's public API (its model replicas, batching
queue and push task, tokenizers, classification pipeline, where each model kind applies its
token limit) is read here and nowhere else. When an engine release moves an attribute,
`contract_problems` names it and loading fails loudly instead of degrading silently; the
contract test runs the same checks against the installed release.
"""

from __future__ import annotations

from typing import Any, Literal

from openai_compat.engine.usage import (  # noqa: F401 (re-exported)
    TokenCountedArray,
    TokenIds,
    engine_token_count,
    features_from_ids,
    length_estimate,
    raw_vectors,
)

Kind = Literal["embedder", "sparse", "crossencoder", "classifier", "clip", "clap", "other"]

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
    return bool(getattr(replica, "mode_colbert", False))


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
    if is_native(engine):
        return engine
    replicas = attr(engine, "_model_replicas", "AsyncEmbeddingEngine")
    if not replicas:
        raise EngineContractError("infinity-emb changed: the engine has no model replicas")
    return replicas[0]


def queue_length(engine: Any) -> int:
    """Items waiting in the engine's batching queue (0 before the batcher exists)."""
    if is_native(engine):
        return int(engine.queue_length())
    handler = getattr(engine, "_batch_handler", None)
    if handler is None:
        return 0
    return len(attr(handler, "_queue_prio", "BatchHandler"))


def batcher_alive(engine: Any) -> bool:
    """False once the engine stopped or its result-pushing task died."""
    if is_native(engine):
        return bool(engine.is_running)
    if not engine.is_running:
        return False
    handler = getattr(engine, "_batch_handler", None)
    push = getattr(handler, "_push_task", None)
    return not (push is not None and push.done())


def kind_of(replica: Any) -> Kind:
    if is_native(replica):
        return replica.kind
    return _KINDS.get(type(replica).__name__, "other")


# ---------------------------------------------------------------- tokenizers and limits


def hf_tokenizer(replica: Any) -> Any | None:
    """The transformers tokenizer the model applies its limit with."""
    if is_native(replica):
        return replica.runner.tokenizer
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
    (config_sentence_transformers.json) and its default prompt name, for text embedders
    (dense or sparse); none for other kinds."""
    if kind_of(replica) not in ("embedder", "sparse"):
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
    kind = kind_of(replica)
    if kind == "embedder":
        first = replica[0] if len(replica) else None
        return getattr(first, "auto_model", None)
    if kind == "classifier":
        return attr(replica, "_pipe", "SentenceClassifier").model
    return getattr(replica, "model", None)


def torch_modules(engine: Any) -> list[Any]:
    """The engine's replicas and the torch models inside them (memory.tensor_bytes)."""
    if is_native(engine):
        return list(engine.torch_modules())
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
    if is_native(replica):
        value = replica.model.max_seq_length
        return value if isinstance(value, int) and 0 < value < _NO_LIMIT else None
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
    if is_native(replica):  # sentence-transformers' own setting, every kind
        limit = max_length or default_limit(replica)
        if limit is not None:
            replica.model.max_seq_length = limit
        return applied_max_length(replica)
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


# ---------------------------------------------------------------- media models


def image_tokens(replica: Any) -> int:
    """Tokens one image is to a ViT: (image_size / patch_size)^2 patches plus a class token."""
    if is_native(replica):
        return int(replica.runner.image_tokens)
    config = getattr(getattr(replica, "model", None), "config", None)
    vision = getattr(config, "vision_config", None)
    size, patch = getattr(vision, "image_size", None), getattr(vision, "patch_size", None)
    if isinstance(size, int) and isinstance(patch, int) and patch > 0:
        return (size // patch) ** 2 + 1
    return 0


def sampling_rate(replica: Any) -> int | None:
    rate = getattr(replica, "sampling_rate", None)
    return rate if isinstance(rate, int) else None


# ---------------------------------------------------------------- the contract


def contract_problems(engine: Any) -> list[str]:
    """Every internal this module reads, checked on a started engine; [] when all are there."""
    if is_native(engine):
        return []
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
