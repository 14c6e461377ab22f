"""infinity-emb's engine, where it is installed (requirements/infinity.txt; CI's .venv-infinity):
the tutorial's routes and /v1/embeddings on `engine = "torch"` answer what the libraries
compute. The default install has no infinity-emb: there this module is skipped, and the same
routes run on the native engine (test_e2e_tutorial.py, test_e2e_embeddings.py)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from tests.media_samples import data_uri, png
from tests.utils import RemoteServer, server_with

pytest.importorskip("infinity_emb")
pytestmark = pytest.mark.slow

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread."]


@pytest.fixture(scope="module")
def infinity_server(
    tmp_path_factory: pytest.TempPathFactory,
    trained_models: dict[str, Path],
    tiny_media_models: dict[str, Path],
) -> Iterator[RemoteServer]:
    """The tutorial's model order (CLIP, text, rerank, classify), every one on infinity-emb."""
    models = [
        {"name": "clip", "model": tiny_media_models["clip"], "engine": "torch"},
        {"name": "minilm", "model": "builtin:all-MiniLM-L6-v2", "engine": "torch"},
        {"name": "reranker", "model": trained_models["reranker"], "engine": "torch"},
        {"name": "sentiment", "model": trained_models["classifier"], "engine": "torch"},
    ]
    with server_with(tmp_path_factory.mktemp("infinity"), models) as srv:
        yield srv


def _post(srv: RemoteServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=60)


def test_it_runs_on_infinity_emb(infinity_server: RemoteServer) -> None:
    from openai_compat.engine.build import engine_package, runs_natively

    assert not runs_natively("torch")
    assert engine_package(["torch"]) == "infinity_emb"
    metrics = httpx.get(infinity_server.url + "/metrics", timeout=30).text
    assert 'model="minilm"' in metrics


def test_tutorial_routes_answer_what_the_models_compute(
    infinity_server: RemoteServer, st_model: Any, direct_models: Any
) -> None:
    r = _post(infinity_server, "/embed", {"sentences": SENTENCES})
    assert r.status_code == 200, r.text
    want = st_model.encode(SENTENCES, normalize_embeddings=True)
    assert np.max(np.abs(np.asarray(r.json()["embeddings"]) - want)) < 1e-5
    assert r.json()["model"] == "minilm"

    docs = ["The president gave a speech.", "Boil salted water and cook the pasta."]
    r = _post(infinity_server, "/rerank", {"query": "how to cook pasta", "docs": docs})
    assert r.status_code == 200, r.text
    expected = direct_models["rerank"]("how to cook pasta", docs)
    assert [x["index"] for x in r.json()["rankings"]] == [1, 0]
    for ranking in r.json()["rankings"]:
        assert ranking["relevance_score"] == pytest.approx(expected[ranking["index"]], abs=1e-4)

    r = _post(infinity_server, "/classify", {"sentences": ["I love this, it is wonderful."]})
    assert r.status_code == 200, r.text
    (labels,) = r.json()["classifications"]
    assert labels[0]["label"] == "positive" and labels[0]["score"] > labels[1]["score"]

    image = data_uri(png(), "image/png")
    r = _post(infinity_server, "/image_embed", {"image_urls": [image]})
    assert r.status_code == 200, r.text
    v1 = _post(
        infinity_server,
        "/v1/embeddings",
        {"model": "clip", "input": [image], "modality": "image"},
    ).json()
    np.testing.assert_allclose(r.json()["embeddings"][0], v1["data"][0]["embedding"], atol=1e-7)


def test_openai_sdk_floats_and_base64_equal_the_librarys_encode(
    infinity_server: RemoteServer, st_model: Any
) -> None:
    client = openai.OpenAI(base_url=infinity_server.base_url, api_key="unused", max_retries=0)
    want = st_model.encode(SENTENCES, normalize_embeddings=True)
    floats = client.embeddings.create(model="minilm", input=SENTENCES)
    got = np.array([d.embedding for d in floats.data])
    assert np.max(np.abs(got - want)) < 1e-5
    assert float(got[0] @ got[1]) == pytest.approx(0.7553, abs=1e-3)
    tokens = sum(len(st_model.tokenizer(s)["input_ids"]) for s in SENTENCES)
    assert floats.usage.prompt_tokens == tokens
    raw = httpx.post(
        infinity_server.url + "/v1/embeddings",
        json={"model": "minilm", "input": SENTENCES, "encoding_format": "base64"},
        timeout=60,
    ).json()
    decoded = np.array(
        [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in raw["data"]]
    )
    np.testing.assert_array_equal(decoded, got.astype(np.float32))


@pytest.mark.parametrize("waves", [True, False])
async def test_wave_batching_puts_the_feeder_in_front_of_infinity_emb(waves: bool) -> None:
    """wave_batching (infinity-emb's engines only): our feeder gathers requests into waves in
    front of infinity-emb's queue; without it, requests go to that queue directly. Either way
    the answers are the engine's."""
    from openai_compat.frame.settings import ModelConfig, Settings
    from tests.utils import app_client

    config = ModelConfig(
        model="builtin:all-MiniLM-L6-v2",
        name="m",
        engine="torch",
        wave_batching=waves,
        model_warmup=False,
        quantization_range=0.3,
    )
    async with app_client(Settings(models=(config,), cache_bytes=0)) as c:
        entry = c.app_state.registry.loaded("m")  # type: ignore[attr-defined]
        assert (entry.feeder is not None) is waves
        r = await c.post("/v1/embeddings", json={"model": "m", "input": SENTENCES})
        assert r.status_code == 200
        vectors = np.array([d["embedding"] for d in r.json()["data"]])
        assert float(vectors[0] @ vectors[1]) == pytest.approx(0.7553, abs=1e-3)
