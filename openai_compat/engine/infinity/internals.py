"""The one place that knows infinity-emb's internals (0.0.78): its engine's model replicas,
batching queue and push task, the tokenizers and limits of each replica class.

Everything the server needs beyond infinity-emb's public API is read here (and in the hooks
it installs, hooks.py). When a release moves an attribute, `contract_problems` names it and
loading fails loudly instead of degrading silently; tests/test_engine_contract.py runs the
same checks against the installed release. engine.InfinityEngine answers the server's
questions (engine/contract.py) from here.
"""

from __future__ import annotations

from typing import Any

from openai_compat.engine.contract import Kind

# Class names of infinity-emb's torch replicas -> what kind of model they hold.
_KINDS: dict[str, Kind] = {
    "SentenceTransformerPatched": "embedder",
    "CrossEncoderPatched": "crossencoder",
    "SentenceClassifier": "classifier",
    "TIMM": "clip",
    "TorchAudioModel": "clap",
}


class EngineContractError(RuntimeError):
    """infinity-emb no longer has an internal this server relies on."""


def attr(obj: Any, name: str, where: str) -> Any:
    try:
        return getattr(obj, name)
    except AttributeError:
        raise EngineContractError(
            f"infinity-emb changed: {where}.{name} is gone (openai_compat/engine/infinity/"
            "internals.py must follow the new release)"
        ) from None


def bettertransformer_available() -> bool:
    """Whether infinity-emb can apply BetterTransformer (else it skips it without a word)."""
    from infinity_emb.transformer import acceleration

    return "BetterTransformerManager" in vars(acceleration)


def multivector(replica: Any) -> bool:
    return bool(getattr(replica, "mode_colbert", False))


def replica_of(engine: Any) -> Any:
    replicas = attr(engine, "_model_replicas", "AsyncEmbeddingEngine")
    if not replicas:
        raise EngineContractError("infinity-emb changed: the engine has no model replicas")
    return replicas[0]


def queue_length(engine: Any) -> int:
    handler = getattr(engine, "_batch_handler", None)
    if handler is None:
        return 0
    return len(attr(handler, "_queue_prio", "BatchHandler"))


def batcher_alive(engine: Any) -> bool:
    if not engine.is_running:
        return False
    handler = getattr(engine, "_batch_handler", None)
    push = getattr(handler, "_push_task", None)
    return not (push is not None and push.done())


def kind_of(replica: Any) -> Kind:
    return _KINDS.get(type(replica).__name__, "other")


def hf_tokenizer(replica: Any) -> Any | None:
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


def torch_model(replica: Any) -> Any | None:
    kind = kind_of(replica)
    if kind == "embedder":
        first = replica[0] if len(replica) else None
        return getattr(first, "auto_model", None)
    if kind == "classifier":
        return attr(replica, "_pipe", "SentenceClassifier").model
    return getattr(replica, "model", None)


def torch_modules(engine: Any) -> list[Any]:
    replicas = attr(engine, "_model_replicas", "AsyncEmbeddingEngine")
    return [m for r in replicas for m in (r, torch_model(r)) if m is not None]


def applied_max_length(replica: Any) -> Any:
    """The limit the replica truncates at, unchecked (InfinityEngine.max_length checks it)."""
    kind = kind_of(replica)
    if kind == "embedder":
        return replica.max_seq_length
    if kind in ("crossencoder", "classifier"):
        # infinity-emb calls these tokenizers with truncation and no max_length.
        return getattr(hf_tokenizer(replica), "model_max_length", None)
    if kind in ("clip", "clap"):
        return attr(replica, "max_length", type(replica).__name__)
    return None


def apply_max_length(replica: Any, max_length: int | None, default: int | None) -> None:
    """Make the replica truncate at `max_length`, or where it has no setting of its own that
    would apply, at `default` (the model's own limit). ValueError where it cannot."""
    kind = kind_of(replica)
    if kind == "embedder":
        if max_length is not None:
            replica.max_seq_length = max_length
    elif kind in ("crossencoder", "classifier"):
        limit = max_length or default
        if limit is not None:
            for tok in (hf_tokenizer(replica), getattr(replica, "_infinity_tokenizer", None)):
                if tok is not None:
                    tok.model_max_length = limit
    elif kind in ("clip", "clap"):
        # infinity-emb reads `config.max_length`, which for these models is transformers'
        # generation default (20), not the text encoder's limit: texts would be cut at 20.
        limit = max_length or default
        if limit is not None:
            replica.max_length = limit
    elif max_length is not None:
        raise ValueError(
            f"max_length cannot be applied to a {type(replica).__name__} model; remove it"
        )


def image_tokens(replica: Any) -> int:
    config = getattr(getattr(replica, "model", None), "config", None)
    vision = getattr(config, "vision_config", None)
    size, patch = getattr(vision, "image_size", None), getattr(vision, "patch_size", None)
    if isinstance(size, int) and isinstance(patch, int) and patch > 0:
        return (size // patch) ** 2 + 1
    return 0


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
