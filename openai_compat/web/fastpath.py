"""The POST fast path: every POST route's handler called with the Request alone, past
FastAPI's dependency injection and response models (none of our POST handlers uses them),
inside the gateway (middleware.py) and around a disconnect watch: a client that goes away
cancels its handler, and its queued work with it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Mapping

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from openai_compat.ground.errors import (
    APIError,
    api_error_response,
    family_for,
    validation_error_response,
)
from openai_compat.models.metrics import Metrics
from openai_compat.models.slots import raise_if_unloaded, request_leases
from openai_compat.web.middleware import UPLOAD_PATHS

Endpoint = Callable[[Request], Awaitable[Response]]


def fast_path_table(routes: Iterable[tuple[str, APIRoute]]) -> dict[str, Endpoint]:
    """path -> handler for every POST route, which the fast path calls with the Request alone
    (a path template's handler reads its parameters from `request.path_params`).

    The fast path skips FastAPI's dependency injection, parameter parsing and response
    models: a POST handler that declares any of them would silently lose them, so building
    the app fails instead, naming the handler. A template whose handler declares its path
    parameters (the Batch API's ids) is left to the router.
    """
    table: dict[str, Endpoint] = {}
    for path, route in routes:
        dep = route.dependant
        if route.methods != {"POST"} or ("{" in path and dep.path_params):
            continue
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
        self.routes = {path: e for path, e in routes.items() if "{" not in path}
        self.templates = [(compile_path(path)[0], e) for path, e in routes.items() if "{" in path]
        self.metrics = metrics

    def _endpoint(self, scope: Scope) -> Endpoint | None:
        """The POST handler for the path, its template's parameters put in the scope."""
        if scope["type"] != "http" or scope["method"] != "POST":
            return None
        path = scope["path"]
        endpoint = self.routes.get(path)
        if endpoint is not None:
            return endpoint
        for pattern, endpoint in self.templates:  # Azure's deployments, Gemini's models
            match = pattern.match(path)
            if match:
                scope["path_params"] = match.groupdict()
                return endpoint
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self._endpoint(scope)
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
