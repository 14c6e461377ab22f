"""A model's admission queue shared among keys by weight (ModelEntry.admit, with keys).

`--max-queued-inputs` is one model's bound on inputs admitted and unanswered. With keys, the
keys that have inputs queued share it by weight: a key past its share gets the 429 while the
others keep being admitted. A key with nothing queued is always admitted, so the queue holds
at most the bound plus one request per key. Live and Batch API inputs have a queue each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from openai_compat.ground.errors import RateLimited


@dataclass
class QueueShares:
    queued: dict[bool, dict[str, int]] = field(default_factory=lambda: {False: {}, True: {}})
    weights: dict[str, float] = field(default_factory=dict)

    def admit(
        self, model: str, key: str, weight: float, inputs: int, limit: int, background: bool
    ) -> None:
        mine = self.queued[background]
        self.weights[key] = weight
        held = mine.get(key, 0)
        if limit and held:
            active = sum(self.weights.get(k, 1.0) for k in mine if k != key) + weight
            share = limit * weight / active
            if held + inputs > share:
                raise RateLimited(
                    f"Model {model!r} has {held} of this key's inputs queued, its share of "
                    f"the queue ({int(share)} of {limit}, by weight); retry shortly.",
                    headers={"Retry-After": "1"},
                )
        mine[key] = held + inputs

    def release(self, key: str, inputs: int, background: bool) -> None:
        mine = self.queued[background]
        left = mine.get(key, 0) - inputs
        if left > 0:
            mine[key] = left
        else:
            mine.pop(key, None)
