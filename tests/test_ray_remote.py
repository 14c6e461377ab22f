"""The Ray Serve split without a cluster (ray_serve/): the ingress's app on remote entries,
each engine call pickled to a ModelServer and its answer pickled back, as a DeploymentHandle
carries them; every route answers as the single-process app does. And the wire format and
the error mapping on their own."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import pytest_asyncio

from openai_compat.engine.usage import TokenCountedArray
from openai_compat.formats.sparse import SparseVector
from openai_compat.ground.errors import ServiceUnavailable
from openai_compat.ray_serve.remote import RemoteEngine, pack, unpack
from tests.utils import assert_same_answer, strip_volatile

# The deployments' async __del__ is Ray Serve's shutdown hook: the fixtures await it, as Serve
# does, and Python's own call at collection then makes a coroutine nobody awaits.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:coroutine '\w+\.__del__' was never awaited:RuntimeWarning"
)


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
    """A handle whose replica is gone: like Ray's, `.remote()` returns at once, and the
    response raises when awaited or, streamed, when iterated."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def options(self, **_: Any) -> Failing:
        return self

    def __getattr__(self, method: str) -> Any:
        exc = self.exc

        class Response:
            def __await__(self) -> Any:
                raise exc
                yield  # a generator, as __await__ must be

            def __aiter__(self) -> Response:
                return self

            async def __anext__(self) -> Any:
                raise exc

            def cancel(self) -> None:
                pass

        class Call:
            def remote(self, *args: Any, **kwargs: Any) -> Response:
                return Response()

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
    """A DeploymentHandle stand-in: `handle.method.remote(*args)` calls the server with the
    arguments and the answer each through pickle, as Ray's object store does; with
    `options(stream=True)`, the method's async generator, each item pickled."""

    def __init__(self, server: Any, stream: bool = False) -> None:
        self.server, self.stream = server, stream
        self.calls: list[str] = []
        self.background: list[bool] = []  # the flag of each engine call

    def options(self, stream: bool = False) -> PickledHandle:
        other = PickledHandle(self.server, stream)
        other.calls, other.background = self.calls, self.background
        return other

    def __getattr__(self, method: str) -> Any:
        handle = self

        class Call:
            def remote(self, *args: Any, **kwargs: Any) -> Any:
                handle.calls.append(method)
                if "background" in kwargs:
                    handle.background.append(kwargs["background"])
                args, kwargs = pickle.loads(pickle.dumps((args, kwargs)))
                if handle.stream:
                    return self._stream(args, kwargs)
                return self._call(args, kwargs)

            async def _call(self, args: Any, kwargs: Any) -> Any:
                result = getattr(handle.server, method)(*args, **kwargs)
                if hasattr(result, "__await__"):
                    result = await result
                return pickle.loads(pickle.dumps(result))

            async def _stream(self, args: Any, kwargs: Any) -> Any:
                async for item in getattr(handle.server, method)(*args, **kwargs):
                    yield pickle.loads(pickle.dumps(item))

        return Call()


@pytest.fixture(scope="module")
def configs(
    trained_models: dict[str, Path], family_folders: dict[str, Path]
) -> list[dict[str, Any]]:
    return [
        {"name": "minilm", "model": "builtin:all-MiniLM-L6-v2"},
        {"name": "reranker", "model": str(trained_models["reranker"])},
        {"name": "classifier", "model": str(trained_models["classifier"])},
        # the 2026 families (#40): a query side and a causal-LM reranker across the wire
        *(
            {"name": name, "model": str(family_folders[name])}
            for name in ("qwen3-embed", "qwen3-rerank", "colbert")
        ),
    ]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def clients(
    configs: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, list[PickledHandle]]]:
    """(the ingress app on pickling handles, with its batch server; the single-process app)
    on the same models."""
    from asgi_lifespan import LifespanManager

    from openai_compat.frame.settings import ModelConfig, Settings
    from openai_compat.ray_serve.batch import BatchServer
    from openai_compat.ray_serve.deployments import Ingress, ModelServer
    from tests.utils import app_client

    settings = Settings(
        models=tuple(ModelConfig(**c) for c in configs),
        dtype="float32",  # replicas and the single process alike (app_client's default)
        cache_bytes=0,
        data_dir=tmp_path_factory.mktemp("ray-data"),
        batch_max_file_bytes=64 * 1024,
    )
    handles = []
    for c in configs:
        server = ModelServer.__new__(ModelServer)
        await server.__init__(settings, c["name"])
        handles.append(PickledHandle(server))
    names = [c["name"] for c in configs]
    batch = BatchServer.__new__(BatchServer)
    await batch.__init__(settings, names, *handles)
    ingress = Ingress.__new__(Ingress)
    await ingress.__init__(settings, names, PickledHandle(batch), *handles)
    app = ingress.__serve_build_asgi_app__()
    alone = settings.model_copy(update={"data_dir": tmp_path_factory.mktemp("single-data")})
    try:
        async with (
            app_client(alone) as single,
            LifespanManager(app) as manager,
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=manager.app), base_url="http://ray"
            ) as remote,
        ):
            remote.batch_server = batch  # type: ignore[attr-defined]
            yield remote, single, handles
    finally:
        await batch.__del__()
        await ingress.__del__()
        for h in handles:
            await h.server.__del__()


TEXTS = ["A man is eating food.", "The stock market crashed today.", "東京は日本の首都です。"]
FAMILY = ["paris is the capital of france", "a man is eating food", "berlin , germany"]
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
    ("POST", "/v1/embeddings", {"model": "qwen3-embed", "input": FAMILY, "input_type": "query"}),
    (
        "POST",
        "/v1/embeddings",
        {"model": "colbert", "input": FAMILY, "input_type": "query", "encoding_format": "base64"},
    ),
    ("POST", "/v1/embeddings", {"model": "colbert", "input": FAMILY}),
    ("POST", "/v2/rerank", {"model": "colbert", "query": "paris", "documents": FAMILY}),
    ("POST", "/v2/rerank", {"model": "qwen3-rerank", "query": "paris", "documents": FAMILY}),
    (
        "POST",
        "/rerank",
        {"model": "qwen3-rerank", "query": "paris", "texts": FAMILY, "raw_scores": True},
    ),
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
        if body and FAMILY in (body.get("input"), body.get("documents"), body.get("texts")):
            assert ours.status_code == 200, (path, ours.text[:300])  # the families answer
        assert ours.headers["content-type"] == theirs.headers["content-type"], path
        assert_same_answer(strip_volatile(ours.json()), strip_volatile(theirs.json()), path)
    # the engine work really went through the handles (the models run "remotely")
    called = {m for h in handles for m in h.calls}
    assert {"describe", "embed", "rerank", "classify", "logits", "token_vectors"} <= called


BATCH_LINES = [
    {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": "minilm", "input": TEXTS},
    },
    {
        "custom_id": "b",
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": "minilm", "input": "one more", "encoding_format": "base64"},
    },
    {
        "custom_id": "c",
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": "nope", "input": "x"},
    },
]


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_the_batch_api_runs_on_the_batch_server(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient, list[PickledHandle]],
) -> None:
    """Files and batches through the ingress: stored and run by the batch server, each line
    sent to the model deployment flagged background; the output equals what the
    single-process app answers to the same requests."""
    remote, single, handles = clients
    minilm = handles[0]
    before = len(minilm.background)
    jsonl = b"".join(orjson.dumps(line) + b"\n" for line in BATCH_LINES)
    r = await remote.post(
        "/v1/files", files={"file": ("in.jsonl", jsonl)}, data={"purpose": "batch"}
    )
    assert r.status_code == 200, r.text
    file_id = r.json()["id"]
    r = await remote.get(f"/v1/files/{file_id}/content")
    assert r.status_code == 200 and r.content == jsonl  # a download streams back whole
    r = await remote.post(
        "/v1/batches",
        json={"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"},
    )
    assert r.status_code == 200, r.text
    batch_id = r.json()["id"]
    for _ in range(600):
        job = (await remote.get(f"/v1/batches/{batch_id}")).json()
        if job["status"] in ("completed", "failed", "expired", "cancelled"):
            break
        await asyncio.sleep(0.1)
    assert job["status"] == "completed", job
    assert job["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    out = (await remote.get(f"/v1/files/{job['output_file_id']}/content")).content
    out += (await remote.get(f"/v1/files/{job['error_file_id']}/content")).content  # "c"
    rows = {row["custom_id"]: row for row in map(orjson.loads, out.splitlines())}
    for line in BATCH_LINES:
        want = await single.post(line["url"], json=line["body"])
        got = rows[line["custom_id"]]["response"]
        assert got["status_code"] == want.status_code
        assert_same_answer(strip_volatile(got["body"]), strip_volatile(want.json()))
    # the lines reached the model deployment flagged background (after live calls there)
    assert minilm.background[before:] and all(minilm.background[before:])
    listed = (await remote.get("/v1/batches")).json()["data"]
    assert [b["id"] for b in listed] == [batch_id]


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_batch_server_limits_and_failures_reach_the_client(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient, list[PickledHandle]],
) -> None:
    from openai_compat.frame.settings import Settings
    from openai_compat.ray_serve.batch import with_batch_api
    from openai_compat.web.app import create_app

    remote, _, _ = clients
    big = b'{"custom_id": "x"}\n' * 5000  # 95 KB, over batch_max_file_bytes (64 KiB)
    r = await remote.post("/v1/files", files={"file": ("in.jsonl", big)}, data={"purpose": "batch"})
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error", r.text
    r = await remote.get("/v1/files/file-nope")
    assert r.status_code == 404 and "error" in r.json()
    # the batch server gone: a retryable 503 in the route's format, never a 500
    app = with_batch_api(create_app(Settings()), Failing(ActorDiedError("gone")))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://ray"
    ) as client:
        r = await client.get("/v1/batches")
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "batch_server_unavailable"
    assert "(ActorDiedError)" in r.json()["error"]["message"]  # the replica's, not a TypeError


def test_the_batch_server_is_one_replica_pinned_to_the_head_by_default(tmp_path: Path) -> None:
    """[ray_batch]: resources only; replicas or autoscaling would split the data dir's owner."""
    from openai_compat.frame.config import build_settings
    from openai_compat.frame.model_config import ConfigError
    from openai_compat.frame.settings import Settings

    default = Settings().ray_batch
    assert default.num_replicas == 1 and default.autoscaling_config is None
    assert default.ray_actor_options == {
        "num_cpus": 0,
        "resources": {"node:__internal_head__": 0.001},
    }
    config = tmp_path / "c.toml"
    config.write_text("[ray_batch]\nray_actor_options = {num_cpus = 0.5, resources = {disk = 1}}\n")
    assert build_settings({"config": str(config)}).ray_batch.ray_actor_options["resources"] == {
        "disk": 1
    }
    for bad in ("num_replicas = 2", "autoscaling_config = {min_replicas = 1, max_replicas = 2}"):
        config.write_text(f"[ray_batch]\n{bad}\n")
        with pytest.raises(ConfigError, match="one replica"):
            build_settings({"config": str(config)})


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_an_upload_whose_client_vanishes_is_dropped(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient, list[PickledHandle]],
) -> None:
    """Half an upload, then the client is gone: the batch server stores nothing and holds
    nothing for the request afterwards."""
    from openai_compat.ray_serve.batch import forward

    remote, _, _ = clients
    batch = remote.batch_server  # type: ignore[attr-defined]
    before = (await remote.get("/v1/files")).json()["data"]
    head = (
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n'
    )
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": head + b'{"custom_id": "a"}\n' * 500, "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # a client that is gone sends nothing more
        raise AssertionError

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/files",
        "raw_path": b"/v1/files",
        "query_string": b"",
        "headers": [
            (b"content-type", b"multipart/form-data; boundary=b"),
            (b"content-length", b"60000"),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 80),
    }
    await asyncio.wait_for(forward(PickledHandle(batch), scope, receive, send), 30)
    assert not batch.calls  # nothing left waiting for the rest of the body
    assert (await remote.get("/v1/files")).json()["data"] == before
    assert not any(m.get("status") == 200 for m in sent)


def test_distinct_served_names_get_distinct_deployments() -> None:
    from openai_compat.ray_serve.deployments import deployment_name

    names = ["a/b", "a_b", "a b", "a:b", "minilm", "bge.small-v1.5"]
    deployments = [deployment_name(n) for n in names]
    assert len(set(deployments)) == len(names)  # "a/b" and "a_b" were both model-a_b
    assert deployments[4:] == ["model-minilm", "model-bge.small-v1.5"]  # safe names as is
    assert all(d.startswith("model-a_b") for d in deployments[:4])
