"""Where a request carries its key, as each dialect's clients send it, and what to tell a
caller who sent none."""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from starlette.types import Scope

from openai_compat.ground.families import family_of


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def presented_key(scope: Scope) -> bytes:
    """`Authorization: Bearer` (OpenAI, Cohere, Voyage, Mistral... and Azure's Entra tokens),
    Azure's `api-key`, Google's `x-goog-api-key`, or `?key=` on Google's paths."""
    scheme, _, token = (header(scope, b"authorization") or b"").partition(b" ")
    if scheme.lower() == b"bearer" and token.strip():
        return token.strip()
    given = header(scope, b"api-key") or header(scope, b"x-goog-api-key")
    if given is None and family_of(scope["path"]) == "google":
        given = _query_key(scope.get("query_string", b""))
    return (given or b"").strip()


def key_hint(path: str) -> str:
    if family_of(path) == "google":
        return "it as 'x-goog-api-key: <key>' (or ?key=<key>)"
    if path.startswith("/openai/"):  # Azure OpenAI's
        return "'api-key: <key>' or 'Authorization: Bearer <key>'"
    return "'Authorization: Bearer <key>'"


def _query_key(query: bytes) -> bytes | None:
    """Google's `?key=`, a REST caller's credential (never logged: the log has no query)."""
    for pair in query.split(b"&"):
        name, _, value = pair.partition(b"=")
        if name == b"key":
            return unquote_to_bytes(value)
    return None
