"""Per-key rate limits, answered the way OpenAI answers them.

Each key with `rpm` / `tpm` has a bucket per limit that holds at most one minute's allowance
and refills continuously (limit / 60 per second): a burst up to the limit, then the steady
rate. A request takes one from the requests bucket when it is admitted; its input tokens
(counted as `usage` counts them) are taken from the tokens bucket: before the model runs where
they are counted first (embeddings), else when the answer is made. A bucket that is empty
refuses with 429 `rate_limit_exceeded` and `Retry-After`. A request whose tokens exceed the
whole `tpm` is refused as such (waiting would never help). Every answer to a key with limits
carries OpenAI's `x-ratelimit-*` headers.

State is per key name, so it survives a reload of the keys file (a changed limit applies from
then on) and is shared by every route and dialect. The clock is injectable (tests).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field

from openai_compat.errors import RateLimited
from openai_compat.tenants.keys import Key

Clock = Callable[[], float]
# The code of the 429 for a request larger than a key's whole tpm: retrying cannot help (a
# Batch API line with it fails instead of waiting; batch/lines.py).
TOO_LARGE = "request_too_large"


def duration(seconds: float) -> str:
    """OpenAI's reset format (Go's durations): '20ms', '1s', '1.5s', '6m0s', '1h2m3s'."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs:.3f}".rstrip("0").rstrip(".") + "s"
    if hours >= 1:
        return f"{int(hours)}h{int(minutes)}m{text}"
    if minutes >= 1:
        return f"{int(minutes)}m{text}"
    return text


@dataclass
class Bucket:
    """At most `limit`, refilled at limit/60 per second; may go below zero when tokens are
    charged after the fact (an answer larger than what was left)."""

    limit: int
    level: float
    at: float

    def refill(self, now: float) -> None:
        self.level = min(float(self.limit), self.level + (now - self.at) * self.limit / 60.0)
        self.at = now

    def wait(self, amount: float) -> float:
        """Seconds until `amount` is available (0: now)."""
        missing = amount - self.level
        return 0.0 if missing <= 0 else missing * 60.0 / self.limit

    def reset(self) -> float:
        """Seconds until the bucket is full again."""
        return max(0.0, (self.limit - self.level) * 60.0 / self.limit)


@dataclass
class KeyUse:
    """One key's buckets and requests in flight."""

    requests: Bucket | None = None
    tokens: Bucket | None = None
    inflight: int = 0

    def follow(self, key: Key, now: float) -> None:
        """Match the key's limits (after a reload): a new limit starts full, a changed one
        keeps the share used."""
        self.requests = _follow(self.requests, key.rpm, now)
        self.tokens = _follow(self.tokens, key.tpm, now)


def _follow(bucket: Bucket | None, limit: int | None, now: float) -> Bucket | None:
    if limit is None:
        return None
    if bucket is None:
        return Bucket(limit, float(limit), now)
    if bucket.limit != limit:
        bucket.refill(now)
        used = bucket.limit - bucket.level
        bucket.limit, bucket.level = limit, float(limit) - used
    return bucket


@dataclass
class Limiter:
    clock: Clock = time.monotonic
    uses: dict[str, KeyUse] = field(default_factory=dict)

    def use(self, key: Key) -> KeyUse:
        use = self.uses.setdefault(key.name, KeyUse())
        use.follow(key, self.clock())
        return use

    def admit(self, key: Key) -> None:
        """Take one request (rpm) and a place in flight (max_concurrent), or 429."""
        use = self.use(key)
        now = self.clock()
        if key.max_concurrent is not None and use.inflight >= key.max_concurrent:
            raise RateLimited(
                f"Key {key.name!r} has {use.inflight} requests in flight (max_concurrent "
                f"{key.max_concurrent}); retry when one finishes.",
                headers={"Retry-After": "1"},
            )
        if use.tokens is not None:
            use.tokens.refill(now)
            if use.tokens.level < 1:
                raise _over(key, "tokens", use.tokens.wait(1))
        if use.requests is not None:
            use.requests.refill(now)
            if use.requests.level < 1:
                raise _over(key, "requests", use.requests.wait(1))
            use.requests.level -= 1
        use.inflight += 1

    def release(self, key: Key) -> None:
        use = self.uses.get(key.name)
        if use is not None and use.inflight > 0:
            use.inflight -= 1

    def reserve(self, key: Key, tokens: int) -> None:
        """Take `tokens` before the model runs, or 429: over the whole tpm (never possible),
        or over what is left now (Retry-After: when it will be)."""
        use = self.use(key)
        bucket = use.tokens
        if bucket is None or tokens <= 0:
            return
        if tokens > bucket.limit:  # waiting never helps: no Retry-After, a code of its own
            raise RateLimited(
                f"This request has {tokens} input tokens, more than key {key.name!r}'s whole "
                f"limit of {bucket.limit} tokens per minute (type tokens); split it.",
                param="input",
                code=TOO_LARGE,
            )
        bucket.refill(self.clock())
        if bucket.level < tokens:
            raise _over(key, "tokens", bucket.wait(tokens), tokens)
        bucket.level -= tokens

    def charge(self, key: Key, tokens: int) -> None:
        """Take tokens counted after the answer (may leave the bucket below zero)."""
        bucket = self.use(key).tokens
        if bucket is not None and tokens > 0:
            bucket.refill(self.clock())
            bucket.level -= tokens

    def headers(self, key: Key) -> list[tuple[bytes, bytes]]:
        """OpenAI's x-ratelimit-* headers for a key with limits."""
        use = self.use(key)
        now = self.clock()
        out: list[tuple[bytes, bytes]] = []
        for kind, bucket in (("requests", use.requests), ("tokens", use.tokens)):
            if bucket is None:
                continue
            bucket.refill(now)
            out += [
                (f"x-ratelimit-limit-{kind}".encode(), str(bucket.limit).encode()),
                (
                    f"x-ratelimit-remaining-{kind}".encode(),
                    str(max(0, math.floor(bucket.level))).encode(),
                ),
                (f"x-ratelimit-reset-{kind}".encode(), duration(bucket.reset()).encode()),
            ]
        return out


def _over(key: Key, kind: str, wait: float, asked: int | None = None) -> RateLimited:
    limit = key.rpm if kind == "requests" else key.tpm
    asked_text = f" ({asked} asked)" if asked is not None else ""
    return RateLimited(
        f"Rate limit reached for key {key.name!r} on {kind} per minute: limit {limit}"
        f"{asked_text}. Please try again in {duration(wait)}.",
        headers={"Retry-After": str(max(1, math.ceil(wait)))},
    )


@dataclass
class Caller:
    """Who the current request is: its key, and the limiter that charges it."""

    key: Key
    limiter: Limiter
    reserved_tokens: int = 0  # tokens taken before the model ran (the rest: at the end)


# The caller of the request being served (set by the gateway; None: no keys, or an open path).
current: ContextVar[Caller | None] = ContextVar("openai_compat_caller", default=None)


def reserve_tokens(tokens: int) -> None:
    """Inference calls this where it has counted a request's tokens before the model runs."""
    caller = current.get()
    if caller is None or caller.key.tpm is None:
        return
    caller.limiter.reserve(caller.key, tokens)
    caller.reserved_tokens += tokens


def counts_first() -> bool:
    """Whether the current request must be counted before it runs (its key has a tpm)."""
    caller = current.get()
    return caller is not None and caller.key.tpm is not None
