"""The Ray Serve split without a cluster (ray_serve/): the ingress's app on remote entries,
each engine call pickled to a ModelServer and its answer pickled back, as a DeploymentHandle
carries them; every route answers as the single-process app does. And the wire format and
the error mapping on their own."""

from __future__ import annotations

import pickle
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import pytest_asyncio

from openai_compat.engine.usage import TokenCountedArray
from openai_compat.errors import ServiceUnavailable
from openai_compat.ray_serve.remote import RemoteEngine, pack, unpack
from openai_compat.sparse import SparseVector
from tests.utils import assert_same_answer, strip_volatile


def test_vectors_keep_their_token_counts_and_norms_across_the_wire() -> None:
    a = np.arange(4, dtype=np.float32).view(TokenCountedArray)
    a.tokens, a.norm = 7, 2.5
    plain = np.ones((3, 4), dtype=np.float32)  # a multi-vector model's token vectors
    back = unpack(pickle.loads(pickle.dumps(pack([a, plain]))))
    assert isinstance(back[0], TokenCountedArray) and (back[0].tokens, back[0].norm) == (7, 2.5)
    assert np.array_equal(back[0], a) and np.array_equal(back[1], plain)
    assert not isinstance(back[1], TokenCountedArray)
    sparse = SparseVector(np.array([3, 9], dtype="<u4"), np.array([0.5, 1.5], "<f4"), 11)
    (again,) = unpack(pickle.loads(pickle.dumps(pack([sparse]))))
    assert isinstance(again, SparseVector) and again.tokens == 11
    assert np.array_equal(again.indices, sparse.indices)


class ActorDiedError(Exception):
    """Named as Ray's: the mapping goes by the exception's (or a base's) class name."""


class Failing:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def __getattr__(self, method: str) -> Any:
        outer = self

        class Call:
            async def remote(self, *args: Any) -> Any:
                raise outer.exc

        return Call()


async def test_a_dead_replica_is_a_retryable_503_and_other_errors_pass() -> None:
    description = {"native": ["embed"], "id2label": {}, "pooling_mode": "mean"}
    engine = RemoteEngine(Failing(type("RayTaskError", (ActorDiedError,), {})()), "m", description)
    with pytest.raises(ServiceUnavailable) as caught:
        await engine.embed(["x"])
    assert caught.value.status == 503 and caught.value.headers == {"Retry-After": "1"}
    engine = RemoteEngine(Failing(ValueError("bad")), "m", description)
    with pytest.raises(ValueError, match="bad"):
        await engine.embed(["x"])


class PickledHandle:
    """A DeploymentHandle stand-in: `handle.method.remote(*args)` calls the ModelServer with
    the arguments and the answer each through pickle, as Ray's object store does."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.calls: list[str] = []

    def __getattr__(self, method: str) -> Any:
        handle = self

        class Call:
            async def remote(self, *args: Any) -> Any:
                handle.calls.append(method)
                args = pickle.loads(pickle.dumps(args))
                result = getattr(handle.server, method)(*args)
                if hasattr(result, "__await__"):
                    result = await result
                return pickle.loads(pickle.dumps(result))

        return Call()


@pytest.fixture(scope="module")
def configs(trained_models: dict[str, Path]) -> list[dict[str, Any]]:
    return [
        {"name": "minilm", "model": "builtin:all-MiniLM-L6-v2"},
        {"name": "reranker", "model": str(trained_models["reranker"])},
        {"name": "classifier", "model": str(trained_models["classifier"])},
    ]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def clients(
    configs: list[dict[str, Any]],
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, list[PickledHandle]]]:
    """(the ingress app on pickling handles, the single-process app) on the same models."""
    from asgi_lifespan import LifespanManager

    from openai_compat.ray_serve.deployments import Ingress, ModelServer
    from openai_compat.settings import ModelConfig, Settings
    from tests.utils import app_client

    settings = Settings(models=tuple(ModelConfig(**c) for c in configs), cache_bytes=0)
    handles = []
    for c in configs:
        server = ModelServer.__new__(ModelServer)
        await server.__init__(settings, c["name"])
        handles.append(PickledHandle(server))
    ingress = Ingress.__new__(Ingress)
    await ingress.__init__(settings, [c["name"] for c in configs], *handles)
    app = ingress.__serve_build_asgi_app__()
    try:
        async with (
            app_client(settings) as single,
            LifespanManager(app) as manager,
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=manager.app), base_url="http://ray"
            ) as remote,
        ):
            yield remote, single, handles
    finally:
        for h in handles:
            await h.server.__del__()


TEXTS = ["A man is eating food.", "The stock market crashed today.", "東京は日本の首都です。"]
REQUESTS: list[tuple[str, str, Any]] = [
    ("POST", "/v1/embeddings", {"model": "minilm", "input": TEXTS}),
    ("POST", "/v1/embeddings", {"model": "minilm", "input": TEXTS, "encoding_format": "base64"}),
    ("POST", "/v1/embeddings", {"model": "minilm", "input": [[9906, 1917]]}),
    ("POST", "/v1/embeddings", {"model": "minilm", "input": "word " * 400}),
    ("POST", "/v1/embeddings", {"model": "minilm", "input": "word " * 400, "long_input": "mean"}),
    (
        "POST",
        "/v1/embeddings",
        {"model": "minilm", "input": ["late chunks here"], "long_input": "late", "chunk_tokens": 2},
    ),
    ("POST", "/v1/embeddings", {"model": "nope", "input": "x"}),
    (
        "POST",
        "/v2/embed",
        {
            "model": "minilm",
            "texts": TEXTS,
            "input_type": "search_query",
            "embedding_types": ["float", "int8", "ubinary"],
        },
    ),
    ("POST", "/embed", {"inputs": TEXTS}),
    ("POST", "/embeddings", {"model": "minilm", "input": TEXTS}),
    ("POST", "/v1/rerank", {"model": "reranker", "query": "food", "documents": TEXTS}),
    ("POST", "/v1/rerank", {"model": "minilm", "query": "food", "documents": TEXTS}),
    ("POST", "/rerank", {"query": "food", "texts": TEXTS, "raw_scores": True}),
    ("POST", "/v1/classify", {"model": "classifier", "input": ["I loved it", "awful"]}),
    ("POST", "/predict", {"inputs": [["I loved it", "awful"]], "raw_scores": True}),
    ("POST", "/predict", {"inputs": "I loved it"}),
    ("POST", "/tokenize", {"inputs": "hello world"}),
    ("GET", "/info", None),
    ("GET", "/v1/models", None),
]


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_every_route_answers_as_the_single_process_app(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient, list[PickledHandle]],
) -> None:
    remote, single, handles = clients
    for method, path, body in REQUESTS:
        theirs = await single.request(method, path, json=body)
        ours = await remote.request(method, path, json=body)
        assert ours.status_code == theirs.status_code, (path, ours.text[:300], theirs.text[:300])
        assert ours.headers["content-type"] == theirs.headers["content-type"], path
        assert_same_answer(strip_volatile(ours.json()), strip_volatile(theirs.json()), path)
    # the engine work really went through the handles (the models run "remotely")
    called = {m for h in handles for m in h.calls}
    assert {"describe", "embed", "rerank", "classify", "logits", "token_vectors"} <= called


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_the_batch_api_is_refused_with_its_ray_path(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient, list[PickledHandle]],
) -> None:
    remote, _, _ = clients
    for path in ("/v1/batches", "/v1/files", "/batches"):
        r = await remote.get(path)
        assert r.status_code == 501, path
        error = r.json()["error"]
        assert (
            error["code"] == "not_served_on_ray"
            and "batch INPUT -o OUTPUT --ray" in (error["message"])
        )
