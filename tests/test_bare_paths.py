"""Every /v1 and /v2 route's bare twin, route by route, as docs/api.md's "Bare paths" table
states it: the same answer (files, batches, a model card), infinity-emb's (embeddings, the
model list, rerank and classify bodies), or none (a Cohere embed body at /embed is a 400).
A new /v1 or /v2 route fails the first test until it has a row here and in the docs."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import numpy as np
import pytest
import pytest_asyncio

from openai_compat.frame.settings import ModelConfig, Settings
from tests.utils import ROOT, app_client

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "all-MiniLM-L6-v2"

# (method, /v1 or /v2 path) -> what its bare path does
TWINS: dict[tuple[str, str], str] = {
    ("post", "/v1/embeddings"): "infinity",
    ("get", "/v1/models"): "infinity",
    ("get", "/v1/models/{model_id}"): "same",
    ("get", "/v1/files"): "same",
    ("post", "/v1/files"): "same",
    ("get", "/v1/files/{file_id}"): "same",
    ("delete", "/v1/files/{file_id}"): "same",
    ("get", "/v1/files/{file_id}/content"): "same",
    ("get", "/v1/batches"): "same",
    ("post", "/v1/batches"): "same",
    ("get", "/v1/batches/{batch_id}"): "same",
    ("post", "/v1/batches/{batch_id}/cancel"): "same",
    ("post", "/v1/embed"): "none",
    ("post", "/v2/embed"): "none",
    ("post", "/v1/rerank"): "infinity",
    ("post", "/v2/rerank"): "infinity",
    ("post", "/v1/classify"): "infinity",
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client() -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(models=(ModelConfig(model="builtin:all-MiniLM-L6-v2", name=MODEL),))
    async with app_client(settings) as c:
        yield c


async def test_every_prefixed_route_has_a_row_here_and_in_the_docs(
    client: httpx.AsyncClient,
) -> None:
    paths = (await client.get("/openapi.json")).json()["paths"]
    routes = {
        (method, path) for path, ops in paths.items() if re.match(r"/v\d/", path) for method in ops
    }
    assert routes == set(TWINS)
    docs = (ROOT / "docs" / "api.md").read_text()
    table = docs[docs.index("## Bare paths") : docs.index("## Embeddings, rerank")]
    for _, path in TWINS:
        assert f"{path}`" in table or f"{path}," in table, path


async def test_embeddings_bare_is_infinitys(client: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "input": ["A man is eating food."]}
    v1 = (await client.post("/v1/embeddings", json=body)).json()
    bare = (await client.post("/embeddings", json=body)).json()
    # infinity's defaults: no model (the default one answers), dimensions 0 = all
    unnamed = await client.post("/embeddings", json={"input": body["input"], "dimensions": 0})
    assert unnamed.status_code == 200, unnamed.text
    for other in (bare, unnamed.json()):
        assert other["model"] == MODEL
        np.testing.assert_allclose(
            other["data"][0]["embedding"], v1["data"][0]["embedding"], atol=1e-6
        )
    # /v1 keeps OpenAI's contract: model is required there
    r = await client.post("/v1/embeddings", json={"input": ["x"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"


async def test_models_bare_is_infinitys_and_a_card_is_the_same(client: httpx.AsyncClient) -> None:
    v1 = (await client.get("/v1/models")).json()
    bare = (await client.get("/models")).json()
    assert [m["id"] for m in bare["data"]] == [m["id"] for m in v1["data"]] == [MODEL]
    assert v1["data"][0]["owned_by"] == "openai-compat"
    assert bare["data"][0]["owned_by"] == "infinity" and "stats" in bare["data"][0]
    card = (await client.get(f"/models/{MODEL}")).json()
    assert card == (await client.get(f"/v1/models/{MODEL}")).json()
    assert (await client.get("/models/nope")).status_code == 404


async def test_files_and_batches_are_the_same_without_v1(client: httpx.AsyncClient) -> None:
    line = b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"model": '
    line += f'"{MODEL}", "input": "x"}}}}'.encode()
    up = await client.post("/files", files={"file": ("a.jsonl", line)}, data={"purpose": "batch"})
    assert up.status_code == 200, up.text
    file_id = up.json()["id"]
    for path in (f"/files/{file_id}", "/files"):
        assert (await client.get(path)).json() == (await client.get("/v1" + path)).json()
    content = await client.get(f"/files/{file_id}/content")
    assert content.content == line == (await client.get(f"/v1/files/{file_id}/content")).content

    made = await client.post(
        "/batches",
        json={"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"},
    )
    assert made.status_code == 200, made.text
    batch_id = made.json()["id"]
    listed = (await client.get("/batches")).json()
    assert [b["id"] for b in listed["data"]] == [batch_id]
    cancel = await client.post(f"/batches/{batch_id}/cancel")
    assert cancel.status_code == 200 and cancel.json()["status"] in ("cancelling", "cancelled")
    got = (await client.get(f"/batches/{batch_id}")).json()
    assert got["id"] == batch_id and got == (await client.get(f"/v1/batches/{batch_id}")).json()

    # a file a batch reads is kept (400 on both paths); a free one is deleted
    in_use = await client.delete(f"/files/{file_id}")
    assert (
        in_use.status_code == 400
        and in_use.json() == (await client.delete(f"/v1/files/{file_id}")).json()
    )
    spare = await client.post(
        "/files", files={"file": ("b.jsonl", line)}, data={"purpose": "batch"}
    )
    gone = await client.delete(f"/files/{spare.json()['id']}")
    assert gone.status_code == 200 and gone.json()["deleted"] is True
    assert (await client.get(f"/v1/files/{spare.json()['id']}")).status_code == 404


@pytest.mark.parametrize("version", ["v1", "v2"])
async def test_cohere_embed_has_no_bare_twin(client: httpx.AsyncClient, version: str) -> None:
    body = {"model": MODEL, "texts": ["x"], "input_type": "search_query"}
    if version == "v2":
        body["embedding_types"] = ["float"]
    assert (await client.post(f"/{version}/embed", json=body)).status_code == 200
    r = await client.post("/embed", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "unknown_dialect"
    assert "'sentences' (tutorial)" in error["message"] and "'inputs' (tei)" in error["message"]


@pytest.mark.parametrize("version", ["v1", "v2"])
async def test_cohere_rerank_at_bare_rerank_is_infinitys(
    client: httpx.AsyncClient, version: str
) -> None:
    body = {"model": MODEL, "query": "food", "documents": ["taxes", "a man eats"], "top_n": 2}
    cohere = (await client.post(f"/{version}/rerank", json=body)).json()
    bare = (await client.post("/rerank", json=body)).json()
    assert bare["object"] == "rerank" and "meta" not in bare  # infinity's shape, not Cohere's
    assert [(r["index"], r["relevance_score"]) for r in bare["results"]] == [
        (r["index"], r["relevance_score"]) for r in cohere["results"]
    ]


async def test_classify_body_at_bare_classify_is_infinitys(client: httpx.AsyncClient) -> None:
    """The only model here cannot classify: the same OpenAI-envelope 400 both ways shows the
    body was read as infinity's classify (the tutorial's would ask for 'sentences')."""
    body = {"model": MODEL, "input": ["I love it"]}
    v1 = await client.post("/v1/classify", json=body)
    bare = await client.post("/classify", json=body)
    assert v1.status_code == bare.status_code == 400
    assert bare.json() == v1.json() and bare.json()["error"]["code"] == "model_not_supported"
