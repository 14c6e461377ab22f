"""Pure ASGI middleware: the gateway in front of every route (the POST fast path: fastpath.py).

Gateway, per HTTP request: request id (honoured or made, echoed), the caller's key (who it is,
whether it may reach the path, its rate limits: tenants/), body size limit, refusal while
draining, in-flight accounting, metrics and one access-log line. Every decision reads the raw
ASGI path (`scope["path"]`), never a URL rebuilt from the Host header.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openai_compat.engine.priority import in_background
from openai_compat.frame.settings import Settings
from openai_compat.ground.errors import (
    APIError,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    Unauthorized,
    api_error_response,
)
from openai_compat.ground.families import SHARED_KEYS, family_from_prefix, family_of, printable
from openai_compat.ground.lifecycle import Lifecycle
from openai_compat.models.metrics import Metrics, RouteLabels
from openai_compat.tenants import RUN_AS, Tenants
from openai_compat.tenants.keys import Key
from openai_compat.tenants.limits import Caller
from openai_compat.tenants.limits import current as current_caller
from openai_compat.web.credentials import header as _header
from openai_compat.web.credentials import key_hint, presented_key

access_logger = logging.getLogger("openai_compat.access")

# Probes stay answerable while draining, need no key and are not counted as work.
PROBE_PATHS = frozenset({"/health", "/ready"})
METRICS_PATH = "/metrics"
DOC_PATHS = frozenset({METRICS_PATH, "/docs", "/redoc", "/openapi.json"})
# The playground's static page and assets, and GET / that links to it: they hold no data (the
# page asks for the key and sends it with its API calls), so a browser can always load them.
UPLOAD_PATHS = frozenset({"/v1/files", "/files"})
PAGE_PATHS = frozenset({"/", "/playground", "/playground/app.js", "/playground/app.css"})
# The docs pages' UI code (api/docs.py): public, holds no data.
DOC_ASSETS_PREFIX = "/docs/assets/"
ADMIN_PREFIX = "/admin"  # model load/unload (api/admin.py): the admin key or an admin key
BATCH_PREFIXES = ("/v1/files", "/files", "/v1/batches", "/batches")  # not for `batch = false`
# POSTs that spend no tokens: a batch's or a file's state (its owner can always follow it)
# and Ollama's metadata reads
FREE_POSTS = (*BATCH_PREFIXES, "/api/show", "/api/pull")
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
        tenants: Tenants | None = None,
    ) -> None:
        self.app = app
        self.lifecycle = lifecycle
        self.metrics = metrics
        self.known = known_paths
        self.route_label = RouteLabels(known_paths)
        self.tenants = tenants if tenants is not None else Tenants(settings.api_key)
        self.admin_keys = [settings.admin_key.encode()] if settings.admin_key else []
        protect = settings.protect_docs_and_metrics
        self.open_paths = PROBE_PATHS if protect else PROBE_PATHS | DOC_PATHS
        # With a keys file and no word either way, /metrics (its series name every key and
        # model, and its cache counters tell one key what another embedded) is an admin's
        self.admin_metrics = protect is None and settings.keys_file is not None
        if self.admin_metrics:
            self.open_paths = self.open_paths - {METRICS_PATH}
        self.max_body = settings.max_body_bytes
        # File uploads have their own cap (the file, plus room for the multipart framing).
        self.max_upload = settings.batch_max_file_bytes + 1024 * 1024
        self.access_log = settings.access_log

    def _admin_key(self, scope: Scope) -> bool:
        token = presented_key(scope)
        ok = False
        for key in self.admin_keys:  # each in constant time
            ok |= hmac.compare_digest(token, key)
        return ok

    def _identify(self, scope: Scope) -> Key | None:
        """The key the request presents: one of the ring's, or (a Batch API line of this
        process, its secret as the token) the batch owner's key as it is now."""
        token = presented_key(scope)
        tenants = self.tenants
        if hmac.compare_digest(token, tenants.internal):
            owner = _header(scope, RUN_AS)
            return tenants.by_owner(owner.decode("latin-1")) if owner is not None else None
        return tenants.ring.find(token)

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
        key_box: list[Key | None] = [None]
        refusal = self._refuse(scope, path, key_box)
        key = key_box[0]
        if key is not None:
            state["key"] = key.name
        # a Batch API line (run in-process as its owner) waits for its owner's rate
        background = key is not None and in_background()
        if refusal is None and key is not None:
            try:
                if background:
                    await self.tenants.limiter.admit_waiting(key)
                else:
                    spends = scope["method"] == "POST" and not _under(path, FREE_POSTS)
                    self.tenants.limiter.admit(key, spends_tokens=spends)
            except APIError as exc:
                refusal = "rate_limited", exc
            if refusal is not None and key.limited:
                assert refusal[1].headers is not None
                for name, value in self.tenants.limiter.headers(key):
                    refusal[1].headers[name.decode()] = value.decode()
        if refusal is not None:
            reason, error = refusal
            self.metrics.rejected.labels(reason).inc()
            state["refused"] = reason
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
        caller = Caller(key, self.tenants.limiter, background=background) if key else None
        entered = current_caller.set(caller)
        if key is not None and key.limited:
            limiter = self.tenants.limiter
            inner_send = send_with_id

            async def send_with_id(message: Message) -> None:
                if message["type"] == "http.response.start":
                    headers = [*message.get("headers", []), *limiter.headers(key)]
                    message = {**message, "headers": headers}
                await inner_send(message)

        try:
            await self.app(scope, self._limited(receive, self._cap(path), prefix), send_with_id)
        except PayloadTooLarge as exc:  # a chunked body outgrew the limit mid-stream
            self.metrics.rejected.labels("too_large").inc()
            family = family_from_prefix(path, bytes(prefix)) or family_of(path)
            await api_error_response(exc, family)(scope, receive, send_with_id)
        except asyncio.CancelledError:
            # uvicorn cancels what still runs at the shutdown deadline: a 503 (retry elsewhere)
            if self.lifecycle.phase != "draining":
                raise
            if not state.get("response_started"):
                cut = ServiceUnavailable(
                    "The server shut down before this request finished; retry on another replica.",
                    code="shutdown",
                    headers={"Retry-After": "1", "Connection": "close"},
                )
                with contextlib.suppress(Exception):
                    await api_error_response(cut, family_of(path))(scope, receive, send_with_id)
            # answered, not re-raised: a traceback would say no more than the warning and log
        finally:
            current_caller.reset(entered)
            if counted:
                self.lifecycle.inflight -= 1
                self.metrics.in_flight.dec()
            status = CLIENT_CLOSED if state.get("cancelled") else status_box[0]
            if caller is not None:
                self._settle(caller, state, status)
            self._record(scope, path, status, start)

    def _settle(self, caller: Caller, state: dict[str, Any], status: int) -> None:
        """The request is over: its place in flight back, its tokens settled: those not
        taken before the model ran charged, a provisional reservation larger than what the
        model ran given back, and a request refused after its reservation (a full queue's
        429) charged nothing."""
        limiter = caller.limiter
        limiter.release(caller.key)
        if status == 200:
            rest = int(state.get("tokens", 0) or 0) - caller.reserved_tokens
            if rest >= 0:
                limiter.charge(caller.key, rest)
            else:
                limiter.refund(caller.key, -rest)
        elif status == 429:
            limiter.refund(caller.key, caller.reserved_tokens)

    def _refuse(
        self, scope: Scope, path: str, key_box: list[Key | None]
    ) -> tuple[str, APIError] | None:
        if path == ADMIN_PREFIX or path.startswith(ADMIN_PREFIX + "/"):
            return self._refuse_admin(scope, key_box)
        if path == METRICS_PATH and self.admin_metrics:
            return self._refuse_non_admin(scope, key_box)
        page = path in PAGE_PATHS or path.startswith(DOC_ASSETS_PREFIX)
        open_page = page and scope["method"] in ("GET", "HEAD")
        if self.tenants.enabled and path not in self.open_paths and not open_page:
            key = self._identify(scope)
            if key is None:
                return "unauthorized", Unauthorized(
                    f"Incorrect or missing API key: send {key_hint(path)}.",
                    headers={"WWW-Authenticate": "Bearer"},
                )
            if key.expired(self.tenants.now()):
                return "unauthorized", Unauthorized(
                    "This API key has expired.",
                    code="expired_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
            key_box[0] = key
            if not key.batch and _under(path, BATCH_PREFIXES):
                return "forbidden", Forbidden(
                    f"Key {key.name!r} may not use the Files and Batch APIs."
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

    def _refuse_admin(self, scope: Scope, key_box: list[Key | None]) -> tuple[str, APIError] | None:
        """The admin routes take the admin key, or a keys-file key with `admin = true`;
        with neither configured they do not exist."""
        admins = any(k.admin for k in self.tenants.ring.keys)
        if not self.admin_keys and not admins:
            return "not_found", NotFound(
                "Not Found (the admin routes are off: start the server with --admin-key, or "
                "give a key admin = true in the keys file)."
            )
        if self._admin_key(scope):
            return None
        key = self._identify(scope) if admins else None
        if key is not None and key.admin and not key.expired(self.tenants.now()):
            key_box[0] = key
            return None
        return "unauthorized", Unauthorized(
            "Incorrect or missing admin key: send 'Authorization: Bearer <admin key>'.",
            headers={"WWW-Authenticate": "Bearer"},
        )

    def _refuse_non_admin(
        self, scope: Scope, key_box: list[Key | None]
    ) -> tuple[str, APIError] | None:
        """/metrics under a keys file: the admin key, or a keys-file key with admin = true."""
        refusal = self._refuse_admin(scope, key_box)
        if refusal is None or (refusal[0] == "unauthorized" and self._identify(scope) is None):
            return refusal
        return "forbidden", Forbidden(
            "With a keys file /metrics is an admin's (--admin-key, or a key with admin = true; "
            "--no-protect-docs-and-metrics opens it): its series name every key and model."
        )

    def _too_large(self, cap: int) -> PayloadTooLarge:
        upload = cap != self.max_body
        return PayloadTooLarge.body(cap, "--batch-max-file-bytes" if upload else "--max-body-bytes")

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
        if status == 429 and "refused" not in state:  # a full queue (the gateway's own counted)
            m.rejected.labels("overloaded").inc()
        m.latency.labels(route).observe(elapsed)
        if model and status == 200:
            m.inputs.labels(model, route).inc(state.get("inputs", 0))
            m.tokens.labels(model).inc(state.get("tokens", 0))
        key = state.get("key")
        if key is not None:  # a keys-file name, or "api-key": bounded
            m.key_requests.labels(key, str(status)).inc()
            if status == 200:
                m.key_inputs.labels(key).inc(state.get("inputs", 0) or 0)
                m.key_tokens.labels(key).inc(state.get("tokens", 0) or 0)
        if self.access_log and access_logger.isEnabledFor(logging.INFO):
            access_logger.info(
                "%s %s %s %.1fms",
                scope["method"],
                printable(path),
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
                    "key": key,
                    "latency_ms": round(elapsed * 1000, 2),
                },
            )


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in prefixes)
