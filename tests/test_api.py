"""In-process API tests: the ASGI app and its lifespan, on the model-free debugengine."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import numpy as np
import pytest

from openai_compat.formats.encoding import decode_base64_embedding
from openai_compat.frame.settings import ModelConfig, Settings
from tests.utils import app_client


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(
        models=(ModelConfig(model="debug/engine", name="debug", engine="debugengine"),),
        max_inputs_per_request=4,
    )
    async with app_client(settings) as c:
        yield c


async def test_debugengine_embeddings_round_trip(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/embeddings", json={"model": "debug", "input": ["abc", "hello"]})
    assert r.status_code == 200
    body = r.json()
    # the debug engine fills 13 dimensions with the text's length
    assert body["data"][0]["embedding"] == [3.0] * 13
    assert body["data"][1]["embedding"] == [5.0] * 13
    assert body["usage"]["prompt_tokens"] == 8  # no tokenizer: the engine's own count
    r = await client.post(
        "/embeddings", json={"model": "debug", "input": "abcd", "encoding_format": "base64"}
    )
    np.testing.assert_array_equal(
        decode_base64_embedding(r.json()["data"][0]["embedding"]), np.full(13, 4.0)
    )


async def test_a_zero_vector_ranks_at_cosine_zero_not_null(client: httpx.AsyncClient) -> None:
    """Found by schemathesis: an empty query and document give zero vectors on the debug
    engine; their cosine is 0 (score 0.5), never NaN sent as null."""
    r = await client.post(
        "/v1/rerank", json={"model": "debug", "query": "", "documents": ["", "ab"]}
    )
    assert r.status_code == 200
    assert [x["relevance_score"] for x in r.json()["results"]] == [0.5, 0.5]


async def test_models_card_reports_capabilities_and_size(client: httpx.AsyncClient) -> None:
    card = (await client.get("/v1/models/debug")).json()
    assert card["capabilities"] == ["embed", "rerank"] and card["dimensions"] == 13


async def test_request_limit_is_configurable(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/embeddings", json={"model": "debug", "input": ["a"] * 5})
    assert r.status_code == 400
    assert "at most 4" in r.json()["error"]["message"]


async def test_openapi_documents_the_request_bodies(client: httpx.AsyncClient) -> None:
    schema = (await client.get("/openapi.json")).json()
    op = schema["paths"]["/v1/embeddings"]["post"]
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    name = ref.rsplit("/", 1)[-1]
    assert set(schema["components"]["schemas"][name]["properties"]) >= {
        "model",
        "input",
        "encoding_format",
        "dimensions",
        "user",
    }
    assert "400" in op["responses"]
    # its bare twin is documented too, with infinity's 422 (it is infinity's path)
    assert "422" in schema["paths"]["/embeddings"]["post"]["responses"]


@pytest.mark.parametrize(
    "document",
    [b'{"text": "a", "n": 111111111111111111111111111111}', b'{"text": "a", "f": 1e400}'],
)
async def test_a_document_we_cannot_send_back_unchanged_is_a_400(
    client: httpx.AsyncClient, document: bytes
) -> None:
    """Beyond 64 bits orjson cannot write an integer (was a 500); an infinite float would
    come back as null (lost silently)."""
    body = b'{"model": "debug", "query": "q", "return_documents": true, "documents": ['
    r = await client.post(
        "/v1/rerank",
        content=body + document + b"]}",
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400, r.text
    assert "documents" in r.json()["message"] and "[0]." in r.json()["message"]


async def test_a_min_weight_beyond_any_float_is_a_400(client: httpx.AsyncClient) -> None:
    for raw in (b"1" + b"0" * 400, b"1e400"):
        r = await client.post(
            "/v1/embeddings",
            content=b'{"model": "debug", "input": "x", "min_weight": ' + raw + b"}",
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 400, r.text
        # refused as a number, before any model is asked (a sparse model's check raised
        # OverflowError on 10**400: a 500)
        error = r.json()["error"]
        assert (error["param"], error["code"]) == ("min_weight", "invalid_value")


@pytest.mark.parametrize(
    ("metadata", "why"),
    [
        ({f"k{i}": "v" for i in range(17)}, "at most 16 pairs"),
        ({"k" * 65: "v"}, "longer than 64"),
        ({"k": "v" * 513}, "longer than 512"),
    ],
)
async def test_batch_metadata_has_openais_limits(
    client: httpx.AsyncClient, metadata: dict[str, str], why: str
) -> None:
    body = {
        "input_file_id": "file-x",
        "endpoint": "/v1/embeddings",
        "completion_window": "24h",
        "metadata": metadata,
    }
    r = await client.post("/v1/batches", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "metadata" and why in r.json()["error"]["message"]


async def test_every_reference_in_the_openapi_document_resolves(
    client: httpx.AsyncClient,
) -> None:
    """A $ref to a schema the document lacks breaks ReDoc and code generators (six request
    bodies were missing: the batch, TEI, vLLM and infinity media ones)."""
    schema = (await client.get("/openapi.json")).json()
    components = schema["components"]["schemas"]
    refs: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                refs.add(ref)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    prefix = "#/components/schemas/"
    assert all(r.startswith(prefix) for r in refs), refs
    missing = sorted(
        r.removeprefix(prefix) for r in refs if r.removeprefix(prefix) not in components
    )
    assert missing == []
    assert {"BatchCreateRequest", "TeiDecodeRequest", "TutorialEmbedRequest"} <= set(components)


async def test_one_requests_error_family_never_reaches_the_next(client: httpx.AsyncClient) -> None:
    """The in-process client shares one lifespan state dict between requests (uvicorn copies
    it): the error family a TEI request set once leaked into later /v1 errors."""
    tei = await client.post("/embed", json={"inputs": []})
    assert tei.status_code == 400 and tei.json()["error_type"] == "Empty"
    openai_error = await client.post("/v1/embeddings", json={"model": "debug", "input": []})
    assert openai_error.status_code == 400 and openai_error.json()["error"]["param"] == "input"


async def test_batch_api_off_leaves_no_files_or_batch_routes(tmp_path: object) -> None:
    """Stateless replicas (deploy/kubernetes): the Files and Batch APIs are another pod's,
    so they are not here at all (404) and no job runner starts; the rest serves as usual."""
    debug = ModelConfig(model="debug/engine", name="debug", engine="debugengine")
    settings = Settings(models=(debug,), batch_api=False, data_dir=tmp_path, cache_bytes=0)
    async with app_client(settings) as c:
        for path in ("/v1/files", "/v1/batches", "/files", "/batches"):
            assert (await c.get(path)).status_code == 404, path
        assert c.app_state.batches._task is None  # type: ignore[attr-defined]  # not started
        r = await c.post("/v1/embeddings", json={"model": "debug", "input": "abc"})
        assert r.status_code == 200
        assert "/v1/files" not in (await c.get("/openapi.json")).json()["paths"]


async def test_too_many_inputs_are_refused_before_the_list_is_walked(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#61 item 5: a batch line of 5 million one-word strings (20 MB) held the event loop
    0.3 s while /v1/embeddings looked through them for Jina's content items, before the
    count refused them; the count now comes first (max_inputs_per_request is 4 here)."""
    from openai_compat.api.openai import embeddings

    def walked(given: object) -> None:
        raise AssertionError("the input list was walked before its count was checked")

    monkeypatch.setattr(embeddings, "content_items", walked)
    r = await client.post("/v1/embeddings", json={"model": "debug", "input": ["a"] * 5})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["code"], error["param"]) == ("too_many_inputs", "input")
    # one list of token ids is one input, however long (OpenAI's reading): not refused
    monkeypatch.undo()
    ids = await client.post("/v1/embeddings", json={"model": "debug", "input": [7] * 50})
    assert ids.status_code == 200, ids.text
