"""BGE-M3 served whole (issue #63), against FlagEmbedding's own BGEM3FlagModel on the tiny
random BGE-M3 folder (models/demo_m3.py), through a real server process on 127.0.0.1:
`output_types` on /v1/embeddings (each output alone, several from one pass, float and
base64), TEI's /embed_sparse, rerank's hybrid and its score modes on the Cohere, Jina and TEI
shapes with per-model weights, the exact cache keyed by what was asked, the Batch API, and
the refusals. FlagEmbedding runs in its own environment (tests/reference/flag.py)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from openai_compat.models.demo_m3 import build_bge_m3
from tests.reference.flag import flag_reference
from tests.utils import RemoteServer, server_with

pytestmark = pytest.mark.slow

TEXTS = [
    "the man is eating food and the man is happy",
    "zzz the cat sleeps",
    "paris is the capital of france",
    "stock prices fell",
]
QUERY = "what is the capital of france"
DOCS = ["paris is the capital of france", "the stock market crashed", "a man eating bread"]
WEIGHTS = [1.0, 0.5, 0.0]  # the second model's hybrid_weights: dense and sparse alone
TOKENS = 12 + 6 + 8 + 5  # <s> ... </s> of each text
OUTPUTS = ("dense", "sparse", "multivector")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bge_m3(tmp_path_factory.mktemp("m3") / "bge-m3")


@pytest.fixture(scope="module")
def reference(folder: Path) -> dict[str, Any]:
    return flag_reference(folder, [*TEXTS, QUERY], [(QUERY, d) for d in DOCS], WEIGHTS)


@pytest.fixture(scope="module")
def srv(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    models = [
        {"name": "bge-m3", "model": str(folder)},
        {"name": "bge-m3-weighted", "model": str(folder), "hybrid_weights": WEIGHTS},
        {"name": "debug", "model": "debug/engine", "engine": "debugengine"},
    ]
    with server_with(tmp_path_factory.mktemp("m3-server"), models) as server:
        yield server


def _post(srv: RemoteServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=60)


def _embed(srv: RemoteServer, texts: list[str] = TEXTS, **extra: Any) -> dict[str, Any]:
    r = _post(srv, "/v1/embeddings", {"model": "bge-m3", "input": texts, **extra})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _sparse_of(body: dict[str, Any]) -> dict[str, float]:
    indices, values = body["indices"], body["values"]
    if isinstance(indices, str):  # base64: little-endian uint32 and float32
        indices = np.frombuffer(base64.b64decode(indices), dtype="<u4").tolist()
        values = np.frombuffer(base64.b64decode(values), dtype="<f4").tolist()
    assert indices == sorted(indices)  # ascending, as for SPLADE
    return {str(i): float(v) for i, v in zip(indices, values, strict=True)}


def _check_sparse(got: dict[str, float], want: dict[str, float]) -> None:
    assert got.keys() == want.keys()
    np.testing.assert_allclose([got[k] for k in want], list(want.values()), atol=1e-5)


def _metric(text: str, name: str, model: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("model") == model:
                return float(sample.value)
    return 0.0


def test_each_output_alone_equals_flagembeddings(
    srv: RemoteServer, reference: dict[str, Any]
) -> None:
    """No option: the dense vectors (OpenAI clients unchanged); one type: that type's usual
    form (sparse as SPLADE's, multivector with its shape), float and base64."""
    n = len(TEXTS)
    plain = _embed(srv)
    got = [d["embedding"] for d in plain["data"]]
    np.testing.assert_allclose(got, reference["dense"][:n], atol=1e-5)
    assert plain["usage"]["prompt_tokens"] == TOKENS
    assert _embed(srv, output_types=["dense"])["data"][0]["embedding"] == got[0]

    for fmt in ("float", "base64"):
        sparse = _embed(srv, output_types=["sparse"], encoding_format=fmt)
        assert sparse["usage"]["prompt_tokens"] == TOKENS
        for item, want in zip(sparse["data"], reference["sparse"], strict=False):
            _check_sparse(_sparse_of(item["embedding"]), want)
        many = _embed(srv, output_types=["multivector"], encoding_format=fmt)
        for item, want in zip(many["data"], reference["colbert"], strict=False):
            shape = item["shape"]
            assert shape == [len(want), 32]  # the tokens after <s>, </s> kept
            raw = item["embedding"]
            if fmt == "base64":
                raw = np.frombuffer(base64.b64decode(raw), dtype="<f4").reshape(shape)
            np.testing.assert_allclose(raw, want, atol=1e-5)

    # SPLADE's options apply to the lexical weights: the largest 2, their tokens named
    top = _embed(srv, output_types=["sparse"], top_k=2, return_tokens=True)["data"][0]
    want = sorted(reference["sparse"][0].items(), key=lambda kv: -kv[1])[:2]
    assert sorted(top["embedding"]["indices"]) == sorted(int(k) for k, _ in want)
    assert set(top["embedding"]["tokens"]) <= set(TEXTS[0].split())


def test_several_outputs_come_from_one_forward_pass(
    srv: RemoteServer, reference: dict[str, Any]
) -> None:
    """All three in one request: each item carries `embedding`, `sparse_embedding` and
    `multivector`, equal to FlagEmbedding's, from as many forward passes as dense alone."""
    texts = [f"{t} {i}" for i, t in enumerate(["red car", "blue sea", "old book"])]  # uncached
    before = httpx.get(srv.url + "/metrics").text
    _embed(srv, texts)
    middle = httpx.get(srv.url + "/metrics").text
    _embed(srv, [t.replace(" ", "  ") + " x" for t in texts], output_types=list(OUTPUTS))
    after = httpx.get(srv.url + "/metrics").text
    name = "openai_compat_batches_total"
    dense_passes = _metric(middle, name, "bge-m3") - _metric(before, name, "bge-m3")
    all_passes = _metric(after, name, "bge-m3") - _metric(middle, name, "bge-m3")
    assert dense_passes == all_passes == 1

    every = _embed(srv, output_types=list(OUTPUTS))
    for i, item in enumerate(every["data"]):
        np.testing.assert_allclose(item["embedding"], reference["dense"][i], atol=1e-5)
        _check_sparse(_sparse_of(item["sparse_embedding"]), reference["sparse"][i])
        np.testing.assert_allclose(item["multivector"], reference["colbert"][i], atol=1e-5)
        assert item["multivector_shape"] == [len(reference["colbert"][i]), 32]
    assert every["usage"]["prompt_tokens"] == TOKENS

    # only what is asked; base64 for every part
    two = _embed(srv, output_types=["sparse", "multivector"], encoding_format="base64")
    item = two["data"][2]
    assert set(item) == {"object", "index", "sparse_embedding", "multivector", "multivector_shape"}
    _check_sparse(_sparse_of(item["sparse_embedding"]), reference["sparse"][2])
    matrix = np.frombuffer(base64.b64decode(item["multivector"]), dtype="<f4")
    np.testing.assert_allclose(
        matrix.reshape(item["multivector_shape"]), reference["colbert"][2], atol=1e-5
    )
    cut = _embed(srv, output_types=["dense", "sparse"], dimensions=8)["data"][0]["embedding"]
    want = np.asarray(reference["dense"][0][:8])
    np.testing.assert_allclose(cut, want / np.linalg.norm(want), atol=1e-5)


def test_the_cache_is_keyed_by_what_was_asked(srv: RemoteServer) -> None:
    """A text cached as a dense vector is not the answer to its sparse request, and a
    repeat of a request with outputs is a hit with the same numbers."""
    text = ["the sun and the moon"]
    dense = _embed(srv, text)["data"][0]["embedding"]
    before = httpx.get(srv.url + "/metrics").text
    sparse = _embed(srv, text, output_types=["sparse"])["data"][0]["embedding"]
    again = _embed(srv, text, output_types=["sparse"])["data"][0]["embedding"]
    after = httpx.get(srv.url + "/metrics").text
    assert isinstance(dense, list) and isinstance(sparse, dict) and again == sparse
    hits = "openai_compat_cache_hits_total"
    misses = "openai_compat_cache_misses_total"
    assert _metric(after, misses, "bge-m3") - _metric(before, misses, "bge-m3") == 1
    assert _metric(after, hits, "bge-m3") - _metric(before, hits, "bge-m3") == 1


def test_rerank_scores_as_compute_score_does(srv: RemoteServer, reference: dict[str, Any]) -> None:
    """The hybrid (0.4 / 0.2 / 0.4) by default, each score mode alone, the model's own
    weights, on Cohere's /v1/rerank, Jina's and Cohere v2's, TEI's and infinity's shapes."""
    want = reference["scores"]

    def ranked(path: str, model: str = "bge-m3", **extra: Any) -> list[float]:
        body = {"query": QUERY, **extra}
        body |= {"texts": DOCS} if path == "/rerank" else {"model": model, "documents": DOCS}
        r = _post(srv, path, body)
        assert r.status_code == 200, r.text
        results = r.json() if path == "/rerank" else r.json()["results"]
        scores = {d["index"]: d.get("relevance_score", d.get("score")) for d in results}
        return [scores[i] for i in range(len(DOCS))]

    hybrid = want["colbert+sparse+dense"]
    np.testing.assert_allclose(ranked("/v1/rerank"), hybrid, atol=1e-5)
    assert np.argmax(hybrid) == 0 and len({round(s, 4) for s in hybrid}) == len(DOCS)
    for mode, key in (("dense", "dense"), ("sparse", "sparse"), ("colbert", "colbert")):
        np.testing.assert_allclose(ranked("/v1/rerank", score_mode=mode), want[key], atol=1e-5)
    np.testing.assert_allclose(ranked("/v2/rerank", score_mode="hybrid"), hybrid, atol=1e-5)
    np.testing.assert_allclose(ranked("/rerank", score_mode="colbert"), want["colbert"], atol=1e-5)
    weighted = ranked("/v1/rerank", model="bge-m3-weighted")
    np.testing.assert_allclose(weighted, reference["weighted"], atol=1e-5)
    assert not np.allclose(weighted, hybrid, atol=1e-3)  # the weights were applied


def test_tei_embed_sparse_and_models_list_the_outputs(
    srv: RemoteServer, reference: dict[str, Any]
) -> None:
    r = _post(srv, "/embed_sparse", {"inputs": TEXTS})  # BGE-M3 is the only sparse model
    assert r.status_code == 200, r.text
    for got, want in zip(r.json(), reference["sparse"], strict=False):
        _check_sparse({str(p["index"]): p["value"] for p in got}, want)
    card = httpx.get(srv.url + "/v1/models/bge-m3").json()
    assert card["outputs"] == list(OUTPUTS)
    assert card["score_modes"] == ["hybrid", "dense", "sparse", "colbert"]
    assert {"embed", "rerank", "sparse"} <= set(card["capabilities"])
    assert "outputs" not in httpx.get(srv.url + "/v1/models/debug").json()


def test_the_batch_api_answers_the_outputs_asked(
    srv: RemoteServer, reference: dict[str, Any]
) -> None:
    import openai

    from tests.utils import run_batch

    client = openai.OpenAI(base_url=srv.base_url, api_key="unused")
    body = {"model": "bge-m3", "input": TEXTS[:2], "output_types": ["dense", "sparse"]}
    line = {"custom_id": "m3", "method": "POST", "url": "/v1/embeddings", "body": body}
    job = run_batch(client, [line])
    assert job.status == "completed", job
    out = json.loads(client.files.content(job.output_file_id).text)
    data = out["response"]["body"]["data"]
    for i, item in enumerate(data):
        np.testing.assert_allclose(item["embedding"], reference["dense"][i], atol=1e-5)
        _check_sparse(_sparse_of(item["sparse_embedding"]), reference["sparse"][i])


@pytest.mark.parametrize(
    ("path", "body", "param", "says"),
    [
        ("/v1/embeddings", {"output_types": ["dense", "bogus"]}, "output_types", "unknown"),
        ("/v1/embeddings", {"output_types": []}, "output_types", "empty"),
        ("/v1/embeddings", {"output_types": ["sparse", "sparse"]}, "output_types", "repeat"),
        ("/v1/embeddings", {"output_types": ["sparse"], "dimensions": 8}, "dimensions", "dense"),
        (
            "/v1/embeddings",
            {"output_types": ["sparse"], "output_dtype": "int8"},
            "output_dtype",
            "",
        ),
        ("/v1/embeddings", {"output_types": ["sparse"], "long_input": "mean"}, "long_input", ""),
        ("/v1/embeddings", {"top_k": 3}, "top_k", "'output_types' with 'sparse'"),
        ("/v1/embeddings", {"model": "debug", "output_types": ["sparse"]}, "output_types", "dense"),
        ("/v1/rerank", {"score_mode": "best"}, "score_mode", "hybrid, dense, sparse, colbert"),
        ("/v1/rerank", {"model": "debug", "score_mode": "dense"}, "score_mode", "BGE-M3"),
    ],
)
def test_what_cannot_be_answered_is_a_400_naming_its_field(
    srv: RemoteServer, path: str, body: dict[str, Any], param: str, says: str
) -> None:
    base = {"model": "bge-m3", "input": TEXTS[:1]}
    if path == "/v1/rerank":
        base = {"model": "bge-m3", "query": QUERY, "documents": DOCS}
    r = _post(srv, path, base | body)
    assert r.status_code == 400, r.text
    error = r.json()["error"] if path == "/v1/embeddings" else r.json()
    message = error["message"]
    assert says in message
    if path == "/v1/embeddings":
        assert error["param"] == param
    else:  # Cohere's error body: a message naming the field
        assert f"'{param}'" in message
    # the debug model answers the one output it has
    ok = _post(srv, "/v1/embeddings", {"model": "debug", "input": "x", "output_types": ["dense"]})
    assert ok.status_code == 200, ok.text


def test_the_other_dialects_answer_the_dense_vectors(
    srv: RemoteServer, reference: dict[str, Any]
) -> None:
    """Cohere's, Ollama's and TEI's /embed give BGE-M3's dense vectors, FlagEmbedding's."""
    want = reference["dense"][:2]
    body = {"model": "bge-m3", "texts": TEXTS[:2], "input_type": "search_document"}
    cohere = _post(srv, "/v2/embed", body | {"embedding_types": ["float"]})
    assert cohere.status_code == 200, cohere.text
    np.testing.assert_allclose(cohere.json()["embeddings"]["float"], want, atol=1e-5)
    ollama = _post(srv, "/api/embed", {"model": "bge-m3", "input": TEXTS[:2]})
    assert ollama.status_code == 200, ollama.text
    np.testing.assert_allclose(ollama.json()["embeddings"], want, atol=1e-5)
    tei = _post(srv, "/embed", {"inputs": TEXTS[:2]})  # the default embedder: the first
    assert tei.status_code == 200, tei.text
    np.testing.assert_allclose(tei.json(), want, atol=1e-5)
