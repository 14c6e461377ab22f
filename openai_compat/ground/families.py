"""Which API family a request's errors answer in, and each family's error body.

Messages are the same for all; the shape (and for TEI and Google some status codes) differs,
so each family's clients parse what they expect. A path names its family (`family_of`); a
route on a path several dialects share sets it per request (`set_family`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from fastapi import Request

ErrorFamily = Literal["openai", "cohere", "tei", "infinity", "voyage", "ollama", "google"]

# Paths whose clients expect another family's errors; everything else answers in OpenAI's
# envelope. Bare paths shared by several dialects (api/shared.py) set the family per request.
_PATH_FAMILIES: dict[str, ErrorFamily] = {
    **dict.fromkeys(("/v1/embed", "/v2/embed", "/v1/rerank", "/v2/rerank"), "cohere"),
    **dict.fromkeys(("/", "/predict", "/decode", "/info", "/embed_sparse"), "tei"),
    **dict.fromkeys(("/embeddings", "/embeddings_image", "/embeddings_audio"), "infinity"),
}
# The bare paths several APIs share (api/shared.py's SHARED_PATHS): the key that marks each
# dialect and its error family, for errors answered before the body is parsed.
SHARED_KEYS: dict[str, tuple[tuple[str, ErrorFamily], ...]] = {
    "/embed": (("sentences", "openai"), ("inputs", "tei")),
    "/rerank": (("docs", "openai"), ("documents", "infinity"), ("texts", "tei")),
    "/classify": (("sentences", "openai"), ("input", "infinity")),
    "/tokenize": (("prompt", "openai"), ("inputs", "tei")),
}


def family_from_prefix(path: str, prefix: bytes) -> ErrorFamily | None:
    """On a shared bare path, the family whose dialect key the body's first bytes hold (the
    gateway answers 401/413/503 before a body is parsed); None elsewhere or if none shows."""
    keys = SHARED_KEYS.get(path)
    if not keys:
        return None
    for key, family in keys:
        if re.search(rb'"' + key.encode() + rb'"\s*:', prefix):
            return family
    return None


# TEI (1.9+, router/src/http/server.rs) answers validation errors, too-long and too-many
# inputs with 422 Validation, an empty batch with 400 Empty, backend faults with 424, and its
# `error_type` is one of its ErrorType variants (serialised by name). A body over the size
# limit stays a 413 (axum's limit); a missing key is a 401 whose type can only be Validation
# (TEI's own 401 has no body at all).
_TEI_STATUS = {400: 422, 404: 422, 500: 424}
_TEI_TYPES = {
    400: "Empty",
    413: "Validation",
    422: "Validation",
    424: "Backend",
    429: "Overloaded",
    503: "Unhealthy",
}


def printable(path: str) -> str:
    """A request path as it may be echoed in a message or a log line: the raw ASGI path
    (never a URL rebuilt from Host), control and non-ASCII characters escaped (a %0a in a
    path must not start a forged log line)."""
    if path.isascii() and path.isprintable():
        return path
    return path.encode("unicode_escape").decode("ascii")


# Whole families under a prefix: Voyage AI's ({"detail"}, which its SDK reads) and Ollama's
# ({"error"}: its clients print it).
_PREFIX_FAMILIES: tuple[tuple[str, ErrorFamily], ...] = (
    ("/voyage/", "voyage"),
    ("/api/", "ollama"),
    ("/v1beta/", "google"),
)
_GEMINI_METHODS = (":embedContent", ":batchEmbedContents")
# Google's google.rpc.Code name for each status (its error body's `status`)
_GOOGLE_STATUS = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
    507: "RESOURCE_EXHAUSTED",
}


def family_of(path: str) -> ErrorFamily:
    for prefix, family in _PREFIX_FAMILIES:
        if path.startswith(prefix):
            return family
    if path.startswith("/v1/models/") and path.endswith(_GEMINI_METHODS):  # Gemini's v1
        return "google"
    return _PATH_FAMILIES.get(path, "openai")


def family_for(scope: Mapping[str, Any]) -> ErrorFamily:
    """The family a request's errors use: set by its route once the dialect is known (see
    api/shared.py), else the path's."""
    chosen: ErrorFamily | None = scope.get("state", {}).get("error_family")
    return chosen or family_of(scope["path"])


def set_family(request: Request, family: ErrorFamily) -> None:
    request.state.error_family = family


def error_body(
    family: ErrorFamily, status: int, message: str, type: str, param: str | None, code: str | None
) -> tuple[int, dict[str, Any]]:
    if family == "cohere":
        return status, {"message": message}
    if family == "voyage":  # Voyage answers a model it does not serve with a 400
        return (400 if code == "model_not_found" else status), {"detail": message}
    if family == "ollama":
        return status, {"error": message}
    if family == "google":
        return _google_body(status, message, code)
    if family == "tei":
        if code == "empty_input":
            status = 400
        elif code != "payload_too_large":
            status = _TEI_STATUS.get(status, status)
        return status, {"error": message, "error_type": _TEI_TYPES.get(status, "Validation")}
    return status, {"error": {"message": message, "type": type, "param": param, "code": code}}


def _google_body(status: int, message: str, code: str | None) -> tuple[int, dict[str, Any]]:
    """Google's error body, as its SDKs read it (google-genai's ClientError: code, status,
    message). A key that is missing or wrong is Google's 400 API_KEY_INVALID, not a 401."""
    error: dict[str, Any] = {"code": status, "message": message}
    if status == 401:
        error["code"] = status = 400
        reason = {"reason": "API_KEY_INVALID", "domain": "googleapis.com"}
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", **reason}]
    error["status"] = _GOOGLE_STATUS.get(
        status, "UNKNOWN" if status >= 500 else "FAILED_PRECONDITION"
    )
    return status, {"error": error}
