"""Rerank and classify against the live server with the cohere SDK, LangChain and LlamaIndex.

The reranker and classifier are real (fine-tuned in a fixture); tests check meaning on
sentences the models never saw, not only shapes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cohere
import httpx
import pytest

from tests.utils import RemoteServer, server_with

pytestmark = pytest.mark.slow

QUERY = "how to cook pasta"
DOCS = [
    "The president gave a speech about taxes.",
    "Boil salted water and cook the pasta for ten minutes.",
    "Elephants are the largest land animals.",
    "He plays the violin in an orchestra.",
]
RELEVANT = 1


def _post(srv: RemoteServer, path: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=120)


def test_cohere_v2_client_ranks_the_relevant_passage_first(multi_server: RemoteServer) -> None:
    co = cohere.ClientV2(base_url=multi_server.url, api_key="unused")
    resp = co.rerank(model="reranker", query=QUERY, documents=DOCS, top_n=2)
    assert resp.results[0].index == RELEVANT
    assert len(resp.results) == 2
    scores = [r.relevance_score for r in resp.results]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    assert scores[0] > 0.5 > scores[1]
    assert getattr(resp.results[0], "document", None) is None  # v2: never unless asked
    assert resp.meta is not None and resp.meta.billed_units.search_units == 1  # type: ignore[union-attr]


def test_cohere_v1_client_with_return_documents(multi_server: RemoteServer) -> None:
    co = cohere.Client(base_url=multi_server.url, api_key="unused")
    query = "what is the largest ocean"
    docs = [
        "Bake the cake at 180 degrees for forty minutes.",
        "He plays the violin in an orchestra.",
        "The Pacific is the largest and deepest ocean on Earth.",
    ]
    resp = co.rerank(model="reranker", query=query, documents=docs, return_documents=True)
    assert resp.results[0].index == 2
    assert len(resp.results) == 3
    assert resp.results[0].document.text == docs[2]  # type: ignore[union-attr]


def test_langchain_cohere_rerank_compresses_documents(multi_server: RemoteServer) -> None:
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    rr = CohereRerank(model="reranker", base_url=multi_server.url, cohere_api_key="unused", top_n=1)
    out = rr.compress_documents([Document(page_content=d) for d in DOCS], QUERY)
    assert [d.page_content for d in out] == [DOCS[RELEVANT]]
    assert out[0].metadata["relevance_score"] > 0.5


def test_llamaindex_cohere_rerank_postprocessor(multi_server: RemoteServer) -> None:
    from llama_index.core.schema import NodeWithScore, TextNode
    from llama_index.postprocessor.cohere_rerank import CohereRerank

    rr = CohereRerank(api_key="unused", base_url=multi_server.url, model="reranker", top_n=2)
    nodes = [NodeWithScore(node=TextNode(text=d), score=0.0) for d in DOCS]
    out = rr.postprocess_nodes(nodes, query_str=QUERY)
    assert out[0].node.get_content() == DOCS[RELEVANT] and len(out) == 2


def test_embedding_model_reranks_by_cosine(multi_server: RemoteServer, st_model) -> None:  # type: ignore[no-untyped-def]
    body = _post(
        multi_server, "/v1/rerank", {"model": "minilm", "query": QUERY, "documents": DOCS}
    ).json()
    assert body["results"][0]["index"] == RELEVANT
    q, *d = st_model.encode([QUERY, *DOCS], normalize_embeddings=True)
    for r in body["results"]:
        cos = float(q @ d[r["index"]])
        assert r["relevance_score"] == pytest.approx((cos + 1) / 2, abs=1e-5)
    assert "document" not in body["results"][0]  # v1's return_documents defaults to false


def test_nulls_mean_not_given_and_jina_style_objects(multi_server: RemoteServer) -> None:
    body = _post(
        multi_server,
        "/v1/rerank",
        {
            "model": "reranker",
            "query": QUERY,
            "documents": [{"text": d} for d in DOCS],
            "top_n": None,
            "return_documents": True,
            "rank_fields": None,
            "max_chunks_per_doc": None,
        },
    ).json()
    assert len(body["results"]) == len(DOCS)
    assert body["results"][0]["document"] == {"text": DOCS[RELEVANT]}
    assert body["meta"]["api_version"]["version"] == "1"
    assert body["usage"]["total_tokens"] == body["meta"]["tokens"]["input_tokens"] > 0


def test_rank_fields_rank_objects_on_the_named_fields(multi_server: RemoteServer) -> None:
    docs = [
        {"title": "Taxes", "body": d, "id": 7} if i != RELEVANT else {"title": "Pasta", "body": d}
        for i, d in enumerate(DOCS)
    ]
    body = _post(
        multi_server,
        "/v1/rerank",
        {
            "model": "reranker",
            "query": QUERY,
            "documents": docs,
            "rank_fields": ["title", "body"],
            "return_documents": True,
            "top_n": 1,
        },
    ).json()
    assert body["results"][0]["index"] == RELEVANT
    assert body["results"][0]["document"] == docs[RELEVANT]  # objects come back as given


def test_max_tokens_per_doc_truncates_documents(multi_server: RemoteServer) -> None:
    long_docs = [d + " filler words" * 200 for d in DOCS]
    full = _post(
        multi_server, "/v2/rerank", {"model": "reranker", "query": QUERY, "documents": long_docs}
    ).json()
    cut = _post(
        multi_server,
        "/v2/rerank",
        {"model": "reranker", "query": QUERY, "documents": long_docs, "max_tokens_per_doc": 16},
    ).json()
    assert cut["usage"]["total_tokens"] < full["usage"]["total_tokens"]
    # truncated to the model's maximum (512) without a cap: 4 pairs of 512 tokens
    assert full["usage"]["total_tokens"] == 4 * 512
    assert cut["results"][0]["index"] == RELEVANT


def test_thousand_documents_work_and_the_cap_refuses_more(multi_server: RemoteServer) -> None:
    docs = [f"note number {i} about gardening and weather" for i in range(1200)]
    docs[777] = "Boil salted water and cook the pasta for ten minutes."
    body = _post(
        multi_server,
        "/v2/rerank",
        {"model": "reranker", "query": QUERY, "documents": docs, "top_n": 3},
    ).json()
    assert body["results"][0]["index"] == 777 and len(body["results"]) == 3
    assert body["meta"]["billed_units"]["search_units"] == 12
    r = _post(
        multi_server,
        "/v1/rerank",
        {"model": "reranker", "query": QUERY, "documents": ["x"] * 1501},
    )
    # Cohere's routes answer in Cohere's error shape: {"message": ...}
    assert r.status_code == 400 and r.json() == {
        "message": "Too many documents: at most 1500 per request, got 1501."
    }


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "reranker", "documents": DOCS}, 400, "query"),
        ({"model": "reranker", "query": QUERY, "documents": []}, 400, "documents"),
        ({"model": "reranker", "query": QUERY, "documents": DOCS, "top_n": 0}, 400, "top_n"),
        (
            {"model": "reranker", "query": QUERY, "documents": [{"a": 1}], "rank_fields": ["b"]},
            400,
            "documents[0]",
        ),
        ({"model": "reranker", "query": QUERY, "documents": [{"title": "x"}]}, 400, "documents[0]"),
        ({"model": "reranker", "query": QUERY, "documents": [3]}, 400, "documents"),
        ({"model": "nope", "query": QUERY, "documents": DOCS}, 404, "model"),
        ({"model": "sentiment", "query": QUERY, "documents": DOCS}, 400, "model"),
        (
            {"model": "reranker", "query": QUERY, "documents": DOCS, "max_tokens_per_doc": 0},
            400,
            "max_tokens_per_doc",
        ),
    ],
)
@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_bad_rerank_requests(
    multi_server: RemoteServer, path: str, body: dict[str, object], status: int, param: str
) -> None:
    r = _post(multi_server, path, body)
    assert r.status_code == status, r.text
    message = r.json()["message"]
    assert set(r.json()) == {"message"} and param in message.replace("Model", "model"), message


def test_cohere_sdk_raises_on_bad_requests(multi_server: RemoteServer) -> None:
    co = cohere.ClientV2(base_url=multi_server.url, api_key="unused")
    with pytest.raises(cohere.BadRequestError):
        co.rerank(model="reranker", query=QUERY, documents=[])
    with pytest.raises(cohere.NotFoundError):
        co.rerank(model="missing", query=QUERY, documents=DOCS)


UNSEEN = [
    ("This restaurant was superb, I enjoyed every bite.", "positive"),
    ("The hotel room was filthy and the service awful.", "negative"),
    ("I really like this phone, it works great.", "positive"),
    ("Terrible customer support, very disappointing.", "negative"),
]


def test_classify_labels_unseen_sentences(multi_server: RemoteServer) -> None:
    body = _post(
        multi_server, "/v1/classify", {"model": "sentiment", "input": [t for t, _ in UNSEEN]}
    ).json()
    assert body["object"] == "list" and body["model"] == "sentiment"
    for item, (_, label) in zip(body["data"], UNSEEN, strict=True):
        assert item["label"] == label and item["score"] > 0.5
        assert {x["label"] for x in item["labels"]} == {"positive", "negative"}
        scores = [x["score"] for x in item["labels"]]
        assert scores == sorted(scores, reverse=True)
        assert sum(scores) == pytest.approx(1.0, abs=1e-4)
        assert item["labels"][0] == {"label": item["label"], "score": item["score"]}


def test_classify_usage_counts_real_tokens(
    multi_server: RemoteServer, trained_models: dict[str, object]
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(trained_models["classifier"]))
    text = UNSEEN[0][0]
    body = _post(multi_server, "/v1/classify", {"model": "sentiment", "input": text}).json()
    assert body["usage"]["prompt_tokens"] == len(tok(text)["input_ids"])
    assert len(body["data"]) == 1


def test_classify_raw_scores_are_logits(multi_server: RemoteServer) -> None:
    text = UNSEEN[0][0]
    probs = _post(multi_server, "/v1/classify", {"model": "sentiment", "input": text}).json()
    raw = _post(
        multi_server, "/v1/classify", {"model": "sentiment", "input": text, "raw_scores": True}
    ).json()
    import math

    logits = {x["label"]: x["score"] for x in raw["data"][0]["labels"]}
    assert raw["data"][0]["label"] == "positive"
    assert logits["positive"] > 1 and logits["negative"] < 0  # logits, not probabilities
    softmax = math.exp(logits["positive"]) / sum(math.exp(v) for v in logits.values())
    assert softmax == pytest.approx(probs["data"][0]["score"], abs=1e-4)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "sentiment", "input": []}, 400, "input"),
        ({"model": "sentiment"}, 400, "input"),
        ({"model": "sentiment", "input": [1, 2]}, 400, "input"),
        ({"model": "minilm", "input": "x"}, 400, "model"),
        ({"model": "nope", "input": "x"}, 404, "model"),
    ],
)
def test_bad_classify_requests(
    multi_server: RemoteServer, body: dict[str, object], status: int, param: str
) -> None:
    r = _post(multi_server, "/v1/classify", body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_models_list_shows_each_capability(multi_server: RemoteServer) -> None:
    import openai

    client = openai.OpenAI(base_url=multi_server.base_url, api_key="unused", max_retries=0)
    caps = {m.id: (m.model_extra or {})["capabilities"] for m in client.models.list()}
    assert caps == {
        "clip": ["embed", "image", "rerank"],
        "minilm": ["embed", "rerank"],
        "reranker": ["rerank"],
        "sentiment": ["classify"],
    }
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="reranker", input="x")
    assert "rerank" in info.value.message


# ---------------------------------------------------------------- token limits per model kind


@pytest.fixture(scope="module")
def limited_server(
    tmp_path_factory: pytest.TempPathFactory,
    trained_models: dict[str, Path],
    tiny_media_models: dict[str, Path],
) -> Iterator[RemoteServer]:
    """Every kind of model with a configured max_length; MiniLM refuses over-long input."""
    models = [
        {"name": "clip", "model": tiny_media_models["clip"], "max_length": 10},
        {
            "name": "minilm",
            "model": "builtin:all-MiniLM-L6-v2",
            "max_length": 20,
            "truncate": False,
        },
        {"name": "reranker", "model": trained_models["reranker"], "max_length": 32},
        {"name": "sentiment", "model": trained_models["classifier"], "max_length": 16},
    ]
    with server_with(tmp_path_factory.mktemp("limited"), models) as srv:
        yield srv


FILLER = " and then some more words follow here" * 40


def _assert_scores(body: dict[str, Any], expected: list[float]) -> None:
    """Every document's relevance_score equals the cross-encoder run directly."""
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert got == {i: pytest.approx(v, abs=1e-4) for i, v in enumerate(expected)}


def test_each_model_reports_the_limit_it_applies(limited_server: RemoteServer) -> None:
    cards = httpx.get(limited_server.base_url + "/models").json()["data"]
    limits = {c["id"]: c["max_input_tokens"] for c in cards}
    assert limits == {"clip": 10, "minilm": 20, "reranker": 32, "sentiment": 16}


def test_cross_encoder_truncates_pairs_at_its_configured_limit(
    limited_server: RemoteServer,
    direct_models,  # type: ignore[no-untyped-def]
) -> None:
    docs = [d + FILLER for d in DOCS]
    body = _post(
        limited_server, "/v2/rerank", {"model": "reranker", "query": QUERY, "documents": docs}
    ).json()
    assert body["usage"]["total_tokens"] == 32 * len(docs)
    _assert_scores(body, direct_models["rerank"](QUERY, docs, max_length=32))


def test_huge_documents_score_as_the_model_scores_them_whole(
    multi_server: RemoteServer,
    direct_models,  # type: ignore[no-untyped-def]
) -> None:
    """Documents far past the limit reach the engine cut; the scores must not change."""
    docs = [d + FILLER * 30 for d in DOCS]  # ~50k characters each
    body = _post(
        multi_server, "/v2/rerank", {"model": "reranker", "query": QUERY, "documents": docs}
    ).json()
    assert body["usage"]["total_tokens"] == 512 * len(docs)
    _assert_scores(body, direct_models["rerank"](QUERY, docs, max_length=512))


def test_classifier_truncates_at_its_configured_limit(
    limited_server: RemoteServer,
    direct_models,  # type: ignore[no-untyped-def]
) -> None:
    import numpy as np

    text = UNSEEN[0][0] + FILLER
    probs = _post(limited_server, "/v1/classify", {"model": "sentiment", "input": text}).json()
    raw = _post(
        limited_server,
        "/v1/classify",
        {"model": "sentiment", "input": text, "raw_scores": True},
    ).json()
    assert probs["usage"]["total_tokens"] == 16 == raw["usage"]["total_tokens"]
    logits = direct_models["classify"]([text], max_length=16)[0]
    expected = np.exp(logits) / np.exp(logits).sum()
    by_label = {x["label"]: x["score"] for x in probs["data"][0]["labels"]}
    assert by_label["negative"] == pytest.approx(float(expected[0]), abs=1e-4)
    assert by_label["positive"] == pytest.approx(float(expected[1]), abs=1e-4)
    raw_by_label = {x["label"]: x["score"] for x in raw["data"][0]["labels"]}
    assert raw_by_label["positive"] == pytest.approx(float(logits[1]), abs=1e-4)


def test_clip_text_side_truncates_at_its_configured_limit(
    limited_server: RemoteServer,
    direct_models,  # type: ignore[no-untyped-def]
) -> None:
    import numpy as np

    text = "a red square on a white table " * 8
    refused = _post(limited_server, "/v1/embeddings", {"model": "clip", "input": text})
    assert refused.status_code == 400  # past the window: /v1/embeddings' default, as OpenAI
    asked = {"model": "clip", "input": text, "long_input": "truncate"}
    body = _post(limited_server, "/v1/embeddings", asked).json()
    assert body["usage"]["prompt_tokens"] == 10
    got = np.asarray(body["data"][0]["embedding"])
    np.testing.assert_allclose(got, direct_models["clip_text"](text, 10), atol=1e-5)


def test_refusals_name_the_clients_own_fields(limited_server: RemoteServer) -> None:
    long = "word " * 40
    cases = [
        ("/v1/embeddings", {"model": "minilm", "input": ["ok", long]}, "input", "input[1]:"),
        (
            "/v2/rerank",
            {"model": "minilm", "query": "q", "documents": ["a", long]},
            "documents",
            "documents[1]:",
        ),
        ("/v2/rerank", {"model": "minilm", "query": long, "documents": ["a"]}, "query", "query:"),
        ("/embed", {"sentences": [long], "model_index": 1}, "sentences", "sentences[0]:"),
        ("/rerank", {"query": "q", "docs": ["a", "b", long], "model_index": 1}, "docs", "docs[2]:"),
    ]
    for path, body, param, prefix in cases:
        r = _post(limited_server, path, body)
        assert r.status_code == 400, (path, r.text)
        if path == "/v2/rerank":  # Cohere's error shape: the message alone
            message = r.json()["message"]
        else:
            error = r.json()["error"]
            assert error["param"] == param and error["code"] == "input_too_long", (path, error)
            message = error["message"]
        assert message.startswith(prefix), (path, message)
        assert "42 tokens" in message and "20" in message


def test_a_limit_the_model_cannot_take_stops_start_up(tmp_path: Path) -> None:
    cfg = tmp_path / "too-long.toml"
    cfg.write_text('[[models]]\nmodel = "builtin:all-MiniLM-L6-v2"\nmax_length = 1000\n')
    srv = RemoteServer(["--config", str(cfg)], wait_ready=False)
    try:
        assert srv.proc.wait(120) == 1
        assert "max_length 1000 is more than this model takes (512)" in srv.output()
    finally:
        srv.stop()
