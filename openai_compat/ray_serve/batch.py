"""The Files and Batch APIs on Ray Serve: one home for their state.

A batch job's files and its SQLite state live in one data dir, so one deployment holds them:
`BatchServer`, one replica, placed by its `[ray_batch]` resources (the head node by default,
where the data dir is a persistent path: a volume on Kubernetes). It runs our whole app on
the same remote model entries as the ingress, with the Batch API's runner on: each line goes
through the app to a model deployment with the background flag, so the model replica's
feeder runs it after live requests (engine/infinity/feeder.py), exactly as on one machine.

The ingress forwards every /v1/files and /v1/batches request to it as a stream
(`forward`): the request's body in chunks (`BatchServer.body`, each awaited: a bounded
queue holds the upload back), the answer's ASGI messages back through a streaming
DeploymentHandle call (`BatchServer.request`). Neither side holds a whole upload or
download. The client going away cancels the call, which stops the request on the
BatchServer; a body that stops arriving for BODY_IDLE_S reads as a disconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from openai_compat.ground.errors import ServiceUnavailable, api_error_response
from openai_compat.ground.families import family_of
from openai_compat.ray_serve.remote import remote_app

logger = logging.getLogger("openai_compat")

BATCH_PATHS = ("/v1/files", "/v1/batches", "/files", "/batches")
BODY_IDLE_S = 60.0  # an upload whose next chunk takes longer is dropped as disconnected
BODY_QUEUE = 8  # body chunks held per request (ASGI servers send up to 64 KiB each)
SCOPE_KEYS = ("http_version", "method", "scheme", "path", "raw_path", "query_string")


@dataclass
class _Forwarded:
    body: asyncio.Queue[dict[str, Any]] = field(
        default_factory=lambda: asyncio.Queue(maxsize=BODY_QUEUE)
    )
    complete: bool = False  # the whole body arrived
    gone: asyncio.Event = field(default_factory=asyncio.Event)  # the caller went away


def plain_scope(scope: dict[str, Any]) -> dict[str, Any]:
    """What of an ASGI HTTP scope crosses to another process (no app, router or state)."""
    out = {key: scope[key] for key in SCOPE_KEYS if key in scope}
    out["headers"] = [(bytes(k), bytes(v)) for k, v in scope.get("headers", [])]
    out["client"] = tuple(scope["client"]) if scope.get("client") else None
    out["server"] = tuple(scope["server"]) if scope.get("server") else None
    return out


class BatchServer:
    """The Batch and Files APIs (with their runner) on one replica; see the module text."""

    async def __init__(  # type: ignore[misc]
        self, settings: Any, names: list[str], *handles: Any
    ) -> None:
        self.app, self.export = await remote_app(settings, names, handles, batch_runner=True)
        self.calls: dict[str, _Forwarded] = {}
        self.finished: OrderedDict[str, None] = OrderedDict()  # ids answered lately
        self.lifespan = self.app.router.lifespan_context(self.app)
        await self.lifespan.__aenter__()  # starts the runner: open jobs resume
        logger.info("batch server ready; data dir %s", settings.data())

    def _call(self, rid: str) -> _Forwarded | None:
        if rid in self.finished:
            return None
        return self.calls.setdefault(rid, _Forwarded())

    async def body(self, rid: str, message: dict[str, Any]) -> bool:
        """One ASGI receive message of request `rid` (http.request or http.disconnect);
        False once the request has been answered (the rest of its body is not needed)."""
        call = self._call(rid)
        if call is None:
            return False
        if message["type"] == "http.disconnect":
            call.gone.set()
            return True
        try:
            async with asyncio.timeout(BODY_IDLE_S):
                await call.body.put(message)
        except TimeoutError:
            call.gone.set()
            return False
        return True

    async def request(self, rid: str, scope: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Runs the app on `scope`, its body from `body(rid, ...)`; yields its ASGI send
        messages (a streaming call)."""
        call = self._call(rid)
        assert call is not None, "request id reused"
        scope = {"type": "http", "asgi": {"version": "3.0"}, "root_path": "", "state": {}} | scope
        sent: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=BODY_QUEUE)

        async def receive() -> dict[str, Any]:
            if call.complete:  # a streaming answer listens for the client going away
                await call.gone.wait()
                return {"type": "http.disconnect"}
            getting = asyncio.ensure_future(call.body.get())
            gone = asyncio.ensure_future(call.gone.wait())
            try:
                done, _ = await asyncio.wait(
                    {getting, gone}, timeout=BODY_IDLE_S, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                gone.cancel()
            if getting not in done:
                getting.cancel()
                return {"type": "http.disconnect"}
            message = getting.result()
            call.complete = not message.get("more_body", False)
            return message

        async def send(message: MutableMapping[str, Any]) -> None:
            await sent.put(dict(message))  # held back while the caller does not read

        task = asyncio.create_task(self.app(scope, receive, send))
        try:
            while True:
                getting = asyncio.ensure_future(sent.get())
                await asyncio.wait({getting, task}, return_when=asyncio.FIRST_COMPLETED)
                if not getting.done():  # the app returned: what it sent is in the queue
                    getting.cancel()
                    while not sent.empty():
                        yield sent.get_nowait()
                    break
                message = getting.result()
                yield message
                if message["type"] == "http.response.body" and not message.get("more_body"):
                    break
            try:
                await task
            except Exception:  # answered already (a 500 in the route's format): logged only
                logger.exception("batch request %s failed", scope.get("path"))
        finally:
            call.gone.set()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self.calls.pop(rid, None)
            self.finished[rid] = None
            while len(self.finished) > 4096:
                self.finished.popitem(last=False)

    async def __del__(self) -> None:
        await self.lifespan.__aexit__(None, None, None)  # the runner stops; jobs resume later
        await self.export.stop()


async def forward(handle: Any, scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ingress's side: one Files/Batch API request, streamed to the BatchServer."""
    rid = uuid.uuid4().hex

    async def pump() -> None:
        while True:
            message = await receive()
            if not await handle.body.remote(rid, message):
                return
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                return

    pumping = asyncio.create_task(pump())
    started = finished = False
    answer: Any = None
    try:
        answer = handle.options(stream=True).request.remote(rid, plain_scope(scope))
        async for message in answer:
            started = True
            await send(message)
        finished = True
    except Exception as exc:
        if started:
            raise
        error = ServiceUnavailable(
            f"The Batch API's server is unavailable ({type(exc).__name__}); retry shortly.",
            code="batch_server_unavailable",
            headers={"Retry-After": "1"},
        )
        logger.warning("batch request %s failed: %r", scope.get("path"), exc)
        await api_error_response(error, family_of(scope["path"]))(scope, receive, send)
    finally:
        if not finished and answer is not None and hasattr(answer, "cancel"):
            answer.cancel()  # the client went away: stop the request on the batch server
        if not pumping.done():
            pumping.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pumping


def with_batch_api(app: Any, handle: Any) -> Any:
    """The ingress app, its Files and Batch API requests forwarded to the BatchServer."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("path", "").startswith(BATCH_PATHS):
            await forward(handle, scope, receive, send)
            return
        await app(scope, receive, send)

    return wrapped
