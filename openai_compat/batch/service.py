"""The Files and Batch APIs' state and worker, as the app holds them (app.state.batches)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import httpx

from openai_compat.batch.lines import split_line
from openai_compat.batch.runner import Gate, Runner
from openai_compat.batch.store import Store, StoreBusy, new_id
from openai_compat.engine.priority import background
from openai_compat.frame.settings import Settings
from openai_compat.ground.errors import RateLimited, ServiceUnavailable
from openai_compat.ground.lifecycle import Lifecycle
from openai_compat.models.registry import Registry
from openai_compat.tenants import RUN_AS, Tenants, batch_owner

logger = logging.getLogger("openai_compat.batch")

# The runner's supervisor: back-off between restarts after a crash, and between tries of a
# data dir another process holds.
RESTART_MIN_S = 1.0
RESTART_MAX_S = 30.0
STORE_RETRY_S = 5.0
# Uploads streamed to disk at once; more get 429 (each holds a file open and a disk stream).
MAX_UPLOADS = 4


class BatchService:
    def __init__(
        self, settings: Settings, lifecycle: Lifecycle, tenants: Tenants | None = None
    ) -> None:
        self.settings = settings
        self.lifecycle = lifecycle
        self.tenants = tenants if tenants is not None else Tenants(settings.api_key)
        self._store: Store | None = None
        self._store_lock = threading.Lock()
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._registry: Registry | None = None
        self._uploads = 0
        # idle (no jobs yet) | running | restarting (after a crash) | waiting_for_data_dir
        self.runner_state = "idle"
        self.runner_error: str | None = None
        self.runner_restarts = 0
        self.runner = Runner(
            self._lazy_store,
            self._dispatch,
            Gate(live=self._live, stopping=self._stopping),
            settings.batch_max_requests,
            admission=settings.max_queued_inputs,
            served=self._served,
            max_bytes=settings.max_body_bytes,
        )

    def _lazy_store(self) -> Store:
        """Opened on first use (a server that never sees the Batch API creates nothing).
        Under a lock: a route's thread and the runner may both open it first, and a second
        Store in this process would find the data dir's lock taken (StoreBusy)."""
        with self._store_lock:
            return self._open_store()

    def _open_store(self) -> Store:
        if self._store is None:
            try:
                self._store = Store(
                    self.settings.data(),
                    max_bytes=self.settings.batch_max_data_bytes,
                    min_free=self.settings.batch_min_free_bytes,
                    holder=f"pid {os.getpid()}, port {self.settings.port}",
                )
            except StoreBusy as exc:
                raise ServiceUnavailable(str(exc), code="data_dir_in_use") from exc
        return self._store

    @property
    def store(self) -> Store:
        return self._lazy_store()

    def existing_store(self) -> Store | None:
        """The store if the Batch API was ever used here (reads create nothing)."""
        if self._store is None and not (self.settings.data() / "batch.sqlite3").exists():
            return None
        return self._lazy_store()

    def _live(self) -> int:
        """Live requests in the engines' hands (a slow upload or download is not engine work
        and does not hold the job back)."""
        if self._registry is None:
            return 0
        return sum(entry.inflight for entry in self._registry.entries())

    def _served(self) -> frozenset[str]:
        return frozenset(self._registry.all_names()) if self._registry else frozenset()

    def _stopping(self) -> bool:
        return self.lifecycle.phase in ("draining", "failed")

    def start(self, app: Any) -> None:
        """Serve open batches (resuming any a previous process left) once models are ready."""
        # httpx logs every request at INFO: a line per batch row, beside our access log
        logging.getLogger("httpx").setLevel(logging.WARNING)
        self._registry = app.state.registry
        # big lines are split where big live bodies are parsed: the app's body workers
        bodies = app.state.bodies
        self.runner.off_loop = bodies.run
        self.runner.big = partial(bodies.call, split_line, encode_body=False)
        self._client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
            base_url="http://batch.internal",
            timeout=self.settings.batch_line_timeout,
        )
        self._task = asyncio.create_task(self._serve(), name="batch-runner")

    async def _serve(self) -> None:
        """The runner, supervised: a crash is logged and the runner restarted after a back-off
        (1 s doubling to 30 s); a data dir held by another process is retried until free."""
        while self.lifecycle.phase == "loading":  # noqa: ASYNC110 (a phase, not an event)
            await asyncio.sleep(0.1)
        if self.lifecycle.phase != "ready":
            return
        backoff = RESTART_MIN_S
        while not self._stopping():
            try:
                if not await self._wait_for_store():
                    return
                self.runner_state, self.runner_error = "running", None
                await self.runner.serve()
                return  # it returns only once the server stops
            except Exception as exc:
                logger.exception("batch runner crashed; restarting in %.0fs", backoff)
                self.runner_state = "restarting"
                self.runner_error = f"{type(exc).__name__}: {exc}"
                self.runner_restarts += 1
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RESTART_MAX_S)

    async def _wait_for_store(self) -> bool:
        """Until the store is open (False if the server stops first). Jobs exist once the
        database does (made by the API's first use, or left by an earlier process, whose
        open jobs are resumed)."""
        database = self.settings.data() / "batch.sqlite3"
        while not self._stopping():
            if self._store is not None:
                return True
            if await asyncio.to_thread(database.exists):
                try:
                    await asyncio.to_thread(self._lazy_store)
                    return True
                except ServiceUnavailable as exc:
                    if self.runner_state != "waiting_for_data_dir":
                        logger.error("batch jobs wait: %s", exc.message)
                    self.runner_state, self.runner_error = "waiting_for_data_dir", exc.message
                    await asyncio.sleep(STORE_RETRY_S)
                    continue
            await asyncio.sleep(1.0)
        return False

    def runner_status(self) -> dict[str, Any]:
        """For /ready: whether batch jobs are being run, and the last failure if not."""
        status: dict[str, Any] = {
            "state": self.runner_state,
            "restarts": self.runner_restarts,
            "pending_other_models": len(self.runner.pending.waiting),
        }
        if self.runner_error is not None:
            status["error"] = self.runner_error
        return status

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._client is not None:
            await self._client.aclose()
        if self._store is not None:
            self._store.close()

    async def _dispatch(self, url: str, body: bytes) -> tuple[int, bytes, str]:
        assert self._client is not None
        # its engine calls wait for live ones and have their own admission budget
        # httpx's own timeout never fires through ASGITransport: the line's is enforced here
        headers = {"Content-Type": "application/json"}
        if self.tenants.enabled:
            # as the batch's owner: its key as it is now (scope, limits; tenants/)
            headers["Authorization"] = "Bearer " + self.tenants.internal.decode()
            headers[RUN_AS.decode()] = batch_owner.get()
        async with asyncio.timeout(self.settings.batch_line_timeout):
            with background():
                resp = await self._client.post(url, content=body, headers=headers)
        return resp.status_code, resp.content, resp.headers.get("x-request-id", "")

    @contextlib.asynccontextmanager
    async def upload_slot(self) -> AsyncIterator[None]:
        """One of MAX_UPLOADS upload slots, or 429 at once when all are taken."""
        if self._uploads >= MAX_UPLOADS:
            raise RateLimited(
                f"{MAX_UPLOADS} uploads are in progress; retry shortly.",
                headers={"Retry-After": "1"},
            )
        self._uploads += 1
        try:
            yield
        finally:
            self._uploads -= 1

    def submit(self, owner: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a new batch (from batch_object) of `owner` and wake the runner for it."""
        self.store.add_batch(obj, owner, self._served())
        self.runner.wake.set()
        return obj


def batch_object(
    *,
    input_file_id: str,
    endpoint: str,
    completion_window: str,
    metadata: dict[str, str] | None,
    now: int,
    expires: bool = True,
) -> dict[str, Any]:
    """A new batch as OpenAI's Batch API shows it, validating (the runner takes it on).
    `expires`: false for the CLI's local jobs, which have no completion window."""
    return {
        "id": new_id("batch_"),
        "object": "batch",
        "endpoint": endpoint,
        "errors": None,
        "input_file_id": input_file_id,
        "completion_window": completion_window,
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "in_progress_at": None,
        "expires_at": now + 24 * 3600 if expires else None,
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": metadata,
    }
