"""A model's input limits, read from its transformers model, tokenizer and processor (either
engine): the most tokens its encoder can take, the length it was trained for, the checks on a
configured `max_length`, and the image size its processor keeps."""

from __future__ import annotations

import math
from typing import Any

# Tokenizers report this (or larger) when no limit is configured.
NO_LIMIT = 1_000_000


def plausible(value: Any) -> int | None:
    """`value` if it is a real token limit, else None."""
    return value if isinstance(value, int) and 0 < value < NO_LIMIT else None


def position_limit(model: Any, tokenizer: Any) -> int | None:
    """The most tokens the model's (text) encoder can take at all: its position embeddings
    (the tokenizer's model_max_length where those are unknown)."""
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None) or config
    positions = getattr(text, "max_position_embeddings", None)
    model_type = str(getattr(text, "model_type", ""))
    if isinstance(positions, int) and ("roberta" in model_type or model_type == "clap_text_model"):
        # RoBERTa-style position ids start after the padding index: two fewer usable slots.
        positions -= int(getattr(text, "pad_token_id", 1) or 1) + 1
    return plausible(positions) or plausible(getattr(tokenizer, "model_max_length", None))


def default_limit(model: Any, tokenizer: Any) -> int | None:
    """The limit a model is served with unless configured: what its tokenizer says (the
    length it was trained for), within what its encoder can take."""
    found = (
        position_limit(model, tokenizer),
        plausible(getattr(tokenizer, "model_max_length", None)),
    )
    limits = [v for v in found if v is not None]
    return min(limits) if limits else None


def check(max_length: int | None, model: Any, tokenizer: Any) -> None:
    """ValueError where `max_length` is more than the model takes."""
    ceiling = position_limit(model, tokenizer)
    if max_length is not None and ceiling is not None and max_length > ceiling:
        raise ValueError(f"max_length {max_length} is more than this model takes ({ceiling})")


def labels(model: Any) -> dict[str, str]:
    """The model's label names by class index (its config's id2label)."""
    found = getattr(getattr(model, "config", None), "id2label", None) or {}
    return {str(k): str(v) for k, v in found.items()}


def image_side(processor: Any) -> int | None:
    """The shortest side an image can be shrunk to (by a whole factor, before the processor
    runs) without losing a pixel the processor keeps: the largest length its resize and crop
    may give, or for processors that size by pixel count (Qwen2-VL's family: `longest_edge`
    is the most pixels) the side of that many pixels' square. None where it resizes nothing
    or its sizes cannot be read: images are then decoded at full size."""
    images = getattr(processor, "image_processor", processor)
    size = getattr(images, "size", None)
    if size is None or getattr(images, "do_resize", True) is False:
        return None

    def read(source: Any, key: str) -> int | None:
        value = source.get(key) if isinstance(source, dict) else getattr(source, key, None)
        return value if isinstance(value, int) and value > 0 else None

    if getattr(images, "temporal_patch_size", None) or read(images, "max_pixels"):
        most = read(size, "longest_edge") or read(images, "max_pixels")
        return math.isqrt(most - 1) + 1 if most else None
    keys = ("height", "width", "shortest_edge", "longest_edge", "max_height", "max_width")
    crop = getattr(images, "crop_size", None)
    lengths = [read(size, k) for k in keys]
    lengths += [read(crop, k) for k in keys] if crop is not None else []
    return max((v for v in lengths if v), default=None)
