"""Which API a bare (unprefixed) path speaks, decided from the body's keys in one table.

`/v1/...` and `/v2/...` speak OpenAI, Cohere and Jina. The bare paths speak infinity-emb's
API where infinity defines the path (it serves without a prefix), TEI's where TEI defines it,
and the original tutorial's where the tutorial does. Where several define the same path, the
body's required key says which one the client speaks; a body with none of them is a 400 that
names the key each dialect expects.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel, ConfigDict

from openai_compat.api.infinity.protocol import InfinityClassifyRequest, InfinityRerankRequest
from openai_compat.api.tei.protocol import TeiEmbedRequest, TeiRerankRequest, TeiTokenizeRequest
from openai_compat.api.vllm import VllmTokenizeRequest
from openai_compat.bodies import Chooser
from openai_compat.errors import BadRequest
from openai_compat.protocol import (
    TutorialClassifyRequest,
    TutorialEmbedRequest,
    TutorialRerankRequest,
)

# path -> (the key that marks a dialect, the dialect, its request model), first match wins.
SHARED_PATHS: dict[str, tuple[tuple[str, str, type[BaseModel]], ...]] = {
    "/embed": (
        ("sentences", "tutorial", TutorialEmbedRequest),
        ("inputs", "tei", TeiEmbedRequest),
    ),
    "/rerank": (
        ("docs", "tutorial", TutorialRerankRequest),
        ("documents", "infinity", InfinityRerankRequest),
        ("texts", "tei", TeiRerankRequest),
    ),
    "/classify": (
        ("sentences", "tutorial", TutorialClassifyRequest),
        ("input", "infinity", InfinityClassifyRequest),
    ),
    "/tokenize": (
        ("prompt", "vllm", VllmTokenizeRequest),
        ("inputs", "tei", TeiTokenizeRequest),
    ),
}


class NoDialect(BaseModel):
    """A body that matches no dialect of its path (kept whole, for the error message)."""

    model_config = ConfigDict(extra="allow")


def chooser(path: str) -> Chooser:
    """The body-model chooser for a shared path (picklable: bodies may be parsed in the
    worker processes)."""
    return functools.partial(_choose, path)


def _choose(path: str, data: Any) -> type[BaseModel]:
    if isinstance(data, dict):
        for key, _, model in SHARED_PATHS[path]:
            if key in data:
                return model
    return NoDialect


def no_dialect(path: str) -> BadRequest:
    expected = "; ".join(f"'{key}' ({dialect})" for key, dialect, _ in SHARED_PATHS[path])
    return BadRequest(
        f"POST {path} is shared by several APIs and this body matches none: send {expected}.",
        param=SHARED_PATHS[path][0][0],
        code="unknown_dialect",
    )
