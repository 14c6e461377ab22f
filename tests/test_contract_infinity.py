"""infinity-emb's bare routes against infinity's published OpenAPI document
(tests/contracts/infinity.json, 0.0.77): health, models, embeddings (text and image), rerank
and classify, and its 422 for bodies its schema refuses, on a server with a CLIP model, a text
model, a reranker and a classifier. The /v1 routes keep OpenAI's 400 for the same mistakes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.contract import Contract
from tests.media_samples import data_uri, png
from tests.utils import RemoteServer

pytestmark = pytest.mark.slow

INFINITY = Contract("infinity")


@pytest.fixture(scope="module")
def api(multi_server: RemoteServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=multi_server.url, timeout=60) as client:
        yield client


def test_health_and_models(api: httpx.Client) -> None:
    health = INFINITY.check("/health", "get", api.get("/health"))
    assert set(health) == {"unix"}
    models = INFINITY.check("/models", "get", api.get("/models"))
    assert [m["id"] for m in models["data"]] == ["clip", "minilm", "reranker", "sentiment"]


def test_embeddings_rerank_and_classify(api: httpx.Client) -> None:
    status, body = INFINITY.post(api, "/embeddings", {"model": "minilm", "input": ["a", "b"]})
    assert status == 200 and len(body["data"]) == 2
    status, body = INFINITY.post(api, "/embeddings", {"input": "a"})  # no model: the default one
    assert status == 200 and body["model"] == "clip"
    status, body = INFINITY.post(
        api, "/embeddings_image", {"model": "clip", "input": [data_uri(png(), "image/png")]}
    )
    assert status == 200 and len(body["data"]) == 1
    docs = ["Boil the pasta.", "Taxes rose."]
    status, body = INFINITY.post(
        api, "/rerank", {"query": "pasta", "documents": docs, "top_n": 1, "return_documents": True}
    )
    assert status == 200 and body["results"][0]["document"] == docs[0]
    status, body = INFINITY.post(api, "/classify", {"input": ["I love it"], "model": "sentiment"})
    assert status == 200 and {d["label"] for d in body["data"][0]} == {"negative", "positive"}


@pytest.mark.parametrize(
    "path, body, v1",
    [
        ("/rerank", {"query": "q", "documents": ["d"], "top_n": 0}, "/v1/rerank"),
        ("/rerank", {"query": "q", "documents": []}, None),
        ("/classify", {"input": []}, None),
        ("/embeddings", {"model": "minilm", "input": "x" * 122_881}, None),
        ("/embeddings", {"model": "minilm"}, "/v1/embeddings"),
    ],
)
def test_schema_invalid_bodies_are_infinitys_422(
    api: httpx.Client, path: str, body: dict[str, Any], v1: str | None
) -> None:
    status, err = INFINITY.post(api, path, body)
    assert status == 422 and err["detail"] and {"loc", "msg", "type"} <= set(err["detail"][0])
    if v1 is not None:  # the prefixed route keeps its own family's 400
        assert api.post(v1, json={**body, "model": "minilm"}).status_code == 400
