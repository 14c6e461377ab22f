"""The metrics listener (`--metrics-port`): /metrics on a port of its own, open, and nothing else.

With a keys file, /metrics on the API port needs an admin's key (its series name every key and
model). A platform's scraper (Prometheus, an autoscaler on `openai_compat_queued_inputs`)
should hold no credential that can do anything else, so it is given this port instead: the
same registry, no key, reachable only where the platform lets it (a Kubernetes NetworkPolicy,
a port the Service does not expose). The server listens on it beside the API port (one
uvicorn, one event loop); a request is told apart by the socket it came in on (the ASGI
scope's `server`), before any of the API's middleware: GET or HEAD /metrics is answered in
Prometheus' text format, any other path 404, any other method 405, never an API route.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Receive, Scope, Send

from openai_compat.models.metrics import Metrics

PATH = "/metrics"


class MetricsListener:
    """Outermost ASGI layer: requests on `port` get the metrics alone."""

    def __init__(self, app: ASGIApp, *, port: int, metrics: Metrics) -> None:
        self.app = app
        self.port = port
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server") if scope["type"] == "http" else None
        if server is None or server[1] != self.port:
            await self.app(scope, receive, send)
            return
        if scope["path"] != PATH:
            await _answer(send, 404, b"Only /metrics is served on this port.\n")
        elif scope["method"] not in ("GET", "HEAD"):
            await _answer(send, 405, b"GET /metrics.\n", allow=b"GET, HEAD")
        else:
            body = self.metrics.render()
            await _answer(send, 200, body, CONTENT_TYPE_LATEST.encode(), head=scope["method"])


async def _answer(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes = b"text/plain; charset=utf-8",
    *,
    allow: bytes | None = None,
    head: str = "GET",
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if allow is not None:
        headers.append((b"allow", allow))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head == "HEAD" else body})
