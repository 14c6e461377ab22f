"""The keys file and the per-key limits (tenants/), in process: parsing and its refusals (one
line naming the file's line), constant-time lookup, reloading that keeps the keys in force on
a bad file, and the buckets on a fake clock (OpenAI's headers and 429s)."""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from openai_compat.ground.errors import RateLimited
from openai_compat.tenants import Tenants
from openai_compat.tenants.keys import API_KEY_NAME, Key, KeyRing, KeysFileError, parse
from openai_compat.tenants.limits import Limiter, duration

ALICE = "alice-key-1"
SHA = hashlib.sha256(ALICE.encode()).hexdigest()
FULL = f"""
# comment
[[keys]]
name = "alice"
key_sha256 = "{SHA}"
models = ["minilm", "e5"]
rpm = 60
tpm = 1000
max_concurrent = 2
weight = 3
batch = false
expires = "2027-01-01T00:00:00Z"

[[keys]]
name = "ops"
key = "ops-key"
admin = true
expires = 2026-06-01T12:00:00+02:00
"""


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_full_keys_file_reads_every_field() -> None:
    alice, ops = parse(FULL, "keys.toml", served=["minilm", "e5", "other"])
    assert alice.digest == bytes.fromhex(SHA) and not alice.plain
    assert alice.models == {"minilm", "e5"}
    assert (alice.rpm, alice.tpm, alice.max_concurrent, alice.weight) == (60, 1000, 2, 3.0)
    assert alice.batch is False and alice.admin is False and alice.limited
    assert alice.expires == datetime(2027, 1, 1, tzinfo=UTC)
    assert ops.plain and ops.admin and ops.models is None and not ops.limited
    assert ops.expires == datetime(2026, 6, 1, 10, 0, tzinfo=UTC)  # a TOML datetime, in UTC
    assert ops.expired(datetime(2026, 6, 1, 10, 0, tzinfo=UTC))
    assert not ops.expired(datetime(2026, 6, 1, 9, 59, tzinfo=UTC))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("rpm = 60", "rpm = 0"), "line 3: rpm must be a whole number >= 1"),
        (("weight = 3", "wieght = 3"), "line 3: unknown field(s) wieght"),
        (('name = "ops"', 'name = "alice"'), "line 14: name 'alice' is used twice"),
        (('key = "ops-key"', f'key = "{ALICE}"'), "line 14: the same key as 'alice'"),
        ((f'key_sha256 = "{SHA}"', 'key_sha256 = "abc"'), "line 3: key_sha256 must be 64"),
        (('key = "ops-key"', 'key = "ops-key"\nkey_sha256 = "' + SHA + '"'), "exactly one"),
        (('"2027-01-01T00:00:00Z"', '"2027-01-01T00:00:00"'), "needs an offset"),
        (('"2027-01-01T00:00:00Z"', '"next year"'), "is not an RFC 3339 date-time"),
        (('models = ["minilm", "e5"]', 'models = ["minilm", "e55"]'), "'e55' are not served"),
        (('name = "ops"', f'name = "{API_KEY_NAME}"'), "reserved for --api-key"),
        (('[[keys]]\nname = "ops"', '[[keys]\nname = "ops"'), "keys.toml: "),  # TOML syntax
    ],
)
def test_a_bad_keys_file_is_refused_in_one_line_naming_where(
    change: tuple[str, str], message: str
) -> None:
    text = FULL.replace(*change, 1)
    with pytest.raises(KeysFileError) as caught:
        parse(text, "keys.toml", served=["minilm", "e5"])
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_ring_finds_a_key_by_its_digest_and_nothing_else() -> None:
    keys = parse(FULL)
    ring = KeyRing(keys)
    assert ring.find(ALICE.encode()) is keys[0]
    assert ring.find(b"ops-key") is keys[1]
    assert ring.find(SHA.encode()) is None  # the digest itself is not a key
    assert ring.find(b"") is None and ring.find(b"alice-key-") is None
    assert ring.names() == ["alice", "ops"]


def test_reload_keeps_the_keys_in_force_when_the_file_is_bad(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(FULL)
    tenants = Tenants(api_key=["legacy"], keys_file=path, served=lambda: ["minilm", "e5"])
    assert tenants.ring.find(b"ops-key") is not None
    assert tenants.ring.find(b"legacy") is not None  # --api-key keys stay beside the file
    assert not tenants.changed()
    path.write_text(FULL.replace('name = "ops"', 'name = "ops"\nrpm = -1'))
    assert tenants.changed()
    with caplog.at_level(logging.ERROR, logger="openai_compat.keys"):
        assert not tenants.reload()
    assert "keys file not reloaded, the keys in force stay" in caplog.text
    assert "line 14: rpm must be a whole number" in caplog.text
    assert tenants.ring.find(b"ops-key") is not None and not tenants.changed()
    path.write_text(FULL.replace('key = "ops-key"', 'key = "ops-key-2"'))
    assert tenants.changed() and tenants.reload()
    assert tenants.ring.find(b"ops-key") is None and tenants.ring.find(b"ops-key-2") is not None


def test_a_bad_file_at_start_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text("[[keys]]\nname = 'x'\n")
    with pytest.raises(KeysFileError, match="give exactly one of key_sha256"):
        Tenants(keys_file=path)


def test_owners_are_names_so_a_rotated_key_keeps_its_jobs(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(FULL)
    tenants = Tenants(api_key=["legacy"], keys_file=path)
    alice = tenants.ring.find(ALICE.encode())
    assert tenants.owner(alice) == "key:alice"
    path.write_text(FULL.replace(SHA, hashlib.sha256(b"alice-key-2").hexdigest()))
    assert tenants.reload()
    assert tenants.by_owner("key:alice") is tenants.ring.find(b"alice-key-2")
    legacy = tenants.ring.find(b"legacy")
    # an --api-key key owns what it always did (a hash of the key)
    assert tenants.owner(legacy) == hashlib.sha256(b"legacy").hexdigest()[:32]
    assert tenants.by_owner(tenants.owner(legacy)) is legacy
    assert tenants.by_owner("key:nobody") is None and tenants.owner(None) == ""
    local = tenants.by_owner("")  # a job made without a key (the batch CLI): unlimited
    assert local is not None and local.models is None and not local.limited


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (0.0171, "18ms"), (1, "1s"), (1.5, "1.5s"), (360, "6m0s"), (3723, "1h2m3s")],
)
def test_resets_are_written_as_openai_writes_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def key(**kw: object) -> Key:
    return Key(name="k", digest=b"x" * 32, **kw)  # type: ignore[arg-type]


def test_requests_per_minute_burst_then_refill_with_headers() -> None:
    clock = FakeClock()
    limiter = Limiter(clock)
    k = key(rpm=3)
    for _ in range(3):
        limiter.admit(k)
        limiter.release(k)
    headers = dict(limiter.headers(k))
    assert headers[b"x-ratelimit-limit-requests"] == b"3"
    assert headers[b"x-ratelimit-remaining-requests"] == b"0"
    assert headers[b"x-ratelimit-reset-requests"] == b"1m0s"  # 3 used, 20 s each
    with pytest.raises(RateLimited) as caught:
        limiter.admit(k)
    assert "on requests per minute: limit 3" in caught.value.message
    assert caught.value.headers == {"Retry-After": "20"}
    clock.t += 20  # one request's worth back
    limiter.admit(k)
    assert b"x-ratelimit-limit-tokens" not in dict(limiter.headers(k))


def test_tokens_per_minute_refuse_a_request_over_the_whole_limit_and_an_empty_bucket() -> None:
    clock = FakeClock()
    limiter = Limiter(clock)
    k = key(tpm=600)
    with pytest.raises(RateLimited) as caught:
        limiter.reserve(k, 601)
    # OpenAI's answer to a request over the whole limit: type tokens, rate_limit_exceeded
    assert caught.value.message.startswith(
        "Request too large for key 'k' on tokens per min (TPM): Limit 600, Requested 601."
    )
    error = caught.value
    assert (error.code, error.type, error.headers) == ("rate_limit_exceeded", "tokens", {})
    limiter.reserve(k, 500)
    with pytest.raises(RateLimited) as caught:
        limiter.reserve(k, 200)  # 100 left: 100 more come in 10 s
    assert caught.value.headers == {"Retry-After": "10"}
    assert (caught.value.code, caught.value.type) == ("rate_limit_exceeded", "tokens")
    limiter.charge(k, 300)  # counted after the answer: the bucket goes below zero
    assert dict(limiter.headers(k))[b"x-ratelimit-remaining-tokens"] == b"0"
    with pytest.raises(RateLimited, match="on tokens per minute"):
        limiter.admit(k)  # nothing left: refused before any work
    clock.t += 21  # -200 + 210
    limiter.admit(k)


def test_max_concurrent_counts_requests_in_flight() -> None:
    limiter = Limiter(FakeClock())
    k = key(max_concurrent=2)
    limiter.admit(k)
    limiter.admit(k)
    with pytest.raises(RateLimited, match="2 requests in flight"):
        limiter.admit(k)
    limiter.release(k)
    limiter.admit(k)


def test_a_changed_limit_keeps_what_was_used() -> None:
    clock = FakeClock()
    limiter = Limiter(clock)
    limiter.admit(key(rpm=10))
    limiter.release(key(rpm=10))
    remaining = dict(limiter.headers(key(rpm=20)))[b"x-ratelimit-remaining-requests"]
    assert remaining == b"19"


def test_a_key_past_its_share_of_a_models_queue_gets_429_while_others_are_admitted() -> None:
    from contextlib import ExitStack

    from openai_compat.frame.settings import ModelConfig
    from openai_compat.models.registry import ModelEntry
    from openai_compat.tenants.limits import Caller, current

    entry = ModelEntry(
        config=ModelConfig(model="debug/engine", engine="debugengine"),
        engine=None,
        capabilities=frozenset({"embed"}),
    )
    limiter = Limiter(FakeClock())
    a = Caller(Key("A", b"a" * 32), limiter)
    b = Caller(Key("B", b"b" * 32, weight=3), limiter)

    def admit(caller: Caller, inputs: int, stack: ExitStack) -> None:
        token = current.set(caller)
        try:
            stack.enter_context(entry.admit(inputs, 100))
        finally:
            current.reset(token)

    with ExitStack() as stack:
        admit(a, 60, stack)  # alone: the whole queue is A's share
        admit(a, 40, stack)
        with pytest.raises(RateLimited, match="its share of the queue"):
            admit(a, 1, stack)
        admit(b, 90, stack)  # nothing queued for B: admitted whatever A holds
        with pytest.raises(RateLimited, match=r"\(75 of 100, by weight\)"):
            admit(b, 1, stack)  # B's share with A active: 100 x 3 / 4
        assert entry.shares.queued[False] == {"A": 100, "B": 90}
    assert entry.shares.queued[False] == {} and entry.queued == 0  # all given back


class SleepingClock(FakeClock):
    """A fake clock whose sleep moves it (a waiting caller's pauses, without waiting)."""

    def __init__(self) -> None:
        super().__init__()
        self.t = 0.0
        self.slept: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


async def test_a_background_caller_waits_for_its_tokens_instead_of_a_429() -> None:
    """A Batch API line is never refused for its owner's rate: it waits until the bucket
    holds its tokens (the whole tpm: once the bucket is full), then takes them."""
    clock = SleepingClock()
    limiter = Limiter(clock, sleep=clock.sleep)
    k = key(tpm=600)  # 10 tokens a second
    limiter.reserve(k, 550)  # 50 left
    await limiter.reserve_waiting(k, 150)  # 100 missing: 10 s
    assert clock.t == pytest.approx(10.0) and sum(clock.slept) == pytest.approx(10.0)
    assert limiter.use(k).tokens.level == pytest.approx(0.0)  # type: ignore[union-attr]
    await limiter.reserve_waiting(k, 600)  # a line of the whole tpm: waits for a full bucket
    assert clock.t == pytest.approx(70.0)
    with pytest.raises(RateLimited) as caught:  # more than the whole tpm: waiting never helps
        await limiter.reserve_waiting(k, 601)
    assert caught.value.message.startswith("Request too large")
    assert clock.t == pytest.approx(70.0)  # refused without waiting


async def test_a_background_caller_waits_for_its_request_and_is_not_refused_for_tokens() -> None:
    clock = SleepingClock()
    limiter = Limiter(clock, sleep=clock.sleep)
    k = key(rpm=6, tpm=600)  # a request every 10 s
    for _ in range(6):
        limiter.admit(k)
        limiter.release(k)
    limiter.reserve(k, 600)  # the tokens bucket is empty too
    with pytest.raises(RateLimited):
        limiter.admit(k)  # a live request is refused
    await limiter.admit_waiting(k)  # a background one waits for its request (10 s)...
    assert clock.t == pytest.approx(10.0)  # ...and not for tokens (those wait at reserve)
    assert limiter.use(k).inflight == 1


async def test_a_refund_gives_back_what_the_model_did_not_run() -> None:
    clock = FakeClock()
    limiter = Limiter(clock)
    k = key(tpm=600)
    limiter.reserve(k, 500)
    limiter.refund(k, 300)
    assert dict(limiter.headers(k))[b"x-ratelimit-remaining-tokens"] == b"400"
    limiter.refund(k, 10_000)  # never above the limit
    assert dict(limiter.headers(k))[b"x-ratelimit-remaining-tokens"] == b"600"


async def test_a_background_caller_waiting_for_tokens_holds_no_place_in_flight() -> None:
    """#61.9: with max_concurrent = 1 a batch line waiting for its owner's tokens held the one
    place: the owner's reads of its own batch were refused 20 of 20 times."""
    clock = SleepingClock()
    k = key(tpm=600, max_concurrent=1)
    reads: list[float] = []

    async def sleep(seconds: float) -> None:  # while the line waits, its owner reads
        if not reads:
            limiter.admit(k, spends_tokens=False)  # not a 429: the line gave its place
            reads.append(clock.t)
            limiter.release(k)
        await clock.sleep(seconds)

    limiter = Limiter(clock, sleep=sleep)
    limiter.reserve(k, 600)  # the bucket is empty: the line will wait 10 s for 100 tokens
    await limiter.admit_waiting(k)  # the line's place
    await limiter.reserve_waiting(k, 100)
    assert reads == [pytest.approx(0.0)] and clock.t == pytest.approx(10.0)
    assert limiter.use(k).inflight == 1  # the line has its place back to run
    with pytest.raises(RateLimited, match="max_concurrent"):
        limiter.admit(k, spends_tokens=False)
