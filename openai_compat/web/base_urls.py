"""Clients pointed at the wrong base URL get told which one they need, in their own API's error
body, instead of a bare 404: Cohere's SDKs at `.../v1` (they add `/v2`), Ollama's at `.../api`,
the voyageai SDK at `.../v1` on Voyage's own paths (its rerank there is told so by the rerank
route: the body's `top_k` is the sign; the SDK's user agent is only `python-requests`). It sits
inside the gateway (keys, limits and the access line apply first) and before the routes; it
answers only the paths below and passes everything else through untouched.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from openai_compat.api.voyage.protocol import VOYAGE_HINT
from openai_compat.ground.errors import error_response
from openai_compat.ground.families import ErrorFamily

# Voyage AI's own paths, which the voyageai SDK appends to its base URL
VOYAGE_ONLY = frozenset({"/v1/contextualizedembeddings", "/v1/multimodalembeddings"})


def misdirected(path: str) -> tuple[str, ErrorFamily] | None:
    """(message, error family) of the 404 for a path a client reached under the wrong base
    URL; None for any other path."""
    if path.startswith("/v1/v2/"):
        return (
            f"Unknown route {path}: Cohere's SDKs add /v2 themselves; drop /v1 from the base "
            "URL (base_url=http://HOST:PORT).",
            "cohere",
        )
    if path.startswith("/api/api/"):
        return (
            f"Unknown route {path}: Ollama's clients add /api themselves; drop /api from the "
            "host (host=http://HOST:PORT).",
            "ollama",
        )
    if path in VOYAGE_ONLY:
        return f"Unknown route {path}: it is Voyage AI's; {VOYAGE_HINT}", "voyage"
    return None


class BaseUrlHints:
    """ASGI middleware answering misdirected requests (above) with a 404 in their family."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = misdirected(scope["path"]) if scope["type"] == "http" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        message, family = found
        kind = "invalid_request_error"
        answer = error_response(404, message, type=kind, code="not_found", family=family)
        await answer(scope, receive, send)
