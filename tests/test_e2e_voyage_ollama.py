"""Voyage AI's and Ollama's APIs end to end (#54) with their official SDKs against a real
server: `voyageai.Client(base_url=.../voyage/v1)` (embed with prompts, compact dtypes and
base64, contextualized chunk embeddings, rerank, multimodal embed), LiteLLM's `voyage/`
provider, `ollama.Client(host=...)` and LangChain's OllamaEmbeddings. Numbers, not shapes:
vectors equal our OpenAI route's (and sentence-transformers'), compact types derived from the
float vectors, contextualized chunks equal a plain transformers computation of the same late
pooling on the packaged MiniLM, rerank equal to our Cohere route's."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import ollama
import pytest
import voyageai
import voyageai.error

from tests.utils import RemoteServer, server_with

pytestmark = pytest.mark.slow

Q, P = "query: ", "passage: "
DOCS = ["A man is eating food.", "A man is eating a piece of bread.", "The stock market crashed."]


@pytest.fixture(scope="module")
def vl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from openai_compat.models.demo_vision import build_vl_embedder

    return build_vl_embedder(tmp_path_factory.mktemp("vl") / "vl")


@pytest.fixture(scope="module")
def srv(
    tmp_path_factory: pytest.TempPathFactory, trained_models: dict[str, Path], vl: Path
) -> Iterator[RemoteServer]:
    models = [
        {"name": "minilm", "model": "builtin:all-MiniLM-L6-v2"},
        {
            "name": "e5",
            "model": "builtin:all-MiniLM-L6-v2",
            "prompts": {"query": Q, "document": P},
            "matryoshka_dimensions": [128],
        },
        {"name": "reranker", "model": str(trained_models["reranker"])},
        {"name": "vl", "model": str(vl)},
        {"name": "vl-short", "model": str(vl), "max_length": 32},
        {"name": "lazy", "model": "builtin:all-MiniLM-L6-v2", "load": "lazy"},
    ]
    with server_with(tmp_path_factory.mktemp("cfg"), models, ["--cache-bytes", "0"]) as server:
        yield server


@pytest.fixture(scope="module")
def vo(srv: RemoteServer) -> voyageai.Client:
    return voyageai.Client(api_key="unused", base_url=srv.url + "/voyage/v1", max_retries=0)


def _openai(srv: RemoteServer, model: str, texts: list[str], **extra: Any) -> np.ndarray:
    body = {"model": model, "input": texts, **extra}
    r = httpx.post(srv.url + "/v1/embeddings", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return np.asarray([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


def test_voyage_embed_equals_our_openai_route_and_the_library(
    srv: RemoteServer, vo: voyageai.Client, st_model: Any
) -> None:
    got = vo.embed(DOCS, model="minilm")  # the SDK asks for base64 and decodes it
    want = _openai(srv, "minilm", DOCS)
    np.testing.assert_allclose(np.asarray(got.embeddings), want, atol=1e-6)
    np.testing.assert_allclose(want, st_model.encode(DOCS, normalize_embeddings=True), atol=1e-5)
    assert got.total_tokens == 8 + 11 + 7  # [CLS] ... [SEP] of each
    # input_type selects the model's prompts, as Cohere's does
    for side, prefix in (("query", Q), ("document", P)):
        asked = vo.embed(DOCS[:1], model="e5", input_type=side)
        np.testing.assert_allclose(
            asked.embeddings[0], _openai(srv, "e5", [prefix + DOCS[0]])[0], atol=1e-6
        )
    cut = vo.embed(DOCS[:1], model="e5", output_dimension=128)
    head = want[0][:128] / np.linalg.norm(want[0][:128])
    np.testing.assert_allclose(cut.embeddings[0], head, atol=1e-6)
    floats = httpx.post(  # floats on the wire when the client does not ask for base64
        srv.url + "/voyage/v1/embeddings", json={"model": "minilm", "input": DOCS[0]}
    ).json()
    assert floats["object"] == "list" and floats["data"][0]["object"] == "embedding"
    np.testing.assert_allclose(floats["data"][0]["embedding"], want[0], atol=1e-6)


def test_voyage_compact_dtypes_follow_the_float_vectors(
    srv: RemoteServer, vo: voyageai.Client
) -> None:
    floats = _openai(srv, "minilm", DOCS)
    bits = np.packbits(floats > 0, axis=1)
    ubinary = np.asarray(vo.embed(DOCS, model="minilm", output_dtype="ubinary").embeddings)
    assert (ubinary == bits).all()
    binary = np.asarray(vo.embed(DOCS, model="minilm", output_dtype="binary").embeddings)
    assert (binary == bits.astype(np.int16) - 128).all()  # offset binary, as Voyage packs it
    cohere = httpx.post(
        srv.url + "/v2/embed",
        json={"model": "minilm", "texts": DOCS, "input_type": "search_document",
              "embedding_types": ["int8", "uint8"]},
    ).json()["embeddings"]  # fmt: skip
    for dtype in ("int8", "uint8"):
        got = np.asarray(vo.embed(DOCS, model="minilm", output_dtype=dtype).embeddings)
        assert (got == np.asarray(cohere[dtype])).all(), dtype  # the model's calibrated range
        assert np.corrcoef(got[0].astype(float), floats[0])[0, 1] > 0.99


def _late_pooling(st_model: Any, chunks: list[str]) -> np.ndarray:
    """The chunks' vectors of a plain transformers forward of the joined document: each
    chunk's mean of the token vectors lying in its characters, normalised."""
    import torch

    text = " ".join(chunks)
    tokenizer, model = st_model.tokenizer, st_model[0].auto_model
    enc = tokenizer(text, return_offsets_mapping=True, return_tensors="pt")
    offsets = enc.pop("offset_mapping")[0].tolist()
    with torch.no_grad():
        tokens = model(**enc).last_hidden_state[0].numpy()
    out, at = [], 0
    for chunk in chunks:
        start, end = at, at + len(chunk)
        inside = [i for i, (a, b) in enumerate(offsets) if b > a and a >= start and b <= end]
        v = tokens[inside].mean(axis=0)
        out.append(v / np.linalg.norm(v))
        at = end + 1
    return np.asarray(out)


def test_contextualized_chunks_are_late_pooled_in_their_document(
    srv: RemoteServer, vo: voyageai.Client, st_model: Any
) -> None:
    shared = "It was founded in 1850."
    docs = [
        ["The company makes bicycles in Leeds.", shared],
        ["The orchestra plays in Vienna.", shared, "Tickets sell out."],
        ["One chunk alone is its own embedding."],
    ]
    got = vo.contextualized_embed(inputs=docs, model="minilm", input_type="document")
    assert [len(r.embeddings) for r in got.results] == [2, 3, 1]
    for doc, result in zip(docs[:2], got.results[:2], strict=True):
        np.testing.assert_allclose(
            np.asarray(result.embeddings), _late_pooling(st_model, doc), atol=1e-5
        )
    # the same chunk in two documents: two different vectors (its context differs)
    a, b = np.asarray(got.results[0].embeddings[1]), np.asarray(got.results[1].embeddings[1])
    assert float(a @ b) < 0.99
    plain = _openai(srv, "minilm", docs[2])[0]  # a one-chunk document: the plain embedding
    np.testing.assert_allclose(got.results[2].embeddings[0], plain, atol=1e-6)
    assert got.total_tokens > 0


def test_voyage_rerank_equals_our_cohere_rerank(srv: RemoteServer, vo: voyageai.Client) -> None:
    query = "Who is eating?"
    got = vo.rerank(query, DOCS, model="reranker", top_k=2)
    cohere = httpx.post(
        srv.url + "/v2/rerank", json={"model": "reranker", "query": query, "documents": DOCS}
    ).json()["results"]
    assert [r.index for r in got.results] == [r["index"] for r in cohere[:2]]
    for r, c in zip(got.results, cohere, strict=False):
        assert r.relevance_score == pytest.approx(c["relevance_score"], abs=1e-9)
        assert r.document == DOCS[r.index]
    assert got.total_tokens > 0


def test_voyage_multimodal_embed_on_a_vision_language_model(vo: voyageai.Client, vl: Path) -> None:
    from PIL import Image
    from sentence_transformers import SentenceTransformer

    img = Image.new("RGB", (40, 30), (200, 30, 30))
    img.putpixel((1, 1), (0, 0, 255))
    got = vo.multimodal_embed([["red photo", img], [img]], model="vl")
    st = SentenceTransformer(str(vl), device="cpu")
    # images on the document side (the model's document prompt), one vector per content
    want = [
        st.encode({"image": img, "text": "red photo"}, prompt_name="document"),
        st.encode(img, prompt_name="document"),
    ]
    np.testing.assert_allclose(np.asarray(got.embeddings), np.asarray(want), atol=1e-5)
    assert got.image_pixels == 2 * 40 * 30 and got.text_tokens > 0 and got.total_tokens > 0
    # #61.14: with truncation=False an image's text past the window is refused, not cut
    with pytest.raises(voyageai.error.InvalidRequestError, match=r"inputs\[1\].*truncation=true"):
        vo.multimodal_embed([[img], ["red photo " * 40, img]], model="vl-short", truncation=False)


def test_voyage_errors_are_its_detail_body_and_4xx(srv: RemoteServer, vo: voyageai.Client) -> None:
    with pytest.raises(voyageai.error.InvalidRequestError, match="does not exist"):
        vo.embed(["x"], model="nope")
    with pytest.raises(voyageai.error.InvalidRequestError, match="output_dimension"):
        vo.embed(["x"], model="e5", output_dimension=100)  # not a declared Matryoshka size
    with pytest.raises(voyageai.error.InvalidRequestError, match="send truncation=true"):
        vo.embed(["word " * 400], model="minilm", truncation=False)  # Voyage's switch, #61.14
    url = srv.url + "/voyage/v1/embeddings"
    r = httpx.post(url, json={"model": "minilm", "input": "x", "output_dtype": "int4"})
    assert r.status_code == 400 and set(r.json()) == {"detail"}
    assert "output_dtype" in r.json()["detail"]
    for path, body in (  # empty lists are a 400 on every route (the fuzzer found a 500)
        ("/multimodalembeddings", {"model": "vl", "inputs": []}),
        ("/contextualizedembeddings", {"model": "minilm", "inputs": []}),
        ("/embeddings", {"model": "minilm", "input": []}),
        ("/rerank", {"model": "reranker", "query": "q", "documents": []}),
    ):
        r = httpx.post(srv.url + "/voyage/v1" + path, json=body)
        assert r.status_code == 400 and "must not be empty" in r.json()["detail"], path


def test_litellms_voyage_provider(srv: RemoteServer) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    got = litellm.embedding(
        model="voyage/minilm", input=DOCS, api_base=srv.url + "/voyage/v1", api_key="unused"
    )
    vectors = np.asarray([d["embedding"] for d in got.data])
    np.testing.assert_allclose(vectors, _openai(srv, "minilm", DOCS), atol=1e-6)


def test_ollama_sdk_embeds_lists_and_shows(srv: RemoteServer) -> None:
    client = ollama.Client(host=srv.url)
    got = client.embed(model="minilm", input=DOCS)
    np.testing.assert_allclose(np.asarray(got.embeddings), _openai(srv, "minilm", DOCS), atol=1e-6)
    assert got.prompt_eval_count == 8 + 11 + 7 and (got.total_duration or 0) > 0
    old = client.embeddings(model="minilm:latest", prompt=DOCS[0])  # Ollama's name:tag
    np.testing.assert_allclose(old.embedding, _openai(srv, "minilm", DOCS[:1])[0], atol=1e-6)
    cut = client.embed(model="e5", input=DOCS[0], dimensions=128)
    full = _openai(srv, "e5", DOCS[:1])[0][:128]
    np.testing.assert_allclose(cut.embeddings[0], full / np.linalg.norm(full), atol=1e-6)
    # what /api/embed serves (#61.11: the reranker was listed, and refused there); a lazy
    # model never loaded is listed, as what it is is known once it loads
    listed = {m.model for m in client.list().models}
    assert listed == {"minilm:latest", "e5:latest", "vl:latest", "vl-short:latest", "lazy:latest"}
    shown = client.show("minilm")
    assert shown.details is not None and shown.details.family == "bert"
    assert shown.modelinfo is not None  # keys under the architecture, as Ollama's
    assert shown.modelinfo["bert.embedding_length"] == 384
    assert shown.modelinfo["bert.context_length"] == 256
    assert shown.capabilities == ["embedding"]
    assert {m.model for m in client.ps().models} >= {"minilm:latest"}
    with pytest.raises(ollama.ResponseError) as caught:
        client.embed(model="nope", input="x")
    assert caught.value.status_code == 404 and "does not exist" in caught.value.error
    with pytest.raises(ollama.ResponseError) as caught:
        client.embed(model="minilm", input="word " * 400, truncate=False)
    assert caught.value.status_code == 400 and "context length" in caught.value.error
    assert "send truncate: true" in caught.value.error  # Ollama's switch, not OpenAI's (#61.14)
    assert httpx.get(srv.url + "/api/version").json()["version"]


def test_langchains_ollama_embeddings(srv: RemoteServer) -> None:
    from langchain_ollama import OllamaEmbeddings

    lc = OllamaEmbeddings(model="minilm", base_url=srv.url)
    np.testing.assert_allclose(lc.embed_documents(DOCS), _openai(srv, "minilm", DOCS), atol=1e-6)
    np.testing.assert_allclose(
        lc.embed_query(DOCS[0]), _openai(srv, "minilm", DOCS[:1])[0], atol=1e-6
    )


def test_sdks_at_the_wrong_base_url_are_told_the_right_one(srv: RemoteServer) -> None:
    """#61.15: the voyageai SDK at /v1 embedded, then failed with `AttributeError: data` on
    rerank (Cohere's answer) and a bare 404 on contextualized embeddings; Cohere's SDK at /v1
    and Ollama's at /api got bare 404s. Each now gets its own error naming the base URL."""
    import cohere

    wrong = voyageai.Client(api_key="x", base_url=srv.url + "/v1", max_retries=0)
    with pytest.raises(voyageai.error.VoyageError, match="/voyage/v1") as told:
        wrong.rerank("a query", ["a document"], model="reranker")  # Cohere's 400 body
    assert told.value.http_status == 400
    with pytest.raises(voyageai.error.VoyageError, match="/voyage/v1"):
        wrong.contextualized_embed([["a chunk"]], model="minilm")
    co = cohere.ClientV2(api_key="x", base_url=srv.url + "/v1")
    with pytest.raises(cohere.core.api_error.ApiError) as caught:
        co.embed(
            texts=["x"], model="minilm", input_type="search_document", embedding_types=["float"]
        )
    assert caught.value.status_code == 404 and "drop /v1" in str(caught.value.body)
    with pytest.raises(ollama.ResponseError) as missed:
        ollama.Client(host=srv.url + "/api").embed(model="minilm", input="x")
    assert missed.value.status_code == 404 and "drop /api" in missed.value.error
    # the same paths from other clients, and the right base URLs, are untouched
    assert httpx.post(srv.url + "/v1/rerank", json={"model": "reranker", "query": "q",
                      "documents": ["d"]}).status_code == 200  # fmt: skip
    right = voyageai.Client(api_key="x", base_url=srv.url + "/voyage/v1", max_retries=0)
    assert len(right.rerank("a query", ["a document"], model="reranker").results) == 1


def test_ollama_show_is_a_metadata_read_and_pull_says_where_models_come_from(
    srv: RemoteServer,
) -> None:
    """#61.11: /api/show loaded a lazy model (and evicted a loaded one); any tag was accepted;
    /api/pull was a bare 404."""
    client = ollama.Client(host=srv.url)
    shown = client.show("lazy")
    assert shown.capabilities == [] and shown.modelinfo == {"general.architecture": "bert"}
    states = {m["id"]: m["state"] for m in httpx.get(srv.url + "/v1/models").json()["data"]}
    assert states["lazy"] == "unloaded" and "lazy:latest" not in {
        m.model for m in client.ps().models
    }
    with pytest.raises(ollama.ResponseError) as missed:
        client.show("minilm:q4")  # a tag the model does not have
    assert missed.value.status_code == 404
    assert client.show("minilm:latest").capabilities == ["embedding"]
    assert client.pull("minilm").status == "success"
    with pytest.raises(ollama.ResponseError) as unknown:
        client.pull("nomic-embed-text")
    assert unknown.value.status_code == 404 and "configuration" in unknown.value.error
