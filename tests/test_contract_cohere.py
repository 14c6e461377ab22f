"""Cohere's routes against Cohere's published OpenAPI document (tests/contracts/cohere.json):
embed and rerank, v1 and v2, successes and errors, on the default server; and every answer
parsed by the cohere SDK's own types (`cohere.types`, `cohere.v2.types`), which is what its
clients do with them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.contract import Contract
from tests.utils import RemoteServer

pytestmark = pytest.mark.slow

# Cohere's schemas require a top-level `api_version` on embed answers, which no property
# defines and Cohere's API does not send (it is `meta.api_version`; the SDK's types have no
# such field): the running API wins.
COHERE = Contract(
    "cohere",
    not_required={
        "EmbedFloatsResponse": ("api_version",),
        "EmbedByTypeResponse": ("api_version",),
    },
)
MODEL = "all-MiniLM-L6-v2"
TYPES = ["float", "int8", "uint8", "binary", "ubinary", "base64"]


@pytest.fixture(scope="module")
def api(server: RemoteServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def test_embed_v1_and_v2_every_type(api: httpx.Client) -> None:
    from cohere import types as v1_types

    texts = ["hello", "world"]
    status, body = COHERE.post(
        api, "/v1/embed", {"model": MODEL, "texts": texts, "input_type": "search_query"}
    )
    assert status == 200 and body["response_type"] == "embeddings_floats"
    v1_types.EmbedFloatsResponse.model_validate(body)
    status, body = COHERE.post(
        api,
        "/v1/embed",
        {"model": MODEL, "texts": texts, "input_type": "classification", "embedding_types": TYPES},
    )
    assert status == 200 and body["response_type"] == "embeddings_by_type"
    v1_types.EmbedByTypeResponse.model_validate(body)
    status, body = COHERE.post(
        api,
        "/v2/embed",
        {"model": MODEL, "texts": texts, "input_type": "search_document", "embedding_types": TYPES},
    )
    assert status == 200 and set(body["embeddings"]) == set(TYPES)
    v1_types.EmbedByTypeResponse.model_validate(body)  # the v2 client parses into it too
    inputs = [{"content": [{"type": "text", "text": "hello"}]}]
    status, body = COHERE.post(
        api,
        "/v2/embed",
        {
            "model": MODEL,
            "inputs": inputs,
            "input_type": "search_query",
            "embedding_types": ["float"],
        },
    )
    assert status == 200 and len(body["embeddings"]["float"]) == 1


def test_rerank_v1_and_v2(api: httpx.Client) -> None:
    from cohere import types as v1_types
    from cohere.v2 import types as v2_types

    body = {"model": MODEL, "query": "food", "documents": ["taxes", "a man eats"], "top_n": 1}
    status, v1 = COHERE.post(api, "/v1/rerank", {**body, "return_documents": True})
    assert status == 200 and v1["results"][0]["index"] == 1
    assert v1["results"][0]["document"] == {"text": "a man eats"}
    v1_types.RerankResponse.model_validate(v1)
    status, v2 = COHERE.post(api, "/v2/rerank", body)
    assert status == 200 and [r["index"] for r in v2["results"]] == [1]
    v2_types.V2RerankResponse.model_validate(v2)


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/embed", {"model": MODEL, "texts": []}),
        (
            "/v2/embed",
            {"model": MODEL, "texts": ["x"], "input_type": "nope", "embedding_types": ["float"]},
        ),
        ("/v1/rerank", {"model": MODEL, "query": "q", "documents": ["d"], "top_n": 0}),
        ("/v2/rerank", {"model": MODEL, "query": "q"}),
        (
            "/v2/embed",
            {
                "model": "nope",
                "texts": ["x"],
                "input_type": "search_query",
                "embedding_types": ["float"],
            },
        ),
    ],
)
def test_errors_are_cohere_bodies(api: httpx.Client, path: str, body: dict[str, Any]) -> None:
    status, err = COHERE.post(api, path, body)
    assert 400 <= status < 500 and set(err) == {"message"}, (status, err)
