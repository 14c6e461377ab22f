"""Multi-vector (late-interaction) embeddings on the wire, end to end.

A folder whose architecture is Stanford's HF_ColBERT is read as sentence-transformers'
MultiVectorEncoder (as that class detects it) and answers one vector per token. The packaged
MiniLM, declared as that architecture, stands in for a ColBERT checkpoint; the families with
query/document modes are tests/test_model_families.py's.
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from tests.utils import RemoteServer

pytestmark = pytest.mark.slow
TEXT = "A man is eating food."


@pytest.fixture(scope="module")
def colbert_path(tmp_path_factory: pytest.TempPathFactory, minilm_path: str) -> Path:
    out = tmp_path_factory.mktemp("colbert") / "mini-colbert"
    shutil.copytree(minilm_path, out)
    config = json.loads((out / "config.json").read_text())
    config["architectures"] = ["HF_ColBERT"]
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def colbert_server(colbert_path: Path) -> Iterator[RemoteServer]:
    # 100k values: 260 token vectors of 384 (test_a_request_past_the_output_bound...)
    args = ["--model", f"colbert={colbert_path}", "--max-multivector-values", "100000"]
    with RemoteServer(args) as srv:
        yield srv


@pytest.fixture(scope="module")
def token_vectors(colbert_path: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(colbert_path), device="cpu")
    return np.asarray(st.encode(TEXT, output_value="token_embeddings"), dtype=np.float32)


def test_float_items_are_lists_of_vectors_with_their_shape(
    colbert_server: RemoteServer, token_vectors: np.ndarray
) -> None:
    body = httpx.post(
        colbert_server.base_url + "/embeddings",
        json={"model": "colbert", "input": [TEXT, "hi"]},
    ).json()
    first = body["data"][0]
    assert first["shape"] == list(token_vectors.shape)  # [tokens incl. CLS/SEP, 384]
    got = np.asarray(first["embedding"], dtype=np.float32)
    assert np.max(np.abs(got - token_vectors)) < 1e-4
    assert body["data"][1]["shape"][0] == 3  # [CLS] hi [SEP]


def test_base64_items_are_concatenated_rows(
    colbert_server: RemoteServer, token_vectors: np.ndarray
) -> None:
    body = httpx.post(
        colbert_server.base_url + "/embeddings",
        json={"model": "colbert", "input": TEXT, "encoding_format": "base64"},
    ).json()
    item = body["data"][0]
    rows = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4").reshape(item["shape"])
    assert np.max(np.abs(rows - token_vectors)) < 1e-4
    cut = httpx.post(
        colbert_server.base_url + "/embeddings",
        json={"model": "colbert", "input": TEXT, "dimensions": 8},
    ).json()["data"][0]
    assert cut["shape"] == [token_vectors.shape[0], 8]
    norms = np.linalg.norm(np.asarray(cut["embedding"]), axis=1)
    np.testing.assert_allclose(norms, 1.0, atol=1e-5)


def test_openai_sdk_reads_multivector_float_responses(colbert_server: RemoteServer) -> None:
    client = openai.OpenAI(base_url=colbert_server.base_url, api_key="unused", max_retries=0)
    resp = client.embeddings.create(model="colbert", input=TEXT, encoding_format="float")
    vectors = resp.data[0].embedding
    assert isinstance(vectors, list) and len(vectors[0]) == 384  # type: ignore[arg-type]


def test_rerank_is_maxsim_over_the_models_token_vectors(
    colbert_server: RemoteServer, colbert_path: Path
) -> None:
    """Late interaction: a document's score is the sum over the query's token vectors of the
    largest dot product with its own token vectors, from the model's token embeddings
    (sentence-transformers, directly); it was a 400 before."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(colbert_path), device="cpu")
    query = "What is the man eating?"
    docs = [TEXT, "The stock market crashed today.", "hi"]
    q = np.asarray(st.encode(query, output_value="token_embeddings"), dtype=np.float64)
    want = [
        float(
            (q @ np.asarray(st.encode(d, output_value="token_embeddings"), dtype=np.float64).T)
            .max(axis=1)
            .sum()
        )
        for d in docs
    ]
    for path in ("/v1/rerank", "/v2/rerank"):
        body = {"model": "colbert", "query": query, "documents": docs}
        r = httpx.post(colbert_server.url + path, json=body)
        assert r.status_code == 200, (path, r.text)
        results = r.json()["results"]
        assert [x["index"] for x in results] == sorted(range(3), key=lambda i: -want[i])
        for x in results:
            assert x["relevance_score"] == pytest.approx(want[x["index"]], rel=1e-4)
    r = httpx.post(colbert_server.url + "/v1/classify", json={"model": "colbert", "input": "x"})
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "model_not_supported"
    assert "multi-vector" in error["message"] and "it can: embed, rerank" in error["message"]
    card = httpx.get(colbert_server.base_url + "/models/colbert").json()
    assert card["capabilities"] == ["embed", "rerank"]


def test_a_request_past_the_output_bound_is_a_400_before_any_work(
    colbert_server: RemoteServer,
) -> None:
    """One vector per token: 40 inputs of 12 tokens would be 480 x 384 = 184,320 values,
    past the server's 100,000 (the issue's 0.32 MB request made a 295 MB answer). Refused
    from the token counts with a 400 naming the limit; the same bound holds for inputs the
    exact cache answers (they are served, not computed)."""
    url = colbert_server.base_url + "/embeddings"
    words = [f"w{i} alpha beta gamma delta epsilon zeta eta theta" for i in range(40)]
    refused = httpx.post(url, json={"model": "colbert", "input": words})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "output_too_large" and "max_multivector_values" in error["message"]
    assert "100000" in error["message"]
    half = httpx.post(url, json={"model": "colbert", "input": words[:20]})  # 92,160: served
    assert half.status_code == 200 and sum(d["shape"][0] for d in half.json()["data"]) == 240
    again = httpx.post(url, json={"model": "colbert", "input": words[:20] * 2})  # cache hits
    assert again.status_code == 400 and again.json()["error"]["code"] == "output_too_large"
