"""One exception family, and the one place that turns errors into OpenAI-style responses."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from openai_compat.ground.families import ErrorFamily, error_body, family_for, printable

logger = logging.getLogger("openai_compat")


class APIError(Exception):
    """An error the client should see, with its HTTP status and OpenAI error fields."""

    status: int = 500
    type: str = "server_error"
    default_code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code or self.default_code
        self.headers = dict(headers or {})


class BadRequest(APIError):
    status = 400
    type = "invalid_request_error"


class InputTooLong(BadRequest):
    """A text past the model's limit, named by the client's own field; a route may give its
    own remedy (`advising`), as /v1/embeddings names its long_input choices."""

    def __init__(
        self,
        name: tuple[str, str],
        tokens: int | None,
        limit: int,
        remedy: str = "let the server truncate.",
    ) -> None:
        param, label = name
        # None: refused from a prefix (a huge text is never tokenized whole)
        counted = (
            f"{tokens} tokens, more than the {limit}"
            if tokens is not None
            else (f"more than the {limit} tokens")
        )
        super().__init__(
            f"{label}: {counted} this model takes. Shorten it, or {remedy}",
            param=param,
            code="input_too_long",
        )
        self.name, self.tokens, self.limit = name, tokens, limit

    def advising(self, remedy: str) -> InputTooLong:
        return InputTooLong(self.name, self.tokens, self.limit, remedy)


class WholeTextTooLong(InputTooLong):
    """A text late chunking must read whole: the long-input modes a route advises do not help."""


class Unauthorized(APIError):
    status = 401
    type = "invalid_request_error"
    default_code = "invalid_api_key"


class Forbidden(APIError):
    status = 403
    type = "invalid_request_error"
    default_code = "permission_denied"


class ModelNotFound(APIError):
    status = 404
    type = "invalid_request_error"
    default_code = "model_not_found"

    def __init__(self, name: str, served: Sequence[str]) -> None:
        super().__init__(
            f"The model {name!r} does not exist. Served models: {', '.join(served)}.",
            param="model",
        )


class NotFound(APIError):
    status = 404
    type = "invalid_request_error"
    default_code = "not_found"


class PayloadTooLarge(APIError):
    status = 413
    type = "invalid_request_error"
    default_code = "payload_too_large"

    @classmethod
    def body(cls, size: int, flag: str) -> PayloadTooLarge:  # `flag`: the option that sets it
        return cls(f"The request body is larger than {size} bytes (the server's {flag}).")


class InsufficientStorage(APIError):
    status = 507
    type = "server_error"
    default_code = "insufficient_storage"


class RateLimited(APIError):
    status = 429
    type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class ModelOutputError(APIError):
    """The model answered with numbers that cannot be sent (NaN, infinity): a server fault."""

    status = 500
    type = "server_error"
    default_code = "non_finite_output"


class ServiceUnavailable(APIError):
    status = 503
    type = "service_unavailable"
    default_code = "service_unavailable"


def error_response(
    status: int,
    message: str,
    *,
    type: str,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
    family: ErrorFamily = "openai",
) -> Response:
    status, body = error_body(family, status, message, type, param, code)
    return Response(
        orjson.dumps(body), status_code=status, media_type="application/json", headers=headers
    )


def api_error_response(exc: APIError, family: ErrorFamily = "openai") -> Response:
    return error_response(
        exc.status,
        exc.message,
        type=exc.type,
        param=exc.param,
        code=exc.code,
        headers=exc.headers,
        family=family,
    )


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "bytes"}


def _is_type_tag(part: object) -> bool:
    """pydantic names union branches ('str', 'list[int]', 'function-after[...]'): not fields."""
    return isinstance(part, str) and (
        part in _TYPE_TAGS or "[" in part or part.startswith(("function-", "json-or-python"))
    )


def _param_from_loc(loc: Sequence[Any]) -> str | None:
    """('body', 'documents', 3, 'text') -> 'documents[3].text'; the client's view of the field."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif _is_type_tag(p):
            continue
        else:
            out += f".{p}" if out else str(p)
    return out or None


# What a field accepts, for messages about values that matched none of a union's forms.
FIELD_FORMS = {
    "input": "a string, an array of strings, an array of token ids (integers), or an array "
    "of arrays of token ids",
    "documents": "an array of strings or of objects",
    "query": "a string",
}


def validation_message(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str | None, str | None]:
    """pydantic errors -> (message, param, code) for the envelope."""
    first = errors[0]
    kind = first.get("type")
    if kind == "json_invalid":
        return (
            "The request body is not valid JSON: " + str(first.get("msg")),
            None,
            "invalid_json",
        )
    param = _param_from_loc(first.get("loc", ()))
    if param is None:
        return ("The request body must be a JSON object.", None, "invalid_request_body")
    if kind == "missing":
        return (f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
    top = param.split(".")[0].split("[")[0]
    union = [e for e in errors if (_param_from_loc(e.get("loc", ())) or "").startswith(top)]
    if len(union) > 1 and top in FIELD_FORMS:
        return (
            f"Invalid type for '{top}': expected {FIELD_FORMS[top]}.",
            top,
            "invalid_type",
        )
    return (f"Invalid value for '{param}': {first.get('msg')}.", param, "invalid_value")


def validation_error_response(
    exc: RequestValidationError, family: ErrorFamily = "openai"
) -> Response:
    if family == "infinity":  # FastAPI's 422, as infinity-emb's server answers it
        detail = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": e.get("type")}
            for e in exc.errors()
        ]
        return Response(orjson.dumps({"detail": detail}), 422, media_type="application/json")
    message, param, code = validation_message(exc.errors())
    return error_response(
        400, message, type="invalid_request_error", param=param, code=code, family=family
    )


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> Response:
        return api_error_response(exc, family_for(request.scope))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        return validation_error_response(exc, family_for(request.scope))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            message = f"Unknown route: {request.method} {printable(request.scope['path'])}"
            code = "not_found"
        elif exc.status_code == 405:
            message = (
                f"Method {request.method} is not allowed on {printable(request.scope['path'])}."
            )
            code = "method_not_allowed"
        else:
            message, code = str(exc.detail), None
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return error_response(
            exc.status_code,
            message,
            type=kind,
            code=code,
            headers=exc.headers,
            family=family_for(request.scope),
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        # the details (library text, paths) go to the log with the request id, never to the
        # client, who gets the id to quote
        request_id = request.scope.get("state", {}).get("request_id", "")
        logger.error(
            "unhandled error on %s %s (request id %s)",
            request.method,
            request.scope.get("path", ""),
            request_id,
            exc_info=exc,
        )
        return error_response(
            500,
            f"The server had an error while processing your request (request id {request_id}).",
            type="server_error",
            code="internal_error",
            family=family_for(request.scope),
        )
