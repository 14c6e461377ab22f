"""What a model folder's own files say of the model: the architectures its config.json names,
and the sentence-transformers model class its `config_sentence_transformers.json` was saved
from (`model_type`: SentenceTransformer, SparseEncoder, CrossEncoder, MultiVectorEncoder)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

ST_CONFIG = "config_sentence_transformers.json"


def _read(source: str, name: str, revision: str | None) -> Any:
    """`name`'s JSON in a local folder, or in a hub model's files (the local cache or a
    download, as the library itself would read it); None when there is none."""
    path = Path(source) / name
    if not path.is_file() and not Path(source).is_dir():
        try:
            from huggingface_hub import hf_hub_download

            path = Path(hf_hub_download(source, name, revision=revision))
        except Exception:  # absent, offline, or not a hub id: the library decides at load
            return None
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def architectures(source: str) -> list[str] | None:
    """The `architectures` of `source`'s config.json; None when `source` is not a local
    folder with a readable one (a hub id: ask transformers' AutoConfig)."""
    if not (Path(source) / "config.json").is_file():
        return None
    found = _read(source, "config.json", None)
    if not isinstance(found, dict):
        return None
    return [str(a) for a in found.get("architectures") or []]


def model_type(source: str, revision: str | None = None) -> str | None:
    """The sentence-transformers class the folder was saved from; None for folders without
    the file or the key (sentence-transformers < 5 wrote no model_type: SentenceTransformers,
    or plain transformers folders)."""
    found = _read(source, ST_CONFIG, revision)
    kind = found.get("model_type") if isinstance(found, dict) else None
    return str(kind) if isinstance(kind, str) else None


def has_modules(source: str, revision: str | None = None) -> bool:
    """Whether the folder lists sentence-transformers modules (modules.json)."""
    path = Path(source)
    if path.is_dir():
        return (path / "modules.json").is_file()
    return isinstance(_read(source, "modules.json", revision), list)


def declared_prompts(source: str, revision: str | None = None) -> dict[str, str] | None:
    """The prompts the folder's own `config_sentence_transformers.json` declares (what its
    author wrote: sentence-transformers 6 adds blank "query" / "document" entries to the
    prompts it loads); None without the file."""
    found = _read(source, ST_CONFIG, revision)
    if not isinstance(found, dict):
        return None
    prompts = found.get("prompts")
    if not isinstance(prompts, dict):
        return {}
    return {str(k): str(v) for k, v in prompts.items() if isinstance(v, str)}


@functools.cache
def model_family(source: str, revision: str | None = None) -> str | None:
    """The `model_type` of the folder's config.json (bert, qwen2, paligemma...): Ollama's
    family of a model. Read once, from a local folder or the hub cache only (it is asked on
    the request path: never a download)."""
    path = Path(source) / "config.json"
    if not path.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(source, "config.json", revision=revision)
        except Exception:  # not a hub id
            return None
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    kind = found.get("model_type") if isinstance(found, dict) else None
    return str(kind) if isinstance(kind, str) else None


def library_prompts(model: Any) -> tuple[dict[str, str], str | None]:
    """The prompts a SentenceTransformer read from its folder (config_sentence_transformers
    .json) and its default prompt name. Sentence-transformers 6 gives every model
    {"query": "", "document": ""} for its encode_query / encode_document: empty prefixes are
    no prompts (a folder without any, as 3.x reported it), so input types stay ignored."""
    prompts = getattr(model, "prompts", None) or {}
    if not any(prompts.values()):
        return {}, None
    default = getattr(model, "default_prompt_name", None)
    return {str(k): str(v) for k, v in prompts.items()}, default
