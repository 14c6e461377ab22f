"""How many threads the forward pass runs on, chosen by measuring, not fixed at start.

The CPUs a process may use (cpus.py) are not the CPUs it gets: in a pod beside noisy
neighbours, or with another process busy on one core, an OpenMP team sized to every CPU
waits at each barrier for the thread whose core is taken, and loses most of its time
(measured on 2 vCPUs, MiniLM, a busy loop on CPU 1: sentence-transformers' own encode does 70
sentences/s on 2 threads, 250 on one; quiet, 2 threads are 1.6x one). No count fixed at
start serves both, so the forward thread keeps measuring:

- it runs on the chosen count, recording the padded tokens per second of each batch;
- when each of the last `trial` batches ran under `drop` x the rate the count was chosen at
  (a neighbour arrived), and, while a smaller count than the largest is chosen, every
  `explore_every` batches (has the neighbour left?), it runs `trial` batches on each
  candidate count back to back, the chosen one included, and keeps the fastest (ties to the
  larger count). While the largest count is chosen and keeps its rate nothing is explored:
  an exploration's batches on fewer threads were a lone client's slowest (3 in every 54 on
  one thread of two: its p99, measured 2026-12-06, docs/benchmarks.md's one-client);
- candidates: every count from the CPUs available down to 1 for up to 4 CPUs, else that,
  its half and 1. With one CPU there is nothing to choose and nothing is measured.

Exploring costs little: `trial` batches in `explore_every` run on a slower count at worst,
and only while a neighbour is (or was lately) there.
Only the forward thread calls it (no lock); the clock is injectable for tests.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

EXPLORE_EVERY = 48  # batches between explorations
TRIAL = 3  # batches per candidate in one exploration
DROP = 0.6  # explore at once when the rate falls under this fraction of the chosen one's


def candidates(available: int) -> tuple[int, ...]:
    """The thread counts worth trying on `available` CPUs, largest first."""
    if available <= 4:
        return tuple(range(available, 0, -1))
    return tuple(sorted({available, available // 2, 1}, reverse=True))


@dataclass
class ThreadTuner:
    """Which thread count the next batch runs on; told how each batch went."""

    available: int
    explore_every: int = EXPLORE_EVERY
    trial: int = TRIAL
    drop: float = DROP
    clock: Callable[[], float] = time.perf_counter
    chosen: int = 0
    chosen_rate: float = 0.0
    explorations: int = 0
    _plan: list[int] = field(default_factory=list)  # counts still to try in this exploration
    _trials: dict[int, list[float]] = field(default_factory=dict)  # count -> [tokens, seconds]
    _since: int = 0  # batches since the last exploration
    # the last `trial` batches on the chosen count: their rates (tokens per second)
    _recent: deque[float] = field(default_factory=deque)
    _started: float = 0.0
    _running: int = 0

    def __post_init__(self) -> None:
        self.options = candidates(max(1, self.available))
        self.chosen = self.options[0]

    @property
    def active(self) -> bool:
        return len(self.options) > 1

    def start(self) -> int:
        """The thread count for the batch about to run (call `done` after it)."""
        if self.active and not self._plan and self._due():
            self._plan = [c for c in self.options for _ in range(self.trial)]
            self._trials = {c: [0.0, 0.0] for c in self.options}
        self._running = self._plan[0] if self._plan else self.chosen
        self._started = self.clock()
        return self._running

    def done(self, padded_tokens: int) -> None:
        """The batch started by `start` has finished; it held `padded_tokens`."""
        seconds = max(self.clock() - self._started, 1e-9)
        if not self.active:
            return
        if self._plan:
            self._plan.pop(0)
            totals = self._trials[self._running]
            totals[0] += padded_tokens
            totals[1] += seconds
            if not self._plan:
                self._choose()
            return
        self._since += 1
        self._recent.append(padded_tokens / seconds)
        while len(self._recent) > self.trial:
            self._recent.popleft()

    def _due(self) -> bool:
        if self.explorations == 0:
            return True
        if self._since >= self.explore_every and self.chosen != self.options[0]:
            return True  # fewer threads than the CPUs: has the neighbour left?
        # a sustained fall: each of the last `trial` batches, not one slow batch
        floor = self.drop * self.chosen_rate
        return len(self._recent) == self.trial and all(r < floor for r in self._recent)

    def _choose(self) -> None:
        rates = {c: t / s for c, (t, s) in self._trials.items() if s > 0}
        # fastest; on a tie the larger count (the order of options)
        self.chosen = max(self.options, key=lambda c: (rates.get(c, 0.0), c))
        self.chosen_rate = rates.get(self.chosen, 0.0)
        self.explorations += 1
        self._since = 0
        self._recent.clear()

    def as_dict(self) -> dict[str, object]:
        return {
            "threads": self.chosen,
            "candidates": list(self.options),
            "explorations": self.explorations,
        }
