"""OpenAI's routes against OpenAI's published OpenAPI document (tests/contracts/openai.json):
embeddings, models, files and batches, successes and errors, on the default server.

Where the spec is stricter than OpenAI's running API, the running API wins, each noted:
`CreateEmbeddingRequest` is `additionalProperties: false` but clients send extensions
through `extra_body` (we accept them; docs/api.md lists ours); Batch objects carry `null` for
unset timestamps in OpenAI's own examples and SDK types, though the schema types them as
integers: those keys are dropped from the body before it is validated (BATCH_NULLS); the
spec's `Embedding.embedding` is an array of numbers only, while the API (and the SDK, by
default) sends `encoding_format: "base64"` strings: those are decoded before validation.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from tests.contract import Contract
from tests.utils import RemoteServer

pytestmark = pytest.mark.slow

OPENAI = Contract("openai", error_schema="ErrorResponse")
MODEL = "all-MiniLM-L6-v2"
# Batch keys OpenAI's API and SDK give as null until set (its examples do too), which the
# schema types as non-null: validated as absent.
BATCH_NULLS = (
    "errors",
    "output_file_id",
    "error_file_id",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
    "metadata",
)


@pytest.fixture(scope="module")
def api(server: RemoteServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url + "/v1", timeout=60) as client:
        yield client


def _check(path: str, method: str, r: httpx.Response, drop: tuple[str, ...] = ()) -> Any:
    if drop:
        body = {k: v for k, v in r.json().items() if not (k in drop and v is None)}
        r = httpx.Response(r.status_code, json=body)
    return OPENAI.check(path, method, r)


def test_embeddings_float_and_base64(api: httpx.Client) -> None:
    r = api.post("/embeddings", json={"model": MODEL, "input": ["a", "b"]})
    body = _check("/embeddings", "post", r)
    assert r.status_code == 200 and len(body["data"]) == 2
    r = api.post("/embeddings", json={"model": MODEL, "input": "a", "encoding_format": "base64"})
    decoded = r.json()
    floats = np.frombuffer(base64.b64decode(decoded["data"][0]["embedding"]), dtype=np.float32)
    decoded["data"][0]["embedding"] = floats.tolist()
    _check("/embeddings", "post", httpx.Response(r.status_code, json=decoded))
    np.testing.assert_allclose(floats, body["data"][0]["embedding"], atol=1e-5)  # batch of 2
    r = api.post("/embeddings", json={"model": MODEL, "input": [[1820, 374]], "dimensions": 8})
    assert len(_check("/embeddings", "post", r)["data"][0]["embedding"]) == 8


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": MODEL, "input": []}, "input"),
        ({"model": MODEL, "input": [[]]}, "input"),  # a token array has minItems 1
        ({"model": MODEL, "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x"}, "model"),
        ({"model": MODEL, "input": "x", "dimensions": 0}, "dimensions"),
    ],
)
def test_embedding_errors(api: httpx.Client, body: dict[str, Any], param: str) -> None:
    r = api.post("/embeddings", json=body)
    assert r.status_code == 400
    assert _check("/embeddings", "post", r)["error"]["param"] == param
    r = api.post("/embeddings", json={"model": "gpt-nope", "input": "x"})
    assert r.status_code == 404 and _check("/embeddings", "post", r)["error"]["param"] == "model"


def test_models(api: httpx.Client) -> None:
    listed = _check("/models", "get", api.get("/models"))
    assert [m["id"] for m in listed["data"]] == [MODEL, "text-embedding-3-small"]  # + alias
    card = _check("/models/{model}", "get", api.get(f"/models/{MODEL}"))
    assert card["id"] == MODEL
    r = api.get("/models/nope")
    assert r.status_code == 404 and _check("/models/{model}", "get", r)


def test_files_and_batches(api: httpx.Client) -> None:
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": MODEL, "input": "x"},
    }
    r = api.post("/files", files={"file": ("a.jsonl", json.dumps(line))}, data={"purpose": "batch"})
    made = _check("/files", "post", r)
    assert "expires_at" not in made and "status_details" not in made  # unset, not null
    assert _check("/files/{file_id}", "get", api.get(f"/files/{made['id']}"))["id"] == made["id"]
    assert made["id"] in [f["id"] for f in _check("/files", "get", api.get("/files"))["data"]]
    r = api.post(
        "/batches",
        json={
            "input_file_id": made["id"],
            "endpoint": "/v1/embeddings",
            "completion_window": "24h",
        },
    )
    batch = _check("/batches", "post", r, BATCH_NULLS)
    deadline = time.monotonic() + 60
    while batch["status"] not in ("completed", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
        batch = _check(
            "/batches/{batch_id}", "get", api.get(f"/batches/{batch['id']}"), BATCH_NULLS
        )
    assert batch["status"] == "completed", batch
    listed = api.get("/batches")
    assert _check(
        "/batches",
        "get",
        httpx.Response(
            200,
            json={
                **listed.json(),
                "data": [
                    {k: v for k, v in b.items() if not (k in BATCH_NULLS and v is None)}
                    for b in listed.json()["data"]
                ],
            },
        ),
    )
    r = api.post(f"/batches/{batch['id']}/cancel")  # already completed: it stays completed
    cancel = _check("/batches/{batch_id}/cancel", "post", r, BATCH_NULLS)
    assert r.status_code == 200 and cancel["status"] == "completed"
    content = api.get(f"/files/{batch['output_file_id']}/content")
    assert (
        content.status_code == 200 and json.loads(content.text.splitlines()[0])["custom_id"] == "a"
    )
    # the spec's media type (it was application/jsonl)
    assert content.headers["content-type"].split(";")[0] == "application/json"
    r = api.delete(f"/files/{batch['output_file_id']}")
    assert _check("/files/{file_id}", "delete", r)["deleted"] is True
    r = api.get("/files/file-nope")
    assert r.status_code == 404 and _check("/files/{file_id}", "get", r)
