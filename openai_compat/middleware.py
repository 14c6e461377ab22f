"""Pure ASGI middleware around every route: in-flight accounting and refusal while draining."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from openai_compat.errors import ServiceUnavailable, api_error_response
from openai_compat.lifecycle import Lifecycle

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
