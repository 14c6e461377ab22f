"""Behaviours the peers' own end-to-end tests check, checked here against our server (written
by us, each naming what it checks and where the peer tests it):

- infinity-emb, libs/infinity_emb/tests/end_to_end/test_api_with_dummymodel.py and
  test_authentication.py: model cards with stats, /health's unix time, the 122,880-character
  limit (422 past it), base64 equal to the floats, a matryoshka cut that keeps the first
  values as they are, 401 without the key on every route.
- vLLM, tests/entrypoints/pooling/openai/test_embedding.py: the model's own token ids (a
  batch of id lists: usage is their count), base64 and the SDK's default decode equal to the
  floats.
In process, on infinity's model-free debug engine (its vectors: the text's length, repeated)
and, for the token ids, the packaged MiniLM reading its own ids.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import httpx
import numpy as np
import pytest
import pytest_asyncio

from openai_compat.frame.settings import ModelConfig, Settings
from tests.utils import app_client

pytestmark = pytest.mark.asyncio(loop_scope="module")

KEY = "dummy-password"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def debug() -> AsyncIterator[httpx.AsyncClient]:
    models = tuple(
        ModelConfig(model=f"dummy/model{i}", name=f"dummy-{i}", engine="debugengine")
        for i in (1, 2)
    )
    async with app_client(Settings(models=models, api_key=(KEY,))) as client:
        client.headers["Authorization"] = f"Bearer {KEY}"
        yield client


async def test_infinity_model_cards_carry_stats_and_health_its_unix_time(
    debug: httpx.AsyncClient,
) -> None:
    cards = (await debug.get("/models")).json()["data"]
    assert [c["id"] for c in cards] == ["dummy-1", "dummy-2"]
    assert all(isinstance(c["stats"], dict) for c in cards)
    assert "unix" in (await debug.get("/health")).json()


async def test_infinity_input_limit_is_122880_characters(debug: httpx.AsyncClient) -> None:
    for model in ("dummy-1", "dummy-2"):
        over = await debug.post("/embeddings", json={"input": "%_" * 4097 * 15, "model": model})
        assert over.status_code == 422, over.text
        fits = await debug.post("/embeddings", json={"input": "%_" * 4096 * 15, "model": model})
        assert fits.status_code == 200 and fits.json()["model"] == model


async def test_infinity_base64_is_the_floats(debug: httpx.AsyncClient) -> None:
    body = {"input": "Hello World", "model": "dummy-1"}
    floats = (await debug.post("/embeddings", json=body)).json()["data"][0]["embedding"]
    coded = (await debug.post("/embeddings", json={**body, "encoding_format": "base64"})).json()
    decoded = np.frombuffer(base64.b64decode(coded["data"][0]["embedding"]), dtype=np.float32)
    assert decoded.tolist() == floats


async def test_infinity_embeddings_and_the_matryoshka_cut(debug: httpx.AsyncClient) -> None:
    for texts in (["This is a test sentence."], ["This is a test sentence.", "Another one."]):
        r = await debug.post("/embeddings", json={"input": texts, "model": "dummy-1"})
        data = r.json()["data"]
        assert [d["embedding"][0] for d in data] == [len(t) for t in texts]
        # infinity cuts to `dimensions` and keeps the values as they are
        r = await debug.post(
            "/embeddings", json={"input": texts, "model": "dummy-1", "dimensions": 10}
        )
        cut = r.json()["data"]
        assert [len(d["embedding"]) for d in cut] == [10] * len(texts)
        assert [d["embedding"][0] for d in cut] == [len(t) for t in texts]
    # OpenAI's shortened vectors are unit length: /v1 renormalises
    r = await debug.post(
        "/v1/embeddings", json={"input": "abc", "model": "dummy-1", "dimensions": 10}
    )
    assert np.linalg.norm(r.json()["data"][0]["embedding"]) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("GET", "/models", None),
        ("POST", "/embeddings", {"model": "dummy-1", "input": "sentence"}),
        ("POST", "/rerank", {"model": "dummy-1", "query": "Munich?", "documents": ["Munich"]}),
    ],
)
async def test_infinity_routes_need_the_key(
    debug: httpx.AsyncClient, method: str, path: str, body: dict[str, object] | None
) -> None:
    bare = await debug.request(method, path, json=body, headers={"Authorization": ""})
    assert bare.status_code == 401
    keyed = await debug.request(method, path, json=body)
    assert keyed.status_code == 200, keyed.text


@pytest.mark.slow
async def test_vllm_token_id_batches_count_their_ids_and_base64_is_the_floats() -> None:
    from openai import AsyncOpenAI

    model = ModelConfig(
        model="builtin:all-MiniLM-L6-v2", name="m", token_ids="model", quantization_range=0.3
    )
    async with app_client(Settings(models=(model,))) as client:
        sdk = AsyncOpenAI(base_url="http://test/v1", api_key="x", http_client=client)
        rows = [[4, 5, 7, 9, 20], [15, 29, 499], [24, 24, 24, 24, 24], [25, 32, 64, 77]]
        ids = await sdk.embeddings.create(model="m", input=rows, encoding_format="float")
        assert len(ids.data) == 4 and len(ids.data[0].embedding) == 384
        assert ids.usage.prompt_tokens == ids.usage.total_tokens == 17
        one = await sdk.embeddings.create(model="m", input=[1, 1, 1, 1, 1])
        assert one.usage.prompt_tokens == 5
        texts = ["Hello my name is", "The best thing about vLLM is that it supports many models"]
        floats = await sdk.embeddings.create(model="m", input=texts, encoding_format="float")
        coded = await sdk.embeddings.create(model="m", input=texts, encoding_format="base64")
        default = await sdk.embeddings.create(model="m", input=texts)  # base64, decoded by the SDK
        for f, c, d in zip(floats.data, coded.data, default.data, strict=True):
            raw = np.frombuffer(base64.b64decode(c.embedding), dtype=np.float32)  # type: ignore[arg-type]
            # JSON carries the shortest float32 repr: equal as float32, bit for bit
            np.testing.assert_array_equal(raw, np.asarray(f.embedding, dtype=np.float32))
            np.testing.assert_array_equal(raw, np.asarray(d.embedding, dtype=np.float32))
