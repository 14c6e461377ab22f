"""What a local model folder's config.json says of the model: the architectures it names."""

from __future__ import annotations

import json
from pathlib import Path


def architectures(source: str) -> list[str] | None:
    """The `architectures` of `source`'s config.json; None when `source` is not a local
    folder with a readable one (a hub id: ask transformers' AutoConfig)."""
    config = Path(source) / "config.json"
    if not config.is_file():
        return None
    try:
        names = json.loads(config.read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return None
    return [str(a) for a in names]
