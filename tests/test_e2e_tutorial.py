"""The tutorial's routes, with its curl bodies, on a server with the tutorial's model order."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tests.media_samples import data_uri, png
from tests.utils import RemoteServer

pytestmark = pytest.mark.slow


def _post(srv: RemoteServer, path: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=60)


def test_embed_defaults_to_model_index_1(multi_server: RemoteServer, st_model) -> None:  # type: ignore[no-untyped-def]
    sentences = ["A man is eating food.", "A man is eating a piece of bread."]
    r = _post(multi_server, "/embed", {"sentences": sentences})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"embeddings", "usage", "model"} and body["model"] == "minilm"
    want = st_model.encode(sentences, normalize_embeddings=True)
    assert np.max(np.abs(np.asarray(body["embeddings"]) - want)) < 1e-5
    assert body["usage"] == sum(len(st_model.tokenizer(s)["input_ids"]) for s in sentences)


def test_image_embed_defaults_to_model_index_0(multi_server: RemoteServer) -> None:
    r = _post(multi_server, "/image_embed", {"image_urls": [data_uri(png(), "image/png")]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "clip" and len(body["embeddings"][0]) == 16
    v1 = _post(
        multi_server,
        "/v1/embeddings",
        {"model": "clip", "input": [data_uri(png(), "image/png")], "modality": "image"},
    ).json()
    np.testing.assert_allclose(body["embeddings"][0], v1["data"][0]["embedding"], atol=1e-7)


def test_rerank_defaults_to_model_index_2(multi_server: RemoteServer, direct_models) -> None:  # type: ignore[no-untyped-def]
    docs = ["The president gave a speech.", "Boil salted water and cook the pasta."]
    r = _post(multi_server, "/rerank", {"query": "how to cook pasta", "docs": docs})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "reranker" and body["usage"] > 0
    # the cross-encoder run directly with transformers: sigmoid of its logit per pair
    expected = direct_models["rerank"]("how to cook pasta", docs)
    assert expected[1] > expected[0]
    assert [r["index"] for r in body["rankings"]] == [1, 0]
    for ranking in body["rankings"]:
        assert ranking["document"] == docs[ranking["index"]]
        assert ranking["relevance_score"] == pytest.approx(expected[ranking["index"]], abs=1e-4)


def test_classify_defaults_to_model_index_3(multi_server: RemoteServer) -> None:
    r = _post(multi_server, "/classify", {"sentences": ["I love this, it is wonderful."]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "sentiment"
    (labels,) = body["classifications"]
    assert labels[0]["label"] == "positive" and labels[0]["score"] > labels[1]["score"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/embed", {"sentences": ["x"], "model_index": 7}),
        ("/embed", {"sentences": ["x"], "model_index": -1}),
        ("/rerank", {"query": "q", "docs": ["d"], "model_index": 9}),
        ("/classify", {"sentences": ["x"], "model_index": 4}),
        ("/image_embed", {"image_urls": ["x"], "model_index": 5}),
    ],
)
def test_bad_model_index_is_a_400(multi_server: RemoteServer, path: str, body: dict) -> None:  # type: ignore[type-arg]
    r = _post(multi_server, path, body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "model_index"


def test_wrong_capability_and_bad_bodies(multi_server: RemoteServer) -> None:
    r = _post(multi_server, "/embed", {"sentences": ["x"], "model_index": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    r = _post(multi_server, "/embed", {"sentences": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "sentences"
    r = _post(multi_server, "/rerank", {"docs": ["d"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "query"
    r = httpx.post(multi_server.url + "/classify", content=b"{nope")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def test_default_server_without_model_index(server: RemoteServer, st_model) -> None:  # type: ignore[no-untyped-def]
    """The default server serves one text model: the tutorial's position 1 does not exist, so
    /embed uses the default embedder (it said "model_index 1 is out of range" before)."""
    sentences = ["A man is eating food."]
    r = _post(server, "/embed", {"sentences": sentences})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "all-MiniLM-L6-v2"
    want = st_model.encode(sentences, normalize_embeddings=True)
    assert np.max(np.abs(np.asarray(r.json()["embeddings"]) - want)) < 1e-5
    # Nothing here can classify: the error says which model list the tutorial expects.
    r = _post(server, "/classify", {"sentences": ["I love it"]})
    assert r.status_code == 400
    assert "configs/production.toml" in r.json()["error"]["message"]
    r = _post(server, "/embed", {"sentences": ["x"], "model_index": 1})
    assert r.status_code == 400 and "0 CLIP, 1 text embeddings" in r.json()["error"]["message"]
