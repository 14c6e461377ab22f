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
from dataclasses import dataclass
from typing import Any


@dataclass(eq=False)
class _Job:
    start: float  # its fair-queuing start tag
    share: float  # its cost / its tenant's weight
    future: concurrent.futures.Future[Any]
    run: Callable[[], Any]


class FairPrep:
    def __init__(self, name: str) -> None:
        self._cond = threading.Condition()
        self._jobs: dict[str, deque[_Job]] = {}
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
            share = max(1, cost) / max(weight, 1e-9)
            self._finish[tenant] = start + share
            job = _Job(start, share, future, lambda: fn(*args))
            self._jobs.setdefault(tenant, deque()).append(job)
            self._cond.notify()

        def withdraw(done: concurrent.futures.Future[Any]) -> None:
            if done.cancelled():
                self._withdraw(tenant, job)

        future.add_done_callback(withdraw)
        return future

    def _withdraw(self, tenant: str, job: _Job) -> None:
        """A job cancelled while it waited (its caller went away): it leaves the queue, and
        its tenant's later jobs and finish tag move back by its share (not charged)."""
        with self._cond:
            queue = self._jobs.get(tenant)
            if queue is None or job not in queue:
                return  # taken already
            queue.remove(job)
            for later in queue:
                if later.start > job.start:
                    later.start = max(self._vtime, later.start - job.share)
            if not queue:
                del self._jobs[tenant]
            if tenant in self._finish:
                self._finish[tenant] = max(self._vtime, self._finish[tenant] - job.share)

    def _next(self) -> tuple[concurrent.futures.Future[Any], Callable[[], Any]] | None:
        with self._cond:
            while not self._closed and not self._jobs:
                self._cond.wait()
            if self._closed:
                return None
            tenant = min(self._jobs, key=lambda t: self._jobs[t][0].start)
            queue = self._jobs[tenant]
            job = queue.popleft()
            if not queue:
                del self._jobs[tenant]
            self._vtime = max(self._vtime, job.start)
            return job.future, job.run

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
            waiting = [job.future for q in self._jobs.values() for job in q]
            self._jobs.clear()
            self._cond.notify_all()
        for future in waiting:
            future.cancel()
