"""Per-key rate limits, answered the way OpenAI answers them.

Each key with `rpm` / `tpm` has a bucket per limit that holds at most one minute's allowance
and refills continuously (limit / 60 per second): a burst up to the limit, then the steady
rate. A request takes one from the requests bucket when it is admitted; its input tokens
(counted as `usage` counts them) are taken from the tokens bucket: before the model runs where
they are counted first (embeddings), else when the answer is made. A bucket that is empty
refuses with 429 `rate_limit_exceeded` (type `requests` or `tokens`, as OpenAI types them)
and `Retry-After`. A request whose tokens exceed the whole `tpm` is refused as OpenAI refuses
it ("Request too large ...", no Retry-After: waiting would never help). Every answer to a key
with limits carries OpenAI's `x-ratelimit-*` headers.

A Batch API line (a background caller) is never refused for its owner's rate: it waits until
the owner's buckets hold its request and its tokens, then runs (live requests of the same key
take what is there meanwhile: a client waits for those).

State is per key name, so it survives a reload of the keys file (a changed limit applies from
then on) and is shared by every route and dialect. The clock is injectable (tests).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field

from openai_compat.ground.errors import RateLimited
from openai_compat.tenants.keys import Key

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]
# How OpenAI's 429 for a request larger than a key's whole tpm begins: retrying cannot help (a
# Batch API line with it fails instead of waiting; batch/lines.py).
TOO_LARGE = "Request too large"


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
    sleep: Sleep = asyncio.sleep
    # one key's waiting background callers, first come first served (each waits for its own
    # amount; a later one never takes what an earlier one is waiting for)
    _queues: dict[str, asyncio.Lock] = field(default_factory=dict)
    # told +1 / -1 as a background caller starts and stops waiting (the lifecycle's drain
    # does not wait for those: ground/lifecycle.Lifecycle.park)
    parked: Callable[[int], None] = lambda delta: None

    def use(self, key: Key) -> KeyUse:
        use = self.uses.setdefault(key.name, KeyUse())
        use.follow(key, self.clock())
        return use

    def admit(self, key: Key, *, spends_tokens: bool = True) -> None:
        """Take one request (rpm) and a place in flight (max_concurrent), or 429. An empty
        tokens bucket refuses too where the request spends tokens (not a batch's or a file's
        state; not a background caller, whose tokens wait in `reserve_waiting`)."""
        use = self.use(key)
        now = self.clock()
        if key.max_concurrent is not None and use.inflight >= key.max_concurrent:
            raise RateLimited(
                f"Key {key.name!r} has {use.inflight} requests in flight (max_concurrent "
                f"{key.max_concurrent}); retry when one finishes.",
                headers={"Retry-After": "1"},
            )
        if use.tokens is not None and spends_tokens:
            use.tokens.refill(now)
            if use.tokens.level < 1:
                raise _over(key, "tokens", use.tokens.wait(1))
        if use.requests is not None:
            use.requests.refill(now)
            if use.requests.level < 1:
                raise _over(key, "requests", use.requests.wait(1))
            use.requests.level -= 1
        use.inflight += 1

    async def admit_waiting(self, key: Key) -> None:
        """A background caller's admission: waits for the requests bucket instead of a 429
        (max_concurrent still refuses: the runner tries that line again)."""
        self.parked(1)
        try:
            async with self._queue(key):
                while True:
                    use = self.use(key)
                    if use.requests is None:
                        break
                    use.requests.refill(self.clock())
                    if use.requests.level >= 1:
                        break
                    await self.sleep(max(use.requests.wait(1), MIN_WAIT_S))
        finally:
            self.parked(-1)
        self.admit(key, spends_tokens=False)

    def _queue(self, key: Key) -> asyncio.Lock:
        return self._queues.setdefault(key.name, asyncio.Lock())

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
        _check_fits(key, bucket, tokens)
        bucket.refill(self.clock())
        if bucket.level < tokens:
            raise _over(key, "tokens", bucket.wait(tokens), tokens)
        bucket.level -= tokens

    async def reserve_waiting(self, key: Key, tokens: int) -> None:
        """A background caller's `reserve`: waits until the bucket holds `tokens`, then
        takes them (429 only for more than the whole tpm, which waiting never cures). While
        it waits it gives its place in flight back (its owner's own requests, reads of its
        batch among them, are not refused for max_concurrent meanwhile) and takes one again,
        waiting for it, before it goes on."""
        bucket = self.use(key).tokens
        if bucket is None or tokens <= 0:
            return
        _check_fits(key, bucket, tokens)
        self.parked(1)
        try:
            await self._reserve_queued(key, tokens)
        finally:
            self.parked(-1)

    async def _reserve_queued(self, key: Key, tokens: int) -> None:
        bucket = self.use(key).tokens
        assert bucket is not None
        async with self._queue(key):
            bucket.refill(self.clock())
            if bucket.level >= tokens:
                bucket.level -= tokens
                return
            held = self.use(key).inflight > 0
            if held:
                self.release(key)
            try:
                await self._wait_for_tokens(key, tokens)
            finally:
                if held:
                    await self._take_place(key)

    async def _wait_for_tokens(self, key: Key, tokens: int) -> None:
        while True:
            bucket = self.use(key).tokens
            if bucket is None:  # the limit went away in a reload
                return
            _check_fits(key, bucket, tokens)
            bucket.refill(self.clock())
            if bucket.level >= tokens:
                bucket.level -= tokens
                return
            await self.sleep(max(bucket.wait(tokens), MIN_WAIT_S))

    async def _take_place(self, key: Key) -> None:
        """A place in flight for a background caller: waits for one under max_concurrent."""
        use = self.use(key)
        while key.max_concurrent is not None and use.inflight >= key.max_concurrent:
            await self.sleep(MIN_WAIT_S)
            use = self.use(key)
        use.inflight += 1

    def charge(self, key: Key, tokens: int) -> None:
        """Take tokens counted after the answer (may leave the bucket below zero)."""
        bucket = self.use(key).tokens
        if bucket is not None and tokens > 0:
            bucket.refill(self.clock())
            bucket.level -= tokens

    def refund(self, key: Key, tokens: int) -> None:
        """Give back tokens taken before the model ran that it did not run (a provisional
        reservation above the engine's own count, or a request refused after reserving)."""
        bucket = self.use(key).tokens
        if bucket is not None and tokens > 0:
            bucket.refill(self.clock())
            bucket.level = min(float(bucket.limit), bucket.level + tokens)

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


# The shortest sleep of a waiting background caller (a bucket's own estimate can be ~0).
MIN_WAIT_S = 0.05


def _check_fits(key: Key, bucket: Bucket, tokens: int) -> None:
    """OpenAI's 429 for a request larger than the whole tpm: type tokens, code
    rate_limit_exceeded, no Retry-After (what SDKs and dashboards key on)."""
    if tokens > bucket.limit:
        error = RateLimited(
            f"{TOO_LARGE} for key {key.name!r} on tokens per min (TPM): Limit "
            f"{bucket.limit}, Requested {tokens}. The input tokens must be reduced (split the "
            "request) in order to run successfully.",
            param="input",
        )
        error.type = "tokens"
        raise error


def _over(key: Key, kind: str, wait: float, asked: int | None = None) -> RateLimited:
    limit = key.rpm if kind == "requests" else key.tpm
    asked_text = f" ({asked} asked)" if asked is not None else ""
    error = RateLimited(
        f"Rate limit reached for key {key.name!r} on {kind} per minute: limit {limit}"
        f"{asked_text}. Please try again in {duration(wait)}.",
        headers={"Retry-After": str(max(1, math.ceil(wait)))},
    )
    error.type = kind  # OpenAI's type for a rate limit: "requests" or "tokens"
    return error


@dataclass
class Caller:
    """Who the current request is: its key, and the limiter that charges it."""

    key: Key
    limiter: Limiter
    reserved_tokens: int = 0  # tokens taken before the model ran (the rest: at the end)
    background: bool = False  # a Batch API line: waits for its owner's budget, never refused


# The caller of the request being served (set by the gateway; None: no keys, or an open path).
current: ContextVar[Caller | None] = ContextVar("openai_compat_caller", default=None)


async def reserve_tokens(tokens: int) -> None:
    """Inference calls this where it has counted a request's tokens before the model runs: a
    live caller is refused (429) past what is left, a background one waits for it."""
    caller = current.get()
    if caller is None or caller.key.tpm is None:
        return
    if caller.background:
        await caller.limiter.reserve_waiting(caller.key, tokens)
    else:
        caller.limiter.reserve(caller.key, tokens)
    caller.reserved_tokens += tokens


def counts_first() -> bool:
    """Whether the current request must be counted before it runs (its key has a tpm)."""
    caller = current.get()
    return caller is not None and caller.key.tpm is not None
