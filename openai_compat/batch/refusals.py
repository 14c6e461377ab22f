"""Batch lines the server refuses for now (429 overloaded, 503 unavailable): how long a batch
waits between tries, when it hands the runner to the other open batches, and when lines
refused with 503 stop being retried and fail with the answer they kept getting (a model that
cannot load). The runner (runner.py) asks; this module only keeps time per batch.
"""

from __future__ import annotations

import time

RETRY_PAUSE = 0.2  # seconds before refused lines are sent again, doubling to MAX_RETRY_PAUSE
MAX_RETRY_PAUSE = 5.0
# A wave refused this long hands the runner to the other open batches; it is taken up again
# after its back-off.
DEFER_AFTER_S = 2.0
# Lines refused with 503 for this long fail with their last answer (429s wait for room until
# the batch expires or is cancelled: overload passes, a broken model may not).
GIVE_UP_503_S = 300.0


class Refusals:
    """Per batch: since when its lines have been refused, and its back-off."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}
        self._not_before: dict[str, tuple[float, float]] = {}  # batch -> (time, pause)

    def since(self, batch_id: str) -> float:
        """When this batch's refusals began: kept across waves until lines get through."""
        return self._since.setdefault(batch_id, time.monotonic())

    def over(self, batch_id: str) -> None:
        """Its lines went through: the refusals (if any) are over."""
        self._since.pop(batch_id, None)
        self._not_before.pop(batch_id, None)

    def defer(self, batch_id: str) -> None:
        """Back off a batch whose lines keep being refused: 0.2 s doubling to 5 s."""
        _, pause = self._not_before.get(batch_id, (0.0, RETRY_PAUSE / 2))
        pause = min(pause * 2, MAX_RETRY_PAUSE)
        self._not_before[batch_id] = (time.monotonic() + pause, pause)

    def deferred(self, batch_id: str) -> bool:
        """Whether the batch is still in its back-off."""
        entry = self._not_before.get(batch_id)
        return entry is not None and time.monotonic() < entry[0]

    def idle_wait(self) -> float:
        """Seconds the runner sleeps without news: 1, or until the next deferred batch."""
        now = time.monotonic()
        soonest = min((t for t, _ in self._not_before.values()), default=now + 1.0)
        return min(1.0, max(soonest - now, 0.01))
