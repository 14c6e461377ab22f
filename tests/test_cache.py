"""The exact embedding cache (models/cache.py): repeats cost no forward pass and answer bit for bit
what the first computation did; repeats inside one request are computed once; usage counts
every input; the byte budget holds, oldest out first; a model may opt out; 0 turns it off."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest

from openai_compat.engine.usage import TokenCountedArray, TokenIds
from openai_compat.frame.settings import ModelConfig, Settings
from openai_compat.models.cache import EmbeddingCache
from tests.utils import app_client


def _vector(value: float, tokens: int | None = None) -> Any:
    v = np.full(4, value, dtype=np.float32)
    if tokens is None:
        return v
    counted = v.view(TokenCountedArray)
    counted.tokens = tokens
    return counted


async def test_repeats_are_computed_once_and_usage_counts_every_input() -> None:
    cache = EmbeddingCache(max_bytes=10_000)
    calls: list[list[str]] = []

    async def compute(texts: list[str]) -> tuple[list[Any], int]:
        calls.append(texts)
        return [_vector(len(t)) for t in texts], sum(len(t) for t in texts)  # characters

    vectors, usage = await cache.embed("m", ["aa", "b", "aa"], compute)
    assert calls == [["aa", "b"]] and usage == 5
    assert vectors[0] is vectors[2]  # one computation, the same answer
    again, usage = await cache.embed("m", ["b", "aa", "ccc"], compute)
    assert calls[-1] == ["ccc"] and usage == 6
    assert again[0].tobytes() == vectors[1].tobytes()  # bit for bit
    assert again[1].tobytes() == vectors[0].tobytes()
    assert cache.stats["m"].hits == 2 and cache.stats["m"].misses == 3
    other, _ = await cache.embed("other-model", ["aa"], compute)
    assert calls[-1] == ["aa"] and other[0] is not vectors[0]  # keys are per model


async def test_usage_stays_in_tokens_where_the_engine_counts_them() -> None:
    cache = EmbeddingCache(max_bytes=10_000)

    async def compute(texts: list[str]) -> tuple[list[Any], int]:
        vectors = [_vector(1.0, tokens=len(t) + 2) for t in texts]
        return vectors, sum(v.tokens for v in vectors)

    _, usage = await cache.embed("m", ["abc", "abc"], compute)
    assert usage == 10  # 5 tokens each, the repeat included
    _, usage = await cache.embed("m", ["abc"], compute)
    assert usage == 5


def test_the_byte_budget_holds_oldest_out_first() -> None:
    size = _vector(0).nbytes + 200  # an entry's cost
    cache = EmbeddingCache(max_bytes=3 * size)
    for i in range(5):
        cache.put("m", cache.key(str(i)), _vector(i))
    assert cache.held == 3 * size and cache.stats["m"].evictions == 2
    assert cache.get("m", cache.key("0")) is None  # the oldest went first
    assert cache.get("m", cache.key("4")) is not None
    assert cache.key(TokenIds("hello", [7592])) != cache.key("hello")  # ids are not their text


@pytest.mark.slow
async def test_a_repeated_request_is_answered_bit_for_bit_from_the_cache() -> None:
    models = (
        ModelConfig(model="builtin:all-MiniLM-L6-v2", name="m", quantization_range=0.3),
        ModelConfig(
            model="builtin:all-MiniLM-L6-v2", name="nocache", quantization_range=0.3, cache=False
        ),
    )
    texts = ["A man is eating food.", "The stock market crashed today.", "A man is eating food."]
    async with app_client(Settings(models=models)) as c:
        body = {"input": texts, "encoding_format": "base64"}
        first = (await c.post("/v1/embeddings", json={**body, "model": "m"})).json()
        second = (await c.post("/v1/embeddings", json={**body, "model": "m"})).json()
        plain = (await c.post("/v1/embeddings", json={**body, "model": "nocache"})).json()
        metrics = (await c.get("/metrics")).text
    assert [d["embedding"] for d in second["data"]] == [d["embedding"] for d in first["data"]]
    assert first["data"][0]["embedding"] == first["data"][2]["embedding"]
    assert first["usage"] == second["usage"] == plain["usage"]  # every input counted
    for cached, uncached in zip(first["data"], plain["data"], strict=True):
        a = np.frombuffer(base64.b64decode(cached["embedding"]), dtype="<f4")
        b = np.frombuffer(base64.b64decode(uncached["embedding"]), dtype="<f4")
        np.testing.assert_allclose(a, b, atol=1e-5)  # the same model's vectors
    assert 'openai_compat_cache_hits_total{model="m"} 3.0' in metrics
    assert 'openai_compat_cache_misses_total{model="m"} 2.0' in metrics
    assert 'model="nocache"' not in metrics.split("openai_compat_cache_hits")[1].split("\n#")[0]


@pytest.mark.slow
async def test_cache_bytes_zero_turns_it_off() -> None:
    model = ModelConfig(model="builtin:all-MiniLM-L6-v2", name="m", quantization_range=0.3)
    async with app_client(Settings(models=(model,), cache_bytes=0)) as c:
        await c.post("/v1/embeddings", json={"model": "m", "input": ["x", "x"]})
        entry = c.app_state.registry.loaded("m")  # type: ignore[attr-defined]
        assert entry.cache is None
        assert "openai_compat_cache_hits_total{" not in (await c.get("/metrics")).text


def test_a_cached_row_owns_its_memory_and_keeps_its_token_count() -> None:
    batch = np.arange(12, dtype=np.float32).reshape(3, 4)
    row = batch[1].view(TokenCountedArray)  # as the engine answers: a view of its batch
    row.tokens = 7
    cache = EmbeddingCache(max_bytes=10_000)
    cache.put("m", b"k", row)
    kept = cache.get("m", b"k")
    assert kept.base is None and kept.tobytes() == row.tobytes() and kept.tokens == 7
    assert cache.held == 16 + 200  # the row's bytes, not the batch's
    plain = batch[2]  # a plain ndarray view (no attributes) is owned too
    cache.put("m", b"p", plain)
    assert cache.get("m", b"p").base is None


async def test_concurrent_requests_share_one_computation_of_a_text() -> None:
    """Single flight: a text that one request is computing is not computed again by another
    request that arrives meanwhile; it waits for that answer. If the first request goes away,
    the waiting one computes the text itself."""
    import asyncio

    cache = EmbeddingCache(max_bytes=10_000)
    calls: list[list[str]] = []
    release = asyncio.Event()

    async def compute(texts: list[str]) -> tuple[list[Any], int]:
        calls.append(texts)
        await release.wait()
        return [_vector(len(t)) for t in texts], sum(len(t) for t in texts)

    first = asyncio.create_task(cache.embed("m", ["shared", "a"], compute))
    await asyncio.sleep(0)  # the first request is computing
    second = asyncio.create_task(cache.embed("m", ["b", "shared"], compute))
    for _ in range(5):
        await asyncio.sleep(0)
    assert calls == [["shared", "a"], ["b"]]  # "shared" is not computed twice
    release.set()
    (one, usage_one), (two, usage_two) = await asyncio.gather(first, second)
    assert two[1] is one[0] and usage_one == 7 and usage_two == 7  # every input counted
    # the first request leaves mid-computation: the waiting one computes the text itself
    release.clear()
    leaving = asyncio.create_task(cache.embed("m", ["again", "x"], compute))
    await asyncio.sleep(0)
    staying = asyncio.create_task(cache.embed("m", ["again"], compute))
    for _ in range(5):
        await asyncio.sleep(0)
    leaving.cancel()
    for _ in range(5):
        await asyncio.sleep(0)
    release.set()
    (vectors, usage) = await staying
    assert calls[-1] == ["again"] and vectors[0][0] == 5.0 and usage == 5
    assert not cache._flights  # nothing left behind


async def test_with_keys_each_key_has_its_own_entries_unless_shared() -> None:
    """One cache for every key was an oracle: key B's fast answer (and the hit counter) told
    it that key A had embedded an exact text. Per key by default; `cache_scope = "shared"`
    makes sharing an explicit choice."""
    from openai_compat.tenants.keys import Key
    from openai_compat.tenants.limits import Caller, Limiter, current

    computed: list[list[str]] = []

    async def compute(todo: list[str]) -> tuple[list[Any], int]:
        computed.append(list(todo))
        return [_vector(len(t)) for t in todo], len(todo)

    async def as_key(cache: EmbeddingCache, name: str) -> None:
        token = current.set(Caller(Key(name=name, digest=b"x" * 32), Limiter()))
        try:
            await cache.embed("m", ["secret text"], compute)
        finally:
            current.reset(token)

    own = EmbeddingCache(max_bytes=1 << 20)
    await as_key(own, "A")
    await as_key(own, "B")  # not A's entry: computed again
    await as_key(own, "B")  # B's own entry: a hit
    assert computed == [["secret text"], ["secret text"]]
    assert (own.stats["m"].hits, own.stats["m"].misses) == (1, 2)
    computed.clear()
    shared = EmbeddingCache(max_bytes=1 << 20, per_key=False)
    await as_key(shared, "A")
    await as_key(shared, "B")
    assert computed == [["secret text"]]
