"""infinity-emb's, TEI's and vLLM's API dialects on the bare paths, through their clients.

Every number is checked against what the /v1 routes answer for the same model and text (which
other tests check against sentence-transformers and transformers directly).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.media_samples import data_uri, png, wav
from tests.utils import RemoteServer, server_with

pytestmark = pytest.mark.slow

TEXTS = ["A man is eating food.", "The weather is lovely today."]
QUERY = "How do I cook pasta?"
DOCS = ["The stock market fell today.", "Boil salted water and cook the pasta for ten minutes."]


@pytest.fixture(scope="module")
def mean_pool_minilm(tmp_path_factory: pytest.TempPathFactory, minilm_path: str) -> Path:
    """The packaged MiniLM without its final Normalize module: its own output is not unit
    length, so TEI's normalize=false has something to show (files linked, not copied)."""
    folder = tmp_path_factory.mktemp("mean-pool-minilm")
    for item in Path(minilm_path).iterdir():
        if item.name not in ("modules.json", "2_Normalize"):
            (folder / item.name).symlink_to(item)
    modules = json.loads((Path(minilm_path) / "modules.json").read_text())
    kept = [m for m in modules if not m["type"].endswith("Normalize")]
    assert len(kept) == len(modules) - 1
    (folder / "modules.json").write_text(json.dumps(kept))
    return folder


@pytest.fixture(scope="module")
def srv(
    tmp_path_factory: pytest.TempPathFactory,
    trained_models: dict[str, Path],
    tiny_media_models: dict[str, Path],
    mean_pool_minilm: Path,
) -> Iterator[RemoteServer]:
    models = [
        {"name": "minilm", "model": mean_pool_minilm},
        {"name": "reranker", "model": trained_models["reranker"]},
        {"name": "sentiment", "model": trained_models["classifier"]},
        {"name": "clip", "model": tiny_media_models["clip"]},
        {"name": "clap", "model": tiny_media_models["clap"]},
    ]
    folder = tmp_path_factory.mktemp("cfg")
    with server_with(folder, models, default_model=["rerank=reranker"]) as server:
        yield server


@pytest.fixture
def hub_online(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests run with HF_HUB_OFFLINE=1, which also blocks huggingface_hub's requests to a
    URL on 127.0.0.1; let those through (nothing here names a hub model)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


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
    srv: RemoteServer, hub_online: None
) -> None:
    from huggingface_hub import InferenceClient

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


def test_tei_normalize_false_is_the_models_own_output(
    srv: RemoteServer, mean_pool_minilm: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(mean_pool_minilm), device="cpu")
    want = st.encode(TEXTS, normalize_embeddings=False)
    assert np.all(np.abs(np.linalg.norm(want, axis=1) - 1) > 0.5)  # really not unit length
    raw = _post(srv, "/embed", {"inputs": TEXTS, "normalize": False}).json()
    np.testing.assert_allclose(raw, want, rtol=1e-5, atol=1e-5)
    cut = _post(srv, "/embed", {"inputs": TEXTS, "normalize": False, "dimensions": 32}).json()
    np.testing.assert_allclose(cut, want[:, :32], rtol=1e-5, atol=1e-5)
    # normalize=true (TEI's default) and /v1 are the unit vectors of the same output
    unit = want / np.linalg.norm(want, axis=1, keepdims=True)
    np.testing.assert_allclose(_post(srv, "/embed", {"inputs": TEXTS}).json(), unit, atol=1e-6)
    np.testing.assert_allclose(_v1_vectors(srv, TEXTS), unit, atol=1e-6)


def test_haystack_tei_embedders_with_their_defaults(
    srv: RemoteServer, mean_pool_minilm: Path, hub_online: None
) -> None:
    from haystack import Document
    from haystack_integrations.components.embedders.huggingface_api import (
        HuggingFaceAPIDocumentEmbedder,
        HuggingFaceAPITextEmbedder,
    )
    from sentence_transformers import SentenceTransformer

    # Haystack's defaults send truncate=true, normalize=false: the model's own output.
    want = SentenceTransformer(str(mean_pool_minilm), device="cpu").encode(
        TEXTS, normalize_embeddings=False
    )
    params = {"api_type": "text_embeddings_inference", "api_params": {"url": srv.url}}
    text = HuggingFaceAPITextEmbedder(**params).run(text=TEXTS[0])  # type: ignore[arg-type]
    np.testing.assert_allclose(text["embedding"], want[0], rtol=1e-5, atol=1e-5)
    docs = HuggingFaceAPIDocumentEmbedder(**params).run(  # type: ignore[arg-type]
        documents=[Document(content=t) for t in TEXTS]
    )["documents"]
    np.testing.assert_allclose([d.embedding for d in docs], want, rtol=1e-5, atol=1e-5)


def test_haystack_tei_ranker(srv: RemoteServer) -> None:
    from haystack import Document
    from haystack_integrations.components.rankers.huggingface_api import HuggingFaceTEIRanker

    want = _v1_scores(srv)
    ranker = HuggingFaceTEIRanker(url=srv.url, top_k=2)
    docs = ranker.run(query=QUERY, documents=[Document(content=d) for d in DOCS])["documents"]
    assert [d.content for d in docs] == [DOCS[1], DOCS[0]]
    for d in docs:
        assert d.score == pytest.approx(want[DOCS.index(d.content)], abs=1e-6)


def test_langchain_huggingface_endpoint_embeddings(srv: RemoteServer, hub_online: None) -> None:
    from langchain_huggingface import HuggingFaceEndpointEmbeddings

    emb = HuggingFaceEndpointEmbeddings(model=srv.url, huggingfacehub_api_token="unused")
    np.testing.assert_allclose(emb.embed_documents(TEXTS), _v1_vectors(srv, TEXTS), atol=1e-6)
    np.testing.assert_allclose(emb.embed_query(TEXTS[1]), _v1_vectors(srv, TEXTS)[1], atol=1e-6)


def test_huggingface_hub_text_classification_on_a_classifier_server(
    tmp_path: Path, trained_models: dict[str, Path], hub_online: None
) -> None:
    """TEI serves one model and POST / does what it does: a classifier server classifies."""
    from huggingface_hub import InferenceClient

    text = "I loved every minute of it."
    sentiment = {"name": "sentiment", "model": trained_models["classifier"]}
    with server_with(tmp_path, [sentiment]) as server:
        v1 = _post(server, "/v1/classify", {"model": "sentiment", "input": text}).json()
        got = InferenceClient(model=server.url, token="unused").text_classification(text)
    best = max(v1["data"][0]["labels"], key=lambda x: x["score"])
    # TEI answers one input with a flat list, of which huggingface_hub keeps the first (best)
    assert got.label == best["label"]
    assert got.score == pytest.approx(best["score"], abs=1e-6)


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
    # the same pair alone: the same labels, scores equal but for float rounding (in the batch
    # above it was padded beside other inputs)
    alone = _post(srv, "/predict", {"inputs": ["bad", "worse"]}).json()
    assert [x["label"] for x in batch[2]] == [x["label"] for x in alone]
    assert [x["score"] for x in batch[2]] == pytest.approx([x["score"] for x in alone], abs=1e-6)
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
    assert info["max_input_length"] == 256 and info["served_model_name"] == "minilm"


def test_tei_errors_use_teis_shape_and_codes(srv: RemoteServer) -> None:
    r = _post(srv, "/embed", {"inputs": []})  # TEI's ErrorType::Empty is a 400
    assert r.status_code == 400
    assert r.json() == {"error": "'inputs' must not be empty.", "error_type": "Empty"}
    r = _post(srv, "/embed", {"inputs": "word " * 400, "truncate": False})
    assert r.status_code == 422 and r.json()["error_type"] == "Validation"  # TEI >= 1.9
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


def test_litellm_infinity_provider_embeddings_and_rerank(srv: RemoteServer) -> None:
    import litellm

    emb = litellm.embedding(model="infinity/minilm", input=TEXTS, api_base=srv.url)
    got = [d["embedding"] for d in emb.data]
    np.testing.assert_allclose(got, _v1_vectors(srv, TEXTS), atol=1e-6)
    # litellm's defaults: bare /rerank, `documents`, return_documents true, strings back
    want = _v1_scores(srv)
    rr = litellm.rerank(model="infinity/reranker", query=QUERY, documents=DOCS, api_base=srv.url)
    assert [r["index"] for r in rr.results] == [1, 0]
    assert rr.results[0]["document"] == {"text": DOCS[1]}
    for r in rr.results:
        assert r["relevance_score"] == pytest.approx(want[r["index"]], abs=1e-6)


def test_infinity_generated_client(srv: RemoteServer) -> None:
    from infinity_client import Client
    from infinity_client.api.default import classify, embeddings, models, rerank
    from infinity_client.models import (
        ClassifyInput,
        OpenAIEmbeddingInputText,
        OpenAIEmbeddingResult,
        OpenAIModelInfo,
        RerankInput,
        ReRankResult,
    )

    client = Client(base_url=srv.url, raise_on_unexpected_status=True)
    listed = models.sync(client=client)
    assert isinstance(listed, OpenAIModelInfo)
    assert {m.id for m in listed.data} >= {"minilm", "reranker", "sentiment", "clip", "clap"}
    assert next(m for m in listed.data if m.id == "reranker").stats["batch_size"] == 32
    emb = embeddings.sync(
        client=client, body=OpenAIEmbeddingInputText(input_=TEXTS, model="minilm")
    )
    assert isinstance(emb, OpenAIEmbeddingResult)
    np.testing.assert_allclose([d.embedding for d in emb.data], _v1_vectors(srv, TEXTS), atol=1e-6)
    # its defaults: model "default/not-specified" (the default model) and dimensions 0 (all)
    unnamed = embeddings.sync(client=client, body=OpenAIEmbeddingInputText(input_=TEXTS[:1]))
    assert unnamed.model == "minilm"  # type: ignore[union-attr]
    np.testing.assert_allclose(
        unnamed.data[0].embedding,  # type: ignore[union-attr]
        _v1_vectors(srv, TEXTS[:1])[0],
        atol=1e-6,
    )
    body = RerankInput(query=QUERY, documents=DOCS, return_documents=True, model="reranker")
    rr = rerank.sync(client=client, body=body)
    assert isinstance(rr, ReRankResult)
    assert [(r.index, r.document) for r in rr.results] == [(1, DOCS[1]), (0, DOCS[0])]
    want = _v1_scores(srv)
    assert {r.index: r.relevance_score for r in rr.results} == pytest.approx(want, abs=1e-6)
    cl = classify.sync(client=client, body=ClassifyInput(input_=["great"], model="sentiment"))
    v1 = _post(srv, "/v1/classify", {"model": "sentiment", "input": ["great"]}).json()
    assert [(x.label, x.score) for x in cl.data[0]] == [  # type: ignore[union-attr]
        (x["label"], x["score"]) for x in v1["data"][0]["labels"]
    ]


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
