"""A model's preparation thread (tokenizing, decoding media) with a fair queue in front.

One thread per model (a fast tokenizer is not safe to share between threads). Its jobs wait
per tenant (the caller's key; "" without keys) and the thread takes the next job of the
tenant that has had the least preparation work for its weight (inputs / weight, start-time
fair queuing as in scheduler.py): a key with 32 requests waiting to be tokenized does not put
another key's request behind all of them. One tenant alone: first come, first served.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections import deque
from collections.abc import Callable
from typing import Any


class FairPrep:
    def __init__(self, name: str) -> None:
        self._cond = threading.Condition()
        self._jobs: dict[
            str, deque[tuple[float, concurrent.futures.Future[Any], Callable[[], Any]]]
        ]
        self._jobs = {}
        self._finish: dict[str, float] = {}  # each tenant's last job's finish tag
        self._vtime = 0.0  # the start tag of the job running now
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=f"prepare-{name}", daemon=True)
        self._thread.start()

    def submit(
        self, tenant: str, weight: float, cost: int, fn: Callable[..., Any], *args: Any
    ) -> concurrent.futures.Future[Any]:
        """Run `fn(*args)` on the thread in fair order; `cost`: the job's inputs."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the preparation thread is stopped")
            start = max(self._vtime, self._finish.get(tenant, 0.0))
            self._finish[tenant] = start + max(1, cost) / max(weight, 1e-9)
            self._jobs.setdefault(tenant, deque()).append((start, future, lambda: fn(*args)))
            self._cond.notify()
        return future

    def _next(self) -> tuple[concurrent.futures.Future[Any], Callable[[], Any]] | None:
        with self._cond:
            while not self._closed and not self._jobs:
                self._cond.wait()
            if self._closed:
                return None
            tenant = min(self._jobs, key=lambda t: self._jobs[t][0][0])
            queue = self._jobs[tenant]
            start, future, job = queue.popleft()
            if not queue:
                del self._jobs[tenant]
            self._vtime = max(self._vtime, start)
            return future, job

    def _serve(self) -> None:
        while (taken := self._next()) is not None:
            future, job = taken
            if not future.set_running_or_notify_cancel():
                continue  # its caller went away
            try:
                future.set_result(job())
            except BaseException as exc:
                future.set_exception(exc)

    def shutdown(self) -> None:
        """Stop taking jobs; those still waiting are cancelled."""
        with self._cond:
            self._closed = True
            waiting = [f for q in self._jobs.values() for _, f, _ in q]
            self._jobs.clear()
            self._cond.notify_all()
        for future in waiting:
            future.cancel()
