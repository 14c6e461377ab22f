"""Pure ASGI middleware around every route: in-flight accounting and refusal while draining."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from openai_compat.errors import (
    APIError,
    ServiceUnavailable,
    api_error_response,
    validation_error_response,
)
from openai_compat.lifecycle import Lifecycle

Endpoint = Callable[[Request], Awaitable[Response]]

# Probes and scrapes stay answerable while draining and are not counted as work.
PROBE_PATHS = frozenset({"/health", "/ready", "/metrics"})


class DrainMiddleware:
    """Counts requests in flight; once draining, refuses new work with 503 at once."""

    def __init__(self, app: ASGIApp, lifecycle: Lifecycle) -> None:
        self.app = app
        self.lifecycle = lifecycle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PROBE_PATHS:
            await self.app(scope, receive, send)
            return
        lifecycle = self.lifecycle
        if lifecycle.phase == "draining":
            response = api_error_response(
                ServiceUnavailable(
                    lifecycle.unavailable_message(),
                    code="draining",
                    headers={"Retry-After": "1", "Connection": "close"},
                )
            )
            await response(scope, receive, send)
            return
        lifecycle.inflight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            lifecycle.inflight -= 1


class FastPathMiddleware:
    """Serves the hottest POST routes straight from their handlers, skipping the framework's
    router, exception and exit-stack layers (a measurable share of a small request's CPU).
    The same handlers stay registered as normal routes for OpenAPI; errors render exactly as
    the app's handlers do, and anything unexpected propagates to the app's 500 handler."""

    def __init__(self, app: ASGIApp, routes: Mapping[str, Endpoint]) -> None:
        self.app = app
        self.routes = dict(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = (
            self.routes.get(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST"
            else None
        )
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await endpoint(request)
        except APIError as exc:
            response = api_error_response(exc)
        except RequestValidationError as exc:
            response = validation_error_response(exc)
        await response(scope, receive, send)
