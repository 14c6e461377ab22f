"""Pure ASGI middleware: the gateway in front of every route, and the POST fast path.

Gateway, per HTTP request: request id (honoured or made, echoed), API-key check, body size
limit, refusal while draining, in-flight accounting, metrics and one access-log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openai_compat.errors import (
    SHARED_KEYS,
    APIError,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    Unauthorized,
    api_error_response,
    family_for,
    family_from_prefix,
    family_of,
    validation_error_response,
)
from openai_compat.lifecycle import Lifecycle
from openai_compat.metrics import Metrics, RouteLabels
from openai_compat.settings import Settings
from openai_compat.slots import raise_if_unloaded, request_leases

Endpoint = Callable[[Request], Awaitable[Response]]

access_logger = logging.getLogger("openai_compat.access")

# Probes stay answerable while draining, need no key and are not counted as work.
PROBE_PATHS = frozenset({"/health", "/ready"})
DOC_PATHS = frozenset({"/metrics", "/docs", "/redoc", "/openapi.json"})
# The playground's static page and assets, and GET / that links to it: they hold no data (the
# page asks for the key and sends it with its API calls), so a browser can always load them.
UPLOAD_PATHS = frozenset({"/v1/files", "/files"})
PAGE_PATHS = frozenset({"/", "/playground", "/playground/app.js", "/playground/app.css"})
# The docs pages' UI code (api/docs.py): public, holds no data.
DOC_ASSETS_PREFIX = "/docs/assets/"
ADMIN_PREFIX = "/admin"  # model load/unload (api/admin.py): the admin key only
CLIENT_CLOSED = 499  # nginx's status for "the client went away first"


PEEK = 4096  # body bytes kept to tell a shared path's dialect (its key comes first)
PEEK_WAIT_S = 0.5  # how long a refused request's first body bytes are waited for


async def _first_bytes(receive: Receive) -> bytes:
    """The first body bytes a refused request sent (one message, waited for briefly): enough
    to tell a shared bare path's dialect for its error body; never the whole body."""
    try:
        message = await asyncio.wait_for(receive(), PEEK_WAIT_S)
    except TimeoutError:
        return b""
    return bytes(message.get("body", b"")[:PEEK]) if message["type"] == "http.request" else b""


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _request_id(scope: Scope) -> str:
    given = _header(scope, b"x-request-id")
    if given and len(given) <= 128 and given.isascii():
        text = given.decode()
        if text.isprintable():
            return text
    return uuid.uuid4().hex


class GatewayMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        settings: Settings,
        lifecycle: Lifecycle,
        metrics: Metrics,
        known_paths: frozenset[str],
    ) -> None:
        self.app = app
        self.lifecycle = lifecycle
        self.metrics = metrics
        self.known = known_paths
        self.route_label = RouteLabels(known_paths)
        self.keys = [k.encode() for k in settings.api_key]
        self.admin_keys = [settings.admin_key.encode()] if settings.admin_key else []
        protect = settings.protect_docs_and_metrics
        self.open_paths = PROBE_PATHS if protect else PROBE_PATHS | DOC_PATHS
        self.max_body = settings.max_body_bytes
        # File uploads have their own cap (the file, plus room for the multipart framing).
        self.max_upload = settings.batch_max_file_bytes + 1024 * 1024
        self.access_log = settings.access_log

    def _authorized(self, scope: Scope, keys: list[bytes] | None = None) -> bool:
        header = _header(scope, b"authorization") or b""
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer":
            token = b""
        token = token.strip()
        ok = False
        for key in self.keys if keys is None else keys:  # each in constant time
            ok |= hmac.compare_digest(token, key)
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        path: str = scope["path"]
        request_id = _request_id(scope)
        # This request's own copy of the lifespan state (uvicorn copies it per request; an
        # in-process ASGI client may share one dict, and the error family set on one request
        # must never reach the next)
        state: dict[str, Any] = dict(scope.get("state") or {})
        scope["state"] = state
        state["request_id"] = request_id
        status_box = [500]

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["response_started"] = True
                status_box[0] = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        prefix = bytearray()  # the body's first bytes: a shared path's dialect, for errors
        refusal = self._refuse(scope, path)
        if refusal is not None:
            reason, error = refusal
            self.metrics.rejected.labels(reason).inc()
            if path in SHARED_KEYS and scope["method"] == "POST":
                prefix += await _first_bytes(receive)
            family = family_from_prefix(path, bytes(prefix)) or family_of(path)
            await api_error_response(error, family)(scope, receive, send_with_id)
            self._record(scope, path, status_box[0], start)
            return

        counted = path not in PROBE_PATHS
        if counted:
            self.lifecycle.inflight += 1
            self.metrics.in_flight.inc()
        try:
            await self.app(scope, self._limited(receive, self._cap(path), prefix), send_with_id)
        except PayloadTooLarge as exc:  # a chunked body outgrew the limit mid-stream
            self.metrics.rejected.labels("too_large").inc()
            family = family_from_prefix(path, bytes(prefix)) or family_of(path)
            await api_error_response(exc, family)(scope, receive, send_with_id)
        except asyncio.CancelledError:
            # uvicorn cancels what is still running at the shutdown deadline: tell the client
            # to retry elsewhere (503) rather than leaving it a 500 or a dropped connection.
            if self.lifecycle.phase == "draining" and not state.get("response_started"):
                cut = ServiceUnavailable(
                    "The server shut down before this request finished; retry on another replica.",
                    code="shutdown",
                    headers={"Retry-After": "1", "Connection": "close"},
                )
                with contextlib.suppress(Exception):
                    await api_error_response(cut, family_of(path))(scope, receive, send_with_id)
            raise
        finally:
            if counted:
                self.lifecycle.inflight -= 1
                self.metrics.in_flight.dec()
            status = CLIENT_CLOSED if state.get("cancelled") else status_box[0]
            self._record(scope, path, status, start)

    def _refuse(self, scope: Scope, path: str) -> tuple[str, APIError] | None:
        if path == ADMIN_PREFIX or path.startswith(ADMIN_PREFIX + "/"):
            return self._refuse_admin(scope)
        page = path in PAGE_PATHS or path.startswith(DOC_ASSETS_PREFIX)
        open_page = page and scope["method"] in ("GET", "HEAD")
        if (
            self.keys
            and path not in self.open_paths
            and not open_page
            and not self._authorized(scope)
        ):
            return "unauthorized", Unauthorized(
                "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
                headers={"WWW-Authenticate": "Bearer"},
            )
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self._cap(path):
            return "too_large", self._too_large(self._cap(path))
        if self.lifecycle.phase == "draining" and path not in PROBE_PATHS:
            return "draining", ServiceUnavailable(
                self.lifecycle.unavailable_message(),
                code="draining",
                headers={"Retry-After": "1", "Connection": "close"},
            )
        return None

    def _refuse_admin(self, scope: Scope) -> tuple[str, APIError] | None:
        """The admin routes take the admin key alone; without one they do not exist."""
        if not self.admin_keys:
            return "not_found", NotFound(
                "Not Found (the admin routes are off: start the server with --admin-key)."
            )
        if not self._authorized(scope, self.admin_keys):
            return "unauthorized", Unauthorized(
                "Incorrect or missing admin key: send 'Authorization: Bearer <admin key>'.",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return None

    def _too_large(self, cap: int | None = None) -> PayloadTooLarge:
        return PayloadTooLarge(f"The request body is larger than {cap or self.max_body} bytes.")

    def _cap(self, path: str) -> int:
        return self.max_upload if path in UPLOAD_PATHS else self.max_body

    def _limited(self, receive: Receive, cap: int, prefix: bytearray) -> Receive:
        """`receive` that raises PayloadTooLarge past `cap` bytes, keeping the first PEEK
        bytes in `prefix`."""
        seen = 0

        async def wrapped() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                if len(prefix) < PEEK:
                    prefix.extend(chunk[: PEEK - len(prefix)])
                seen += len(chunk)
                if seen > cap:
                    raise self._too_large(cap)
            return message

        return wrapped

    def _record(self, scope: Scope, path: str, status: int, start: float) -> None:
        elapsed = time.perf_counter() - start
        state = scope["state"]
        route = self.route_label(path)
        model = state.get("model", "")
        m = self.metrics
        m.requests.labels(route, model, str(status)).inc()
        if status == 429:
            m.rejected.labels("overloaded").inc()
        m.latency.labels(route).observe(elapsed)
        if model and status == 200:
            m.inputs.labels(model, route).inc(state.get("inputs", 0))
            m.tokens.labels(model).inc(state.get("tokens", 0))
        if self.access_log and access_logger.isEnabledFor(logging.INFO):
            access_logger.info(
                "%s %s %s %.1fms",
                scope["method"],
                path,
                status,
                elapsed * 1000,
                extra={
                    "request_id": state.get("request_id"),
                    "method": scope["method"],
                    "route": route,
                    "model": model or None,
                    "inputs": state.get("inputs"),
                    "tokens": state.get("tokens"),
                    "status": status,
                    "latency_ms": round(elapsed * 1000, 2),
                },
            )


def fast_path_table(routes: Iterable[tuple[str, APIRoute]]) -> dict[str, Endpoint]:
    """path -> handler for every POST route, which the fast path calls with the Request alone.

    The fast path skips FastAPI's dependency injection, parameter parsing and response
    models: a POST handler that declares any of them would silently lose them, so building
    the app fails instead, naming the handler.
    """
    table: dict[str, Endpoint] = {}
    for path, route in routes:
        if route.methods != {"POST"} or "{" in path:
            continue
        dep = route.dependant
        declared = [
            *(d.call.__name__ if d.call else "?" for d in dep.dependencies),
            *(p.name for p in dep.path_params + dep.query_params + dep.header_params),
            *(p.name for p in dep.cookie_params + dep.body_params),
            *(["background_tasks"] if dep.background_tasks_param_name else []),
            *(["response"] if dep.response_param_name else []),
        ]
        if declared or route.dependencies:
            what = ", ".join(declared) or "router dependencies"
            raise RuntimeError(
                f"POST {path} ({route.endpoint.__qualname__}) declares {what}; fast-path "
                "handlers take only the Request (see openai_compat/api/request.py)"
            )
        table[path] = route.endpoint
    return table


class FastPathMiddleware:
    """Serves the POST routes straight from their handlers, skipping the framework's router,
    exception and exit-stack layers (a measurable share of a small request's CPU). The same
    handlers stay registered as normal routes for OpenAPI; errors render exactly as the app's
    handlers do, and anything unexpected propagates to the app's 500 handler.

    While a handler runs, the client's connection is watched: if it goes away, the handler is
    cancelled, which drops its queued engine work (infinity-emb skips cancelled items).
    """

    def __init__(self, app: ASGIApp, routes: Mapping[str, Endpoint], metrics: Metrics) -> None:
        self.app = app
        self.routes = dict(routes)
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = (
            self.routes.get(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST"
            else None
        )
        if endpoint is None:
            # Every other route (GETs too: TEI's /info, a model's card) holds the models it
            # uses for as long as it runs, as the POST routes do.
            with request_leases():
                await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        response: Response | None
        try:
            try:
                if scope["path"] in UPLOAD_PATHS:
                    # A file upload streams to disk as it arrives (batch/upload.py), never
                    # held whole in memory; its own reads of the body see a disconnect.
                    response = await endpoint(request)
                else:
                    # Read fully first: then receive() only reports a disconnect.
                    await request.body()
                    with request_leases():  # the models it uses stay loaded until it ends
                        response = await self._until_disconnect(endpoint, request)
            except ClientDisconnect:  # gone while uploading: nothing to answer
                response = None
        except APIError as exc:
            response = api_error_response(exc, family_for(scope))
        except RequestValidationError as exc:
            response = validation_error_response(exc, family_for(scope))
        if response is None:
            scope["state"]["cancelled"] = True
            self.metrics.cancelled.labels(scope["path"]).inc()
            return
        await response(scope, receive, send)

    @staticmethod
    async def _until_disconnect(endpoint: Endpoint, request: Request) -> Response | None:
        handler = asyncio.ensure_future(endpoint(request))
        watcher = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({handler, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            handler.cancel()
            raise
        finally:
            watcher.cancel()
        if handler.done():
            try:
                return handler.result()
            except asyncio.CancelledError as exc:
                raise_if_unloaded(exc)  # a forced unload took its model: 503
                raise
        handler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await handler
        return None


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
