"""infinity-emb's, TEI's and vLLM's API dialects on the bare paths, through their clients.

Every number is checked against what the /v1 routes answer for the same model and text (which
other tests check against sentence-transformers and transformers directly).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.media_samples import data_uri, png, wav
from tests.utils import RemoteServer

pytestmark = pytest.mark.slow

TEXTS = ["A man is eating food.", "The weather is lovely today."]
QUERY = "How do I cook pasta?"
DOCS = ["The stock market fell today.", "Boil salted water and cook the pasta for ten minutes."]


@pytest.fixture(scope="module")
def srv(
    tmp_path_factory: pytest.TempPathFactory,
    trained_models: dict[str, Path],
    tiny_media_models: dict[str, Path],
) -> Iterator[RemoteServer]:
    cfg = tmp_path_factory.mktemp("cfg") / "dialects.toml"
    cfg.write_text(
        'default_model = ["rerank=reranker"]\n'
        '[[models]]\nname = "minilm"\nmodel = "builtin:all-MiniLM-L6-v2"\n'
        f'[[models]]\nname = "reranker"\nmodel = "{trained_models["reranker"]}"\n'
        f'[[models]]\nname = "sentiment"\nmodel = "{trained_models["classifier"]}"\n'
        f'[[models]]\nname = "clip"\nmodel = "{tiny_media_models["clip"]}"\n'
        f'[[models]]\nname = "clap"\nmodel = "{tiny_media_models["clap"]}"\n'
    )
    with RemoteServer(["--config", str(cfg)]) as server:
        yield server


def _post(srv: RemoteServer, path: str, body: Any) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=60)


def _v1_vectors(srv: RemoteServer, texts: list[str], **extra: Any) -> np.ndarray:
    r = _post(srv, "/v1/embeddings", {"model": "minilm", "input": texts, **extra})
    return np.asarray([d["embedding"] for d in r.json()["data"]])


def _v1_scores(srv: RemoteServer, model: str = "reranker") -> dict[int, float]:
    r = _post(srv, "/v1/rerank", {"model": model, "query": QUERY, "documents": DOCS})
    return {x["index"]: x["relevance_score"] for x in r.json()["results"]}


# ---------------------------------------------------------------- TEI


def test_tei_embed_and_post_root_equal_the_v1_vectors(srv: RemoteServer) -> None:
    want = _v1_vectors(srv, TEXTS)
    np.testing.assert_allclose(_post(srv, "/embed", {"inputs": TEXTS}).json(), want, atol=1e-6)
    np.testing.assert_allclose(_post(srv, "/", {"inputs": TEXTS}).json(), want, atol=1e-6)
    one = _post(srv, "/embed", {"inputs": TEXTS[0], "dimensions": 64}).json()
    np.testing.assert_allclose(one, _v1_vectors(srv, TEXTS[:1], dimensions=64), atol=1e-6)


def test_huggingface_hub_inference_client_feature_extraction(
    srv: RemoteServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants
    from huggingface_hub import InferenceClient

    # The tests run with HF_HUB_OFFLINE=1, which also blocks URLs on 127.0.0.1.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

    client = InferenceClient(model=srv.url, token="unused")
    got = client.feature_extraction(TEXTS[0], truncate=True)
    np.testing.assert_allclose(
        np.asarray(got).reshape(1, -1), _v1_vectors(srv, TEXTS[:1]), atol=1e-6
    )


def test_llamaindex_text_embeddings_inference(srv: RemoteServer) -> None:
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    emb = TextEmbeddingsInference(model_name="minilm", base_url=srv.url)
    np.testing.assert_allclose(
        emb.get_text_embedding_batch(TEXTS), _v1_vectors(srv, TEXTS), atol=1e-6
    )


def test_tei_rerank_uses_the_default_reranker(srv: RemoteServer) -> None:
    want = _v1_scores(srv)
    got = _post(srv, "/rerank", {"query": QUERY, "texts": DOCS, "return_text": True}).json()
    assert [x["index"] for x in got] == [1, 0]
    assert got[0]["text"] == DOCS[1]
    for x in got:
        assert x["score"] == pytest.approx(want[x["index"]], abs=1e-6)
    raw = _post(srv, "/rerank", {"query": QUERY, "texts": DOCS, "raw_scores": True}).json()
    for x in raw:  # the cross-encoder's logit: the score is its sigmoid
        assert 1 / (1 + np.exp(-x["score"])) == pytest.approx(want[x["index"]], abs=1e-5)


def test_tei_predict_texts_and_pairs(srv: RemoteServer, trained_models: dict[str, Path]) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    text = "I loved every minute of it."
    one = _post(srv, "/predict", {"inputs": text}).json()
    v1 = _post(srv, "/v1/classify", {"model": "sentiment", "input": text}).json()["data"][0]
    assert {x["label"]: x["score"] for x in one} == pytest.approx(
        {x["label"]: x["score"] for x in v1["labels"]}, abs=1e-6
    )
    batch = _post(srv, "/predict", {"inputs": [[text], ["awful"], ["bad", "worse"]]}).json()
    assert len(batch) == 3
    for mine, ref in zip(batch[0], one, strict=True):  # (pairs run the model's own pipeline)
        assert mine["label"] == ref["label"] and mine["score"] == pytest.approx(ref["score"])
    # a [text, text] pair, as TEI reads two strings: the model's logits on the pair
    model = AutoModelForSequenceClassification.from_pretrained(trained_models["classifier"])
    tok = AutoTokenizer.from_pretrained(trained_models["classifier"])
    with torch.no_grad():
        logits = model(**tok("bad", "worse", return_tensors="pt")).logits[0].numpy()
    raw = _post(srv, "/predict", {"inputs": ["bad", "worse"], "raw_scores": True}).json()
    labels = model.config.id2label
    assert {x["label"]: x["score"] for x in raw} == pytest.approx(
        {labels[i]: float(v) for i, v in enumerate(logits)}, abs=1e-4
    )
    assert batch[2] == _post(srv, "/predict", {"inputs": ["bad", "worse"]}).json()
    text_classification = _post(srv, "/predict", {"inputs": [["a", "b", "c"]]})
    assert text_classification.status_code == 422


def test_tei_tokenize_decode_and_info(srv: RemoteServer) -> None:
    text = "Hello world, tokenize me!"
    rows = _post(srv, "/tokenize", {"inputs": [text]}).json()
    ids = [t["id"] for t in rows[0]]
    assert rows[0][0]["special"] and rows[0][0]["text"] == "[CLS]"
    words = [t for t in rows[0] if not t["special"]]
    assert text[words[0]["start"] : words[0]["stop"]] == "Hello"
    assert _post(srv, "/decode", {"ids": ids}).json() == [text.lower()]
    info = httpx.get(srv.url + "/info").json()
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 256 and info["served_name"] == "minilm"


def test_tei_errors_use_teis_shape_and_codes(srv: RemoteServer) -> None:
    r = _post(srv, "/embed", {"inputs": []})
    assert r.status_code == 422
    assert r.json() == {"error": "'inputs' must not be empty.", "error_type": "Validation"}
    r = _post(srv, "/embed", {"inputs": "word " * 400, "truncate": False})
    assert r.status_code == 413 and r.json()["error_type"] == "Validation"
    assert r.json()["error"].startswith("inputs[0]: 402 tokens, more than the 256")
    r = _post(srv, "/predict", {"inputs": 3})
    assert r.status_code == 422 and set(r.json()) == {"error", "error_type"}


# ---------------------------------------------------------------- infinity-emb


def test_infinity_rerank_returns_documents_as_strings(srv: RemoteServer) -> None:
    want = _v1_scores(srv)
    body = {"model": "reranker", "query": QUERY, "documents": DOCS, "return_documents": True}
    got = _post(srv, "/rerank", body).json()
    assert got["object"] == "rerank" and got["model"] == "reranker"
    assert [r["index"] for r in got["results"]] == [1, 0]
    assert got["results"][0]["document"] == DOCS[1]
    for r in got["results"]:
        assert r["relevance_score"] == pytest.approx(want[r["index"]], abs=1e-6)
    # no model named: infinity's default, here the configured default reranker
    unnamed = _post(srv, "/rerank", {"query": QUERY, "documents": DOCS, "top_n": 1}).json()
    assert unnamed["model"] == "reranker" and len(unnamed["results"]) == 1
    assert unnamed["results"][0]["document"] is None


def test_infinity_classify_and_media_routes(srv: RemoteServer) -> None:
    got = _post(srv, "/classify", {"model": "sentiment", "input": ["great", "awful"]}).json()
    v1 = _post(srv, "/v1/classify", {"model": "sentiment", "input": ["great", "awful"]}).json()
    assert got["object"] == "classify" and len(got["data"]) == 2
    for mine, ref in zip(got["data"], v1["data"], strict=True):
        assert mine == [{"score": x["score"], "label": x["label"]} for x in ref["labels"]]
    image = data_uri(png(), "image/png")
    img = _post(srv, "/embeddings_image", {"model": "clip", "input": [image]}).json()
    ref_img = _post(srv, "/v1/embeddings", {"model": "clip", "input": [image], "modality": "image"})
    assert img["data"][0]["embedding"] == ref_img.json()["data"][0]["embedding"]
    audio = data_uri(wav(), "audio/wav")
    aud = _post(srv, "/embeddings_audio", {"model": "clap", "input": audio})
    assert aud.status_code == 200, aud.text
    assert len(aud.json()["data"]) == 1


def test_langchain_community_infinity_embeddings(srv: RemoteServer) -> None:
    from langchain_community.embeddings import InfinityEmbeddings

    emb = InfinityEmbeddings(model="minilm", infinity_api_url=srv.url)
    np.testing.assert_allclose(emb.embed_documents(TEXTS), _v1_vectors(srv, TEXTS), atol=1e-6)


# ---------------------------------------------------------------- vLLM tokenize, shared paths


def test_vllm_tokenize_round_trip(srv: RemoteServer) -> None:
    text = "plain text comes back"
    tok = _post(srv, "/tokenize", {"model": "minilm", "prompt": text}).json()
    assert tok["count"] == len(tok["tokens"]) == 6 and tok["max_model_len"] == 256
    assert _post(srv, "/detokenize", {"model": "minilm", "tokens": tok["tokens"]}).json() == {
        "prompt": text
    }


def test_a_body_of_no_dialect_names_what_each_expects(srv: RemoteServer) -> None:
    r = _post(srv, "/rerank", {"query": QUERY, "passages": DOCS})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "unknown_dialect"
    assert "'docs' (tutorial); 'documents' (infinity); 'texts' (tei)" in err["message"]


def test_the_tutorials_routes_are_unchanged(srv: RemoteServer) -> None:
    r = _post(srv, "/embed", {"sentences": TEXTS, "model_index": 0}).json()
    np.testing.assert_allclose(r["embeddings"], _v1_vectors(srv, TEXTS), atol=1e-6)
    rr = _post(srv, "/rerank", {"query": QUERY, "docs": DOCS, "model_index": 1}).json()
    assert rr["rankings"][0]["document"] == DOCS[1]
    cl = _post(srv, "/classify", {"sentences": ["great"], "model_index": 2}).json()
    assert cl["model"] == "sentiment" and cl["classifications"][0][0]["label"]
