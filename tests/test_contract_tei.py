"""TEI's routes against TEI's published OpenAPI document (tests/contracts/tei.json, TEI 1.9.3),
successes and errors, on live servers; and the deviations that document and TEI's router
code settle: status codes (422 Validation, 400 Empty), `/tokenize`'s input slices, `/info`'s
served_model_name and labels, TEI's error body on every error of its routes.

Where TEI's spec and its running code differ, the code wins (router/src/http/server.rs at
1.9): the spec still lists 413 "Batch size error" for too many inputs, the server answers 422
Validation since PR #818; the spec's examples write error types lower-case, the server (and
the spec's own ErrorType enum) use the variant names.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from openai_compat.frame.settings import ModelConfig, Settings
from tests.contract import Contract
from tests.utils import RemoteServer, app_client

pytestmark = pytest.mark.slow

TEI = Contract("tei", error_schema="ErrorResponse")


@pytest.fixture(scope="module")
def tei(server: RemoteServer) -> Iterator[httpx.Client]:
    """The default server: MiniLM."""
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def tei_multi(multi_server: RemoteServer) -> Iterator[httpx.Client]:
    """CLIP, MiniLM, a reranker and a classifier: TEI's routes use the default of each."""
    with httpx.Client(base_url=multi_server.url, timeout=60) as client:
        yield client


def _error(status: int, body: Any, want_status: int, want_type: str) -> None:
    assert (status, body["error_type"]) == (want_status, want_type), body


def test_embed_answers_and_errors_follow_teis_schema(tei: httpx.Client) -> None:
    status, body = TEI.post(tei, "/embed", {"inputs": "What is Deep Learning?"})
    assert status == 200 and len(body) == 1 and len(body[0]) == 384
    status, body = TEI.post(
        tei, "/embed", {"inputs": ["a", "b"], "normalize": True, "truncate": True}
    )
    assert status == 200 and len(body) == 2
    # an empty batch: 400 Empty (TEI's ErrorType::Empty)
    _error(*TEI.post(tei, "/embed", {"inputs": []}), 400, "Empty")
    # too many inputs, too long with truncate false: 422 Validation (TEI >= 1.9)
    _error(*TEI.post(tei, "/embed", {"inputs": ["x"] * 2049}), 422, "Validation")
    long = "word " * 600
    _error(*TEI.post(tei, "/embed", {"inputs": long, "truncate": False}), 422, "Validation")
    # a body the schema refuses, on this shared bare path: TEI's body too
    bad = {"inputs": "x", "truncation_direction": "Sideways"}
    _error(*TEI.post(tei, "/embed", bad), 422, "Validation")


def test_rerank_predict_and_sparse_follow_teis_schema(tei_multi: httpx.Client) -> None:
    tei = tei_multi
    body = {"query": "What is Deep Learning?", "texts": ["Deep Learning is", "taxes"]}
    status, ranks = TEI.post(tei, "/rerank", {**body, "return_text": True, "raw_scores": True})
    assert status == 200 and {r["index"] for r in ranks} == {0, 1} and "text" in ranks[0]
    _error(*TEI.post(tei, "/rerank", {"query": "q", "texts": []}), 400, "Empty")
    _error(*TEI.post(tei, "/rerank", {"query": "q", "texts": "x"}), 422, "Validation")
    status, predictions = TEI.post(tei, "/predict", {"inputs": "I like you."})
    assert status == 200 and {p["label"] for p in predictions} == {"negative", "positive"}
    status, pairs = TEI.post(tei, "/predict", {"inputs": [["I like you.", "Me too."]]})
    assert status == 200 and len(pairs) == 1
    _error(*TEI.post(tei, "/predict", {"inputs": 5}), 422, "Validation")
    # no sparse model here: TEI's body, TEI's status for a model that cannot
    status, err = TEI.post(tei, "/embed_sparse", {"inputs": "x"})
    assert status == 422 and err["error_type"] == "Validation"


def test_tokenize_texts_are_the_inputs_slices(tei: httpx.Client) -> None:
    """TEI's `into_tokens`: a non-special token's text is input[start:stop] (byte offsets),
    not the vocabulary entry ("this" for "This", "##bed" for "bed")."""
    text = "This is lovelace, café."
    status, body = TEI.post(tei, "/tokenize", {"inputs": text})
    assert status == 200
    tokens = body[0]
    encoded = text.encode()
    assert tokens[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    words = [t for t in tokens if not t["special"]]
    for t in words:
        assert t["text"] == encoded[t["start"] : t["stop"]].decode(), t
    texts = [t["text"] for t in words]
    assert texts[:2] == ["This", "is"] and len(texts) > 6  # "lovelace" is several pieces
    assert "".join(texts) == text.replace(" ", "") and not any("##" in t for t in texts)
    assert words[-2]["text"] == "café" and words[-2]["stop"] - words[-2]["start"] == 5  # bytes
    _error(*TEI.post(tei, "/tokenize", {"inputs": 5}), 422, "Validation")
    status, decoded = TEI.post(tei, "/decode", {"ids": [t["id"] for t in tokens]})
    assert status == 200 and decoded == ["this is lovelace, cafe."]


def test_info_and_health_follow_teis_schema(tei: httpx.Client) -> None:
    r = tei.get("/info")
    info = TEI.check("/info", "get", r)
    assert info["served_model_name"] == "all-MiniLM-L6-v2" and "embedding" in info["model_type"]
    assert tei.get("/health").status_code == 200


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def classifier_app(trained_models: dict[str, Path]) -> AsyncIterator[httpx.AsyncClient]:
    """TEI serving one sequence classifier, behind an API key and a small body limit."""
    model = ModelConfig(model=str(trained_models["classifier"]), name="sentiment")
    settings = Settings(models=(model,), api_key=("k",), max_body_bytes=10_000)
    async with app_client(settings) as client:
        yield client


@pytest.mark.asyncio(loop_scope="module")
async def test_info_of_a_classifier_names_its_labels(classifier_app: httpx.AsyncClient) -> None:
    r = await classifier_app.get("/info", headers={"Authorization": "Bearer k"})
    info = TEI.check("/info", "get", r)
    labels = info["model_type"]["classifier"]
    assert labels["id2label"] == {"0": "negative", "1": "positive"}  # the model's, not {}
    assert labels["label2id"] == {"negative": 0, "positive": 1}


@pytest.mark.asyncio(loop_scope="module")
async def test_the_gateways_errors_on_shared_paths_speak_tei(
    classifier_app: httpx.AsyncClient,
) -> None:
    """401 and 413 come before the body is parsed: its first bytes name the dialect."""
    r = await classifier_app.post("/embed", json={"inputs": "x"})
    assert r.status_code == 401
    assert TEI.check("/embed", "post", r)["error_type"] == "Validation"
    r = await classifier_app.post("/embed", json={"sentences": ["x"]})  # the tutorial's
    assert r.status_code == 401 and "message" in r.json()["error"]  # OpenAI's envelope
    big = {"inputs": ["x" * 100] * 200}
    r = await classifier_app.post(
        "/rerank",
        json={"texts": big["inputs"], "query": "q"},
        headers={"Authorization": "Bearer k"},
    )
    assert r.status_code == 413
    assert TEI.check("/rerank", "post", r)["error_type"] == "Validation"
