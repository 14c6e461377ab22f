"""Models in bounded memory (models/pool.py), in process on the model-free debug engine: lazy loads
shared by concurrent first requests, idle unloads after keep_alive, least-recently-used
eviction under --max-loaded-models and --memory-budget, unloads that wait for (or cancel)
in-flight work, bounded waiters, the admin API and the states /v1/models and /metrics show.

Timing is controlled by pause hooks (a load or an engine batch waits on an Event the test
sets), never by this machine's speed."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from openai_compat.frame.settings import ModelConfig, Settings
from openai_compat.models import loading
from tests.utils import app_client

ADMIN = {"Authorization": "Bearer admin-secret"}


def _debug(name: str, **options: Any) -> ModelConfig:
    return ModelConfig(model=f"debug/{name}", name=name, engine="debugengine", **options)


def _settings(*models: ModelConfig, **options: Any) -> Settings:
    return Settings(models=models, admin_key="admin-secret", cache_bytes=0, **options)


async def _states(client: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    r = await client.get("/admin/models", headers=ADMIN)
    assert r.status_code == 200, r.text
    return {m["id"]: m for m in r.json()["data"]}


async def _embed(client: httpx.AsyncClient, model: str, text: str, **extra: Any) -> httpx.Response:
    return await client.post("/v1/embeddings", json={"model": model, "input": text, **extra})


async def _until(predicate: Any, what: str) -> None:
    """Poll the server (a deadline, not a sleep for luck) until `await predicate()` is true."""
    deadline = asyncio.get_running_loop().time() + 30
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


class Gate:
    """A pause hook: code that calls `pass_()` (in any thread) waits until the test opens it."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.reached = threading.Event()
        self.count = 0

    def pass_(self) -> None:
        self.count += 1
        self.reached.set()
        assert self.opened.wait(60), "the test never opened the gate"

    async def wait_reached(self) -> None:
        assert await asyncio.to_thread(self.reached.wait, 30)


@pytest.fixture
def load_gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    """Every lazy model's load waits at the gate before building its engine."""
    gate = Gate()
    create = loading.create_engine

    def gated(config: ModelConfig, *args: Any, **kwargs: Any) -> Any:
        if config.load == "lazy":
            gate.pass_()
        return create(config, *args, **kwargs)

    monkeypatch.setattr(loading, "create_engine", gated)
    yield gate
    gate.opened.set()


@pytest.fixture
def batch_gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    """The debug engine's batches (its forward runs) wait at the gate once it is armed
    (`gate.count = 0`)."""
    from openai_compat.engine.debug import DebugRunner

    gate = Gate()
    gate.opened.set()  # open until a test closes it
    run = DebugRunner.run

    def gated(self: Any, rows: Any) -> Any:
        gate.pass_()
        return run(self, rows)

    monkeypatch.setattr(DebugRunner, "run", gated)
    yield gate
    gate.opened.set()


@pytest.fixture
async def lazy3() -> AsyncIterator[httpx.AsyncClient]:
    """One eager model and three lazy ones, at most two loaded."""
    settings = _settings(
        _debug("eager"),
        _debug("a", load="lazy"),
        _debug("b", load="lazy"),
        _debug("c", load="lazy"),
        max_loaded_models=2,
    )
    async with app_client(settings) as c:
        yield c


async def test_ready_needs_only_the_eager_models_and_listings_show_states(
    lazy3: httpx.AsyncClient,
) -> None:
    ready = await lazy3.get("/ready")
    assert ready.status_code == 200
    cards = {m["id"]: m for m in (await lazy3.get("/v1/models")).json()["data"]}
    assert {k: (v["state"], v["load"]) for k, v in cards.items()} == {
        "eager": ("loaded", "eager"),
        "a": ("unloaded", "lazy"),
        "b": ("unloaded", "lazy"),
        "c": ("unloaded", "lazy"),
    }
    assert cards["eager"]["capabilities"] and "capabilities" not in cards["a"]  # not known yet
    assert (await lazy3.get("/v1/models/a")).json()["state"] == "unloaded"
    metrics = (await lazy3.get("/metrics")).text
    assert 'openai_compat_model_state{model="a",state="unloaded"} 1.0' in metrics
    assert 'openai_compat_model_loads_total{model="eager"} 1.0' in metrics


async def test_least_recently_used_idle_model_makes_room(lazy3: httpx.AsyncClient) -> None:
    for name, text in (("a", "x"), ("b", "xx"), ("a", "xxx")):
        r = await _embed(lazy3, name, text)
        assert r.status_code == 200 and r.json()["data"][0]["embedding"] == [len(text)] * 13
    states = await _states(lazy3)
    # 'eager' was the least recently used when 'b' needed room; 'a' was used after 'b' loaded
    assert {k: v["state"] for k, v in states.items()} == {
        "eager": "unloaded",
        "a": "loaded",
        "b": "loaded",
        "c": "unloaded",
    }
    assert (await _embed(lazy3, "c", "xxxx")).status_code == 200
    states = await _states(lazy3)
    assert [k for k, v in states.items() if v["state"] == "loaded"] == ["a", "c"]
    assert states["b"]["unloads"] == 1 and states["eager"]["loads"] == 1
    # an unloaded model's card keeps what it said of itself
    card = (await lazy3.get("/v1/models/b")).json()
    assert card["state"] == "unloaded" and card["dimensions"] == 13
    assert (await _embed(lazy3, "eager", "y")).status_code == 200  # loads again on use
    assert (await _states(lazy3))["eager"]["loads"] == 2


async def test_ten_concurrent_first_requests_share_one_load(load_gate: Gate) -> None:
    async with app_client(_settings(_debug("eager"), _debug("lazy", load="lazy"))) as c:
        load_gate.count = 0
        texts = ["q" * (i + 1) for i in range(10)]
        requests = [asyncio.create_task(_embed(c, "lazy", t)) for t in texts]
        await load_gate.wait_reached()
        await _until(lambda: _waiting(c, "lazy", 10), "ten requests waiting for the one load")
        assert (await c.get("/health")).status_code == 200  # the loop is free meanwhile
        load_gate.opened.set()
        answers = await asyncio.gather(*requests)
        assert [r.json()["data"][0]["embedding"] for r in answers] == [[len(t)] * 13 for t in texts]
        assert load_gate.count == 1
        assert (await _states(c))["lazy"]["loads"] == 1


async def _waiting(c: httpx.AsyncClient, name: str, n: int) -> bool:
    return (await _states(c))[name]["waiting"] == n


async def test_waiters_past_the_bound_get_503_with_retry_after(load_gate: Gate) -> None:
    settings = _settings(_debug("eager"), _debug("lazy", load="lazy"), max_load_waiters=3)
    async with app_client(settings) as c:
        load_gate.count = 0
        first = [asyncio.create_task(_embed(c, "lazy", "abc")) for _ in range(3)]
        await _until(lambda: _waiting(c, "lazy", 3), "three waiters")
        refused = await _embed(c, "lazy", "abc")
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "model_loading"
        load_gate.opened.set()
        assert [r.status_code for r in await asyncio.gather(*first)] == [200] * 3


async def test_a_wait_past_the_timeout_is_a_503_and_the_load_goes_on(load_gate: Gate) -> None:
    settings = _settings(_debug("eager"), _debug("lazy", load="lazy"), load_wait_timeout=0.2)
    async with app_client(settings) as c:
        load_gate.count = 0
        late = await _embed(c, "lazy", "abc")  # the gate stays shut past its 0.2 s
        assert late.status_code == 503 and late.headers["retry-after"] == "5"
        assert late.json()["error"]["code"] == "model_loading"
        load_gate.opened.set()
        await _until(lambda: _state_is(c, "lazy", "loaded"), "the load finished anyway")
        assert (await _embed(c, "lazy", "abcd")).json()["data"][0]["embedding"] == [4.0] * 13
        assert load_gate.count == 1


async def test_a_client_that_leaves_does_not_cancel_the_load(load_gate: Gate) -> None:
    async with app_client(_settings(_debug("eager"), _debug("lazy", load="lazy"))) as c:
        load_gate.count = 0
        gone = asyncio.create_task(_embed(c, "lazy", "abc"))
        await load_gate.wait_reached()
        gone.cancel()
        stayed = asyncio.create_task(_embed(c, "lazy", "abcd"))
        await _until(lambda: _waiting(c, "lazy", 1), "the second request waiting")
        load_gate.opened.set()
        assert (await stayed).json()["data"][0]["embedding"] == [4.0] * 13
        assert load_gate.count == 1


async def test_keep_alive_unloads_an_idle_model_and_a_request_may_set_it() -> None:
    short = _debug("brief", load="lazy", keep_alive="0.3s")
    settings = _settings(_debug("eager"), short, _debug("kept", load="lazy"))
    async with app_client(settings) as c:
        assert (await _embed(c, "brief", "abc")).status_code == 200
        brief = (await _states(c))["brief"]
        assert brief["state"] == "loaded" and 0 < brief["idle_unload_in"] <= 0.3
        await _until(lambda: _state_is(c, "brief", "unloaded"), "brief unloaded")
        # a request's own keep_alive 0: unloaded right after it (Ollama's keep_alive)
        assert (await _embed(c, "kept", "abc", keep_alive=0)).status_code == 200
        await _until(lambda: _state_is(c, "kept", "unloaded"), "kept unloaded")
        # without one the model's own setting (forever) holds again
        assert (await _embed(c, "kept", "abc")).status_code == 200
        kept = (await _states(c))["kept"]
        assert kept["state"] == "loaded" and kept["idle_unload_in"] is None
        r = await _embed(c, "kept", "abc", keep_alive="soon")
        assert r.status_code == 400 and r.json()["error"]["param"] == "keep_alive"


async def _state_is(c: httpx.AsyncClient, name: str, state: str) -> bool:
    return (await _states(c))[name]["state"] == state


async def _held_in_the_engine(c: httpx.AsyncClient, gate: Gate) -> asyncio.Task[httpx.Response]:
    """A request for "m" whose engine batch waits at the (now shut) gate."""
    gate.opened.clear()
    gate.reached.clear()
    request = asyncio.create_task(_embed(c, "m", "abcde"))
    await gate.wait_reached()
    return request


async def test_unload_waits_for_work_in_flight(batch_gate: Gate) -> None:
    async with app_client(_settings(_debug("m"))) as c:
        request = await _held_in_the_engine(c, batch_gate)
        unload = asyncio.create_task(c.post("/admin/models/m/unload", headers=ADMIN))
        await _until(lambda: _state_is(c, "m", "unloading"), "unloading")
        assert not request.done() and not unload.done()
        batch_gate.opened.set()
        assert (await request).json()["data"][0]["embedding"] == [5.0] * 13
        done = await unload
        assert done.status_code == 200 and done.json()["state"] == "unloaded"


async def test_forced_unload_cancels_work_in_flight_with_503(batch_gate: Gate) -> None:
    async with app_client(_settings(_debug("m"))) as c:
        request = await _held_in_the_engine(c, batch_gate)
        unload = asyncio.create_task(c.post("/admin/models/m/unload?force=true", headers=ADMIN))
        cut = await request  # answered at once, while the engine's batch still runs
        assert cut.status_code == 503 and cut.json()["error"]["code"] == "model_unloaded"
        assert cut.headers["retry-after"] == "1" and not unload.done()
        batch_gate.opened.set()  # a forward pass cannot be interrupted: the unload waits it out
        done = await unload
        assert done.status_code == 200 and done.json()["state"] == "unloaded"
        assert (await _embed(c, "m", "ab")).status_code == 200  # loads again


async def test_a_model_larger_than_the_budget_is_a_400_naming_model(minilm_path: str) -> None:
    big = ModelConfig(model=minilm_path, name="minilm", load="lazy")
    async with app_client(_settings(_debug("eager"), big, memory_budget="10MiB")) as c:
        r = await _embed(c, "minilm", "abc")
        assert r.status_code == 400
        error = r.json()["error"]
        assert error["param"] == "model" and error["code"] == "model_too_large"
        assert "10.0 MiB" in error["message"] and "minilm" in error["message"]
        assert (await _states(c))["minilm"]["state"] == "unloaded"
        assert (await _states(c))["minilm"]["file_bytes"] > 10 * 2**20


async def test_admin_routes_need_the_admin_key_and_are_off_without_one() -> None:
    async with app_client(_settings(_debug("m"), api_key=("user-key",))) as c:
        user = {"Authorization": "Bearer user-key"}
        assert (await c.get("/admin/models")).status_code == 401
        assert (await c.get("/admin/models", headers=user)).status_code == 401  # not an API key
        r = await c.post("/admin/models/nope/load", headers=ADMIN)
        assert r.status_code == 404 and r.json()["error"]["param"] == "model"
        assert (await c.post("/admin/models/m/unload", headers=ADMIN)).json()["state"] == (
            "unloaded"
        )
        loaded = await c.post("/admin/models/m/load", headers=ADMIN)
        assert loaded.status_code == 200 and loaded.json()["state"] == "loaded"
        assert loaded.json()["loads"] == 2
    settings = Settings(models=(_debug("m"),), cache_bytes=0)
    async with app_client(settings) as c:
        r = await c.get("/admin/models", headers=ADMIN)
        assert r.status_code == 404 and "--admin-key" in r.json()["error"]["message"]


def test_more_eager_models_than_may_be_loaded_is_refused_at_start() -> None:
    from openai_compat.frame.settings import ConfigError
    from openai_compat.web.app import create_app

    with pytest.raises(ConfigError, match="2 models load eagerly but --max-loaded-models is 1"):
        create_app(_settings(_debug("a"), _debug("b"), max_loaded_models=1))


@pytest.mark.parametrize(
    ("given", "seconds"),
    [("90s", 90.0), ("5m", 300.0), ("1h30m", 5400.0), ("500ms", 0.5), (-1, -1.0), ("0", 0.0)],
)
def test_keep_alive_durations(given: object, seconds: float) -> None:
    assert _debug("m", keep_alive=given).keep_alive == seconds


def test_sizes_and_bad_values() -> None:
    assert Settings(memory_budget="6GiB").memory_budget == 6 * 2**30
    assert Settings(memory_budget="512MB").memory_budget == 512_000_000
    with pytest.raises(ValueError, match="memory_budget"):
        Settings(memory_budget="lots")
    with pytest.raises(ValueError, match="keep_alive"):
        _debug("m", keep_alive="forever")
    for huge in (10**400, 1e300, "99999999999999h"):  # 10**400 was an OverflowError (a 500)
        with pytest.raises(ValueError, match="keep_alive must be at most"):
            _debug("m", keep_alive=huge)


async def test_a_huge_keep_alive_in_a_request_is_a_400() -> None:
    async with app_client(_settings(_debug("m"))) as c:
        for huge in (10**400, "1" + "0" * 400):
            r = await c.post(
                "/v1/embeddings",
                content=b'{"model": "m", "input": "x", "keep_alive": ' + str(huge).encode() + b"}",
                headers={"Content-Type": "application/json"},
            )
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == "keep_alive"


async def test_a_lazy_model_that_cannot_load_is_a_503_naming_why(tmp_path: Any) -> None:
    broken = ModelConfig(model=str(tmp_path / "missing"), name="broken", load="lazy")
    async with app_client(_settings(_debug("eager"), broken)) as c:
        first = await _embed(c, "broken", "abc")  # the request that started the load
        again = await _embed(c, "broken", "abc")  # within the retry interval: not loaded again
        admin = await c.post("/admin/models/broken/load", headers=ADMIN)
        state = (await _states(c))["broken"]
        assert (await _embed(c, "eager", "ab")).status_code == 200  # the others serve on
    for r in (first, again):
        assert r.status_code == 503 and r.headers["retry-after"] == "30"
        assert r.json()["error"]["code"] == "model_load_failed"
        message = r.json()["error"]["message"]
        # the model's name, no server path or library text: those are the admin's
        assert message.startswith("Model 'broken' failed to load; retry later"), message
        assert str(tmp_path) not in message and "Error" not in message
    assert admin.status_code == 503 and admin.json()["error"]["code"] == "model_load_failed"
    reason = admin.json()["error"]["message"]  # the admin API gives the reason
    assert f"the folder '{tmp_path / 'missing'}' does not exist" in reason  # not "Repo id must..."
    assert "not a model-hub id either" in reason and "HFValidationError" not in reason
    assert state["state"] == "failed" and str(tmp_path) in state["error"] and state["loads"] == 0


async def test_unloading_a_model_during_its_failing_load_answers_its_state(
    tmp_path: Any, load_gate: Gate
) -> None:
    broken = ModelConfig(model=str(tmp_path / "missing"), name="broken", load="lazy")
    async with app_client(_settings(_debug("eager"), broken)) as c:
        request = asyncio.create_task(_embed(c, "broken", "abc"))
        await load_gate.wait_reached()
        unload = asyncio.create_task(c.post("/admin/models/broken/unload", headers=ADMIN))
        await asyncio.sleep(0.05)
        load_gate.opened.set()  # the load goes on, and fails
        r = await unload
        assert r.status_code == 200, r.text  # was a 500 (the load's error)
        assert r.json()["state"] == "failed" and r.json()["error"]
        assert (await request).status_code == 503


@pytest.fixture
def noisy_load(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every lazy model's load also sees the process allocate 300 MiB that it keeps (another
    request's work, a pool starting): what RSS growth alone would charge to the model."""
    import numpy as np

    kept: list[Any] = []
    create = loading.create_engine
    loads = 0

    def noisy(config: ModelConfig, *args: Any, **kwargs: Any) -> Any:
        nonlocal loads
        loads += config.load == "lazy"
        if config.load == "lazy" and loads == 1:  # the first lazy load only
            kept.append(np.ones(300 * 2**20, dtype=np.uint8))  # every page written
        return create(config, *args, **kwargs)

    monkeypatch.setattr(loading, "create_engine", noisy)
    yield kept
    kept.clear()


async def test_a_model_is_charged_its_own_tensors_not_what_the_process_grew_by(
    minilm_path: str, noisy_load: list[Any]
) -> None:
    """MiniLM (87 MiB of weights) loads under a 250 MiB budget while the process grows by
    300 MiB more: it is charged its tensors, loads, and the eager model stays loaded (it was
    charged 331 MiB and refused with model_too_large for good)."""
    minilm = ModelConfig(
        model=minilm_path, name="minilm", load="lazy", model_warmup=False, dtype="float32"
    )
    settings = _settings(_debug("eager"), minilm, memory_budget="250MiB")
    async with app_client(settings) as c:
        r = await _embed(c, "minilm", "abc")
        assert r.status_code == 200, r.text
        states = await _states(c)
        charged = states["minilm"]
        assert charged["measured_by"] == "tensors"
        assert 80 * 2**20 < charged["resident_bytes"] < 95 * 2**20  # 22.7M fp32 parameters
        assert charged["rss_growth_bytes"] > 300 * 2**20  # what the old charge was
        assert states["eager"]["state"] == "loaded"


async def test_one_high_rss_reading_does_not_refuse_a_model_for_good(
    noisy_load: list[Any],
) -> None:
    """A model without torch tensors is charged its load's RSS growth; a reading over the
    budget is not final: the next use loads it again and measures anew."""
    settings = _settings(_debug("eager"), _debug("lazy", load="lazy"), memory_budget="250MiB")
    async with app_client(settings) as c:
        assert (await _embed(c, "lazy", "abc")).status_code == 200
        first = (await _states(c))["lazy"]
        assert first["measured_by"] == "rss" and first["resident_bytes"] > 250 * 2**20
        noisy_load.clear()  # the allocation was not the model's: it goes away
        r = await c.post("/admin/models/lazy/unload", headers=ADMIN)
        assert r.status_code == 200, r.text
        r = await _embed(c, "lazy", "abc")
        assert r.status_code == 200, r.text  # was 400 model_too_large from here on
        again = (await _states(c))["lazy"]
        assert again["loads"] == 2 and again["resident_bytes"] < 250 * 2**20


async def test_a_request_whose_own_models_leave_no_room_gets_503_at_once() -> None:
    """A request holding "a" that also needs "b" under --max-loaded-models 1 can never be
    served (its own lease keeps "a"): a 503 that says so at once, not after the load
    timeout with every other load waiting behind it."""
    from openai_compat.ground.errors import ServiceUnavailable
    from openai_compat.models.slots import request_leases

    settings = _settings(
        _debug("a", load="lazy"),
        _debug("b", load="lazy"),
        max_loaded_models=1,
        load_wait_timeout=60,
    )
    async with app_client(settings) as c:
        registry = c.app_state.registry  # type: ignore[attr-defined]
        with request_leases():
            await registry.resolve("a")
            with pytest.raises(ServiceUnavailable) as refused:
                await asyncio.wait_for(registry.resolve("b"), 10)
        assert refused.value.code == "model_capacity"
        message = refused.value.message
        assert "'a'" in message and "--max-loaded-models is 1" in message
        assert (await _embed(c, "b", "x")).status_code == 200  # alone, it loads


async def test_the_tutorials_embed_gives_back_a_model_it_does_not_use(
    tmp_path: Any, minilm_path: str
) -> None:
    """/embed without model_index looks at the tutorial's position 1 first; a reranker there
    is given back before the default embedder loads (with --max-loaded-models 1 its lease
    used to block that load until the 120 s timeout)."""
    from transformers import AutoTokenizer, BertForSequenceClassification

    folder = tmp_path / "reranker"
    BertForSequenceClassification.from_pretrained(minilm_path, num_labels=1).save_pretrained(folder)
    AutoTokenizer.from_pretrained(minilm_path).save_pretrained(folder)
    settings = _settings(
        _debug("embedder"),
        ModelConfig(model=str(folder), name="reranker", load="lazy", model_warmup=False),
        max_loaded_models=1,
        load_wait_timeout=60,
    )
    async with app_client(settings) as c:
        r = await asyncio.wait_for(c.post("/embed", json={"sentences": ["hello"]}), 30)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "embedder" and r.json()["embeddings"] == [[5.0] * 13]
        assert (await _states(c))["reranker"]["loads"] == 1  # looked at, then given back


async def test_a_model_that_fits_loads_while_another_waits_for_room(
    batch_gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Budget 100 MiB: "busy" (60) has a request in its engine, "big" (60) waits for it to
    become idle, and "small" (10) fits now: it loads and answers meanwhile (the waiting load
    used to hold the load lock)."""
    sizes = {"busy": 60 * 2**20, "big": 60 * 2**20, "small": 10 * 2**20}
    monkeypatch.setattr(
        loading.ModelLoader, "weight_bytes", staticmethod(lambda entry: sizes[entry.name])
    )
    monkeypatch.setattr(
        "openai_compat.models.memory.model_file_bytes", lambda config: sizes[config.served_name]
    )
    settings = _settings(
        _debug("busy"),
        _debug("big", load="lazy"),
        _debug("small", load="lazy"),
        memory_budget="100MiB",
        load_wait_timeout=60,
    )
    async with app_client(settings) as c:
        batch_gate.opened.clear()
        batch_gate.reached.clear()
        held = asyncio.create_task(_embed(c, "busy", "abcde"))
        await batch_gate.wait_reached()
        big = asyncio.create_task(_embed(c, "big", "x"))
        await _until(lambda: _waiting(c, "big", 1), "big to wait for room")
        batch_gate.opened.set()  # small's own batch must pass; busy's stays held meanwhile
        small = await asyncio.wait_for(_embed(c, "small", "x"), 20)
        assert small.status_code == 200 and not big.done()
        assert (await held).status_code == 200
        assert (await asyncio.wait_for(big, 20)).status_code == 200


async def test_tei_info_holds_its_model_and_leaves_its_idle_unload_planned() -> None:
    """GET /info looks at the default model: it holds a lease meanwhile, and the model's
    keep_alive unload is planned again after it (it was cancelled for good)."""
    settings = _settings(_debug("brief", load="lazy", keep_alive="1s"))
    async with app_client(settings) as c:
        assert (await _embed(c, "brief", "abc")).status_code == 200
        info = await c.get("/info")
        assert info.status_code == 200 and info.json()["model_id"] == "debug/brief"
        brief = (await _states(c))["brief"]
        assert brief["state"] == "loaded" and brief["in_flight"] == 0
        assert brief["idle_unload_in"] is not None
        await _until(lambda: _state_is(c, "brief", "unloaded"), "brief unloaded after /info")


async def test_lazy_models_serve_the_routes_that_name_no_model() -> None:
    """TEI's routes and infinity's unnamed requests find their model among the lazy ones
    (they answered "No served model can embed text" even once it had loaded)."""
    settings = _settings(_debug("first", load="lazy"), _debug("second", load="lazy"))
    async with app_client(settings) as c:
        tei = await c.post("/embed", json={"inputs": "abc"})  # nothing loaded yet
        assert tei.status_code == 200, tei.text
        assert tei.json() == [[3.0] * 13]
        states = await _states(c)
        assert states["first"]["state"] == "loaded" and states["second"]["loads"] == 0
        unnamed = await c.post("/embeddings", json={"input": ["abcd"]})
        assert unnamed.status_code == 200 and unnamed.json()["model"] == "first", unnamed.text
        assert (await c.post("/admin/models/first/unload", headers=ADMIN)).status_code == 200
        again = await c.post("/embed", json={"inputs": "ab"})  # loads its default again
        assert again.status_code == 200 and again.json() == [[2.0] * 13]


async def test_a_request_never_unloads_an_eager_model_nor_a_key_without_the_right(
    tmp_path: Any,
) -> None:
    """Any key's keep_alive 0 unloaded a shared model (the eager default too): another key's
    next request then paid a reload. An eager model stays; a keys-file key needs
    set_keep_alive = true (403 otherwise); a granted key still unloads a lazy model."""
    import hashlib

    keys = tmp_path / "keys.toml"
    keys.write_text(
        "".join(
            f'[[keys]]\nname = "{n}"\nkey_sha256 = "{hashlib.sha256(n.encode()).hexdigest()}"\n'
            + ("set_keep_alive = true\n" if n == "ops" else "")
            + "\n"
            for n in ("user", "ops")
        )
    )
    settings = _settings(_debug("eager"), _debug("kept", load="lazy"), keys_file=keys)
    async with app_client(settings) as c:

        async def embed(model: str, key: str, **extra: Any) -> httpx.Response:
            body = {"model": model, "input": "abc", **extra}
            return await c.post("/v1/embeddings", json=body, headers={"Authorization": key})

        refused = await embed("kept", "Bearer user", keep_alive=0)
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["param"] == "keep_alive"
        assert "set_keep_alive = true" in refused.json()["error"]["message"]
        assert (await embed("eager", "Bearer ops", keep_alive=0)).status_code == 200
        assert (await embed("kept", "Bearer ops", keep_alive=0)).status_code == 200
        await _until(lambda: _state_is(c, "kept", "unloaded"), "kept unloaded")
        await asyncio.sleep(0.2)  # an eager model's unload would have been planned at once
        assert (await _states(c))["eager"]["state"] == "loaded"
        assert (await _states(c))["eager"]["idle_unload_in"] is None


async def test_a_boolean_keep_alive_is_a_400() -> None:
    async with app_client(_settings(_debug("m"))) as c:
        r = await _embed(c, "m", "x", keep_alive=True)
        assert r.status_code == 400 and r.json()["error"]["param"] == "keep_alive"
        assert "not a boolean" in r.json()["error"]["message"]
