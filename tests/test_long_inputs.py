"""Texts longer than the model's window (`long_input`): "chunks" windows cover the text, start
where words start, and each window's vector is sentence-transformers' encode of that slice;
"mean" is their token-weighted mean, renormalised; retrieval finds an answer past the first
window where "truncate" cannot; the window limits are 400s naming the input; "error" and
"truncate" keep their meaning. In process, on the packaged MiniLM (256 tokens)."""

from __future__ import annotations

import base64
import itertools
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest
import pytest_asyncio

from openai_compat.frame.settings import ModelConfig, Settings
from tests.utils import app_client

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

FILLER = (
    "The committee reviewed the quarterly figures and discussed the schedule for the next "
    "meeting, noting that several items would be carried over. "
)
DOC = FILLER * 60 + "The lighthouse keeper's cat is named Saffron and sleeps on the lamp."


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client() -> AsyncIterator[httpx.AsyncClient]:
    model = ModelConfig(
        model="builtin:all-MiniLM-L6-v2",
        name="m",
        quantization_range=0.3,
        window_overlap=16,
        long_input="mean",  # the model's setting; requests may choose otherwise
    )
    cls = ModelConfig(
        model="builtin:all-MiniLM-L6-v2", name="cls", pooling_method="cls", quantization_range=0.3
    )
    prompted = ModelConfig(
        model="builtin:all-MiniLM-L6-v2",
        name="prompted",
        prompts={"query": "Represent this sentence for searching relevant passages: "},
        default_prompt="query",
        model_warmup=False,
    )
    settings = Settings(
        models=(model, cls, prompted), max_windows_per_input=40, max_windows_per_request=60
    )
    async with app_client(settings) as c:
        yield c


async def _embed(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    r = await client.post("/v1/embeddings", json={"model": "m", **body})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def test_chunks_cover_the_text_and_each_is_the_slices_vector(
    client: httpx.AsyncClient, st_model: Any
) -> None:
    body = await _embed(client, input=DOC, long_input="chunks")
    chunks = body["data"][0]["chunks"]
    tokenizer = st_model.tokenizer
    assert len(chunks) > 3 and chunks[0]["start"] == 0 and chunks[-1]["end"] == len(DOC)
    for before, after in itertools.pairwise(chunks):
        assert after["start"] <= before["end"]  # no gap: windows overlap
        start = after["start"]  # where a word (or a punctuation mark) starts, never inside one
        assert not (DOC[start - 1].isalnum() and DOC[start].isalnum())
    slices = [DOC[c["start"] : c["end"]] for c in chunks]
    want = st_model.encode(slices, normalize_embeddings=True)
    got = np.array([c["embedding"] for c in chunks])
    np.testing.assert_allclose(got, want, atol=1e-5)
    tokens = [len(tokenizer(s)["input_ids"]) for s in slices]
    assert [c["tokens"] for c in chunks] == tokens and max(tokens) <= 256
    assert body["usage"]["prompt_tokens"] == sum(tokens)  # every window, overlaps included
    pooled = (want * np.array(tokens)[:, None]).sum(axis=0)
    pooled /= np.linalg.norm(pooled)
    np.testing.assert_allclose(body["data"][0]["embedding"], pooled, atol=1e-5)
    mean = await _embed(client, input=[DOC, "short text"], long_input="mean")
    np.testing.assert_allclose(mean["data"][0]["embedding"], pooled, atol=1e-5)
    assert "chunks" not in mean["data"][0]
    np.testing.assert_allclose(  # a text that fits is its own single window
        mean["data"][1]["embedding"], st_model.encode("short text"), atol=1e-5
    )
    coded = await _embed(client, input=DOC, long_input="chunks", encoding_format="base64")
    for chunk, plain in zip(coded["data"][0]["chunks"], chunks, strict=True):
        floats = np.frombuffer(base64.b64decode(chunk["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(floats, np.asarray(plain["embedding"], dtype="<f4"))


async def test_an_answer_past_the_first_window_is_found_only_by_windows(
    client: httpx.AsyncClient,
) -> None:
    endings = [
        "The lighthouse keeper's cat is named Saffron and sleeps on the lamp.",
        "Quarterly tax filings are due at the end of April for most firms.",
        "The football final was postponed because of heavy snow in the city.",
    ]
    docs = [FILLER * 30 + e for e in endings]
    query = await _embed(client, input="What is the name of the lighthouse keeper's cat?")
    q = np.asarray(query["data"][0]["embedding"])

    async def ranking(mode: str) -> list[float]:
        body = await _embed(client, input=docs, long_input=mode)
        if mode == "chunks":
            return [
                max(float(np.dot(q, c["embedding"])) for c in d["chunks"]) for d in body["data"]
            ]
        return [float(np.dot(q, d["embedding"])) for d in body["data"]]

    for mode in ("mean", "chunks"):
        scores = await ranking(mode)
        assert int(np.argmax(scores)) == 0 and scores[0] > max(scores[1:]) + 0.01, (mode, scores)
    cut = await ranking("truncate")  # the first window only: the same filler for all three
    assert max(cut) - min(cut) < 1e-5


async def test_limits_and_the_other_modes(client: httpx.AsyncClient) -> None:
    huge = FILLER * 600  # about 70 windows
    r = await client.post(
        "/v1/embeddings", json={"model": "m", "input": ["x", huge], "long_input": "mean"}
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "input" and error["code"] == "too_many_windows"
    assert error["message"].startswith("input[1]:") and "max_windows_per_input" in error["message"]
    r = await client.post(
        "/v1/embeddings", json={"model": "m", "input": [DOC] * 10, "long_input": "chunks"}
    )
    assert r.status_code == 400 and "max_windows_per_request" in r.json()["error"]["message"]
    r = await client.post(
        "/v1/embeddings", json={"model": "m", "input": DOC, "long_input": "error"}
    )
    assert r.status_code == 400 and "256" in r.json()["error"]["message"]
    cut = await _embed(client, input=DOC, long_input="truncate")
    assert cut["usage"]["prompt_tokens"] == 256  # what was kept
    r = await client.post("/v1/embeddings", json={"model": "m", "input": DOC, "long_input": "all"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "long_input"


async def test_the_models_setting_reaches_tei_cohere_and_the_tutorial(
    client: httpx.AsyncClient,
) -> None:
    """TEI's /embed, Cohere's embed and the tutorial's /embed have no per-request choice: the
    model's `long_input = "mean"` applies where they leave truncation to the model (one
    plan, inference/plan.py, for every dialect); their own truncate still wins."""
    mean = np.asarray((await _embed(client, input=DOC))["data"][0]["embedding"])  # the default
    cut = np.asarray(
        (await _embed(client, input=DOC, long_input="truncate"))["data"][0]["embedding"]
    )
    assert float(np.abs(mean - cut).max()) > 0.01
    tei = (await client.post("/embed", json={"inputs": DOC})).json()
    np.testing.assert_allclose(tei[0], mean, atol=1e-5)
    tei_cut = (await client.post("/embed", json={"inputs": DOC, "truncate": True})).json()
    np.testing.assert_allclose(tei_cut[0], cut, atol=1e-5)
    body = {
        "model": "m",
        "texts": [DOC],
        "input_type": "search_document",
        "embedding_types": ["float"],
    }
    cohere = (await client.post("/v2/embed", json=body)).json()
    np.testing.assert_allclose(cohere["embeddings"]["float"][0], mean, atol=1e-5)
    cohere_cut = (await client.post("/v2/embed", json={**body, "truncate": "END"})).json()
    np.testing.assert_allclose(cohere_cut["embeddings"]["float"][0], cut, atol=1e-5)
    r = await client.post("/v2/embed", json={**body, "truncate": "NONE"})
    assert r.status_code == 400 and "message" in r.json()  # Cohere's NONE stays an error
    tutorial = await client.post("/embed", json={"sentences": [DOC, "x"], "model_index": 0})
    tutorial = tutorial.json()
    assert tutorial["model"] == "m"
    np.testing.assert_allclose(tutorial["embeddings"][0], mean, atol=1e-5)
    assert tutorial["usage"] > 256  # every window counted


async def test_late_chunking_means_the_documents_own_token_vectors(
    client: httpx.AsyncClient, minilm_path: str, st_model: Any
) -> None:
    """One pass over the whole document, each span's token vectors averaged (transformers,
    directly); the document's own vector is its usual embedding; a CLS-pooled model refuses."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    text = "Berlin is the capital of Germany. It has many museums. The city is very large."
    spans = [[0, 33], [34, 54], [55, len(text)]]
    body = await _embed(client, input=text, long_input="late", chunk_spans=[spans])
    item = body["data"][0]
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    model = AutoModel.from_pretrained(minilm_path).eval()
    enc = tokenizer(text, return_offsets_mapping=True, return_tensors="pt")
    offsets = enc.pop("offset_mapping")[0].tolist()
    with torch.inference_mode():
        hidden = model(**enc).last_hidden_state[0].numpy()
    for (a, b), chunk in zip(spans, item["chunks"], strict=True):
        inside = [k for k, (s, e) in enumerate(offsets) if e > s and s >= a and e <= b]
        want = hidden[inside].mean(axis=0)
        np.testing.assert_allclose(chunk["embedding"], want / np.linalg.norm(want), atol=1e-5)
        assert (chunk["start"], chunk["end"], chunk["tokens"]) == (a, b, len(inside))
    np.testing.assert_allclose(item["embedding"], st_model.encode(text), atol=1e-5)
    assert body["usage"]["prompt_tokens"] == len(offsets)
    by_tokens = await _embed(client, input=text, long_input="late", chunk_tokens=5)
    assert [c["tokens"] for c in by_tokens["data"][0]["chunks"]][:-1] == [5] * (
        len(by_tokens["data"][0]["chunks"]) - 1
    )
    r = await client.post(
        "/v1/embeddings",
        json={"model": "cls", "input": text, "long_input": "late", "chunk_tokens": 5},
    )
    assert r.status_code == 400 and "'cls'" in r.json()["error"]["message"], r.text
    r = await client.post(
        "/v1/embeddings", json={"model": "m", "input": DOC, "long_input": "late", "chunk_tokens": 8}
    )
    assert r.status_code == 400 and "one window" in r.json()["error"]["message"]
    bad = {"model": "m", "input": text, "long_input": "late", "chunk_spans": [[[5, 500]]]}
    r = await client.post("/v1/embeddings", json=bad)
    assert r.status_code == 400 and r.json()["error"]["param"] == "chunk_spans"
    r = await client.post("/v1/embeddings", json={**bad, "chunk_spans": None, "chunk_tokens": None})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chunk_spans"


async def test_the_default_per_route_and_the_servers_truncate(client: httpx.AsyncClient) -> None:
    """A model without long_input or truncate settings: /v1/embeddings refuses a long text
    (OpenAI's behaviour), infinity's bare /embeddings, TEI's /embed and Cohere's embed truncate
    (theirs); an explicit server-wide truncate = true makes /v1/embeddings truncate too."""
    r = await client.post("/v1/embeddings", json={"model": "cls", "input": ["ok", DOC]})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "input_too_long" and error["message"].startswith("input[1]: ")
    assert "long_input: 'truncate'" in error["message"]
    cut = await client.post(
        "/v1/embeddings", json={"model": "cls", "input": DOC, "long_input": "truncate"}
    )
    want = cut.json()["data"][0]["embedding"]
    bare = await client.post("/embeddings", json={"model": "cls", "input": DOC})
    assert bare.status_code == 200 and bare.json()["usage"]["prompt_tokens"] == 256
    np.testing.assert_allclose(bare.json()["data"][0]["embedding"], want, atol=1e-6)
    tei = await client.post("/embed", json={"inputs": DOC, "model": "cls"})
    assert tei.status_code == 200
    cls = ModelConfig(
        model="builtin:all-MiniLM-L6-v2", name="cls", pooling_method="cls", model_warmup=False
    )
    async with app_client(Settings(models=(cls,), truncate=True)) as server_wide:
        r = await server_wide.post("/v1/embeddings", json={"model": "cls", "input": DOC})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 256
        np.testing.assert_allclose(r.json()["data"][0]["embedding"], want, atol=1e-6)


async def test_late_chunks_count_against_the_window_limits_before_any_work(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200k spans in one body, or chunk_tokens 1 over many inputs, are 400s naming the limit;
    no chunk is pooled (a 1.2 MB body of spans held the loop for 6.9 s)."""
    from openai_compat.inference import long_inputs

    pooled: list[int] = []
    real = long_inputs._late_pool
    monkeypatch.setattr(long_inputs, "_late_pool", lambda p, t: pooled.append(1) or real(p, t))
    text = "Berlin is the capital of Germany. It has many museums. The city is very large."
    many = [[k % 70, k % 70 + 5] for k in range(200_000)]
    r = await client.post(
        "/v1/embeddings",
        json={"model": "m", "input": text, "long_input": "late", "chunk_spans": [many]},
    )
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "too_many_windows", r.text
    assert error["param"] == "chunk_spans" and "200000 chunks" in error["message"]
    per_input = [[[0, 6]] * 30] * 3  # 90 chunks: within 40 per input, past 60 per request
    r = await client.post(
        "/v1/embeddings",
        json={"model": "m", "input": [text] * 3, "long_input": "late", "chunk_spans": per_input},
    )
    assert r.status_code == 400 and "90 chunks" in r.json()["error"]["message"], r.text
    r = await client.post(
        "/v1/embeddings",
        json={"model": "m", "input": [text] * 4, "long_input": "late", "chunk_tokens": 1},
    )
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "too_many_windows", r.text
    assert error["param"] == "chunk_tokens" and error["message"].startswith("The inputs make")
    r = await client.post(
        "/v1/embeddings",
        json={"model": "m", "input": ["ok", DOC[:600]], "long_input": "late", "chunk_tokens": 1},
    )
    error = r.json()["error"]
    assert r.status_code == 400 and error["message"].startswith("input[1] in chunks of 1"), r.text
    assert pooled == []


async def test_late_chunks_pool_off_the_event_loop(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from openai_compat.inference import long_inputs

    threads: list[int] = []
    real = long_inputs._late_pool

    def spy(plan: Any, tokens: Any) -> Any:
        threads.append(threading.get_ident())
        return real(plan, tokens)

    monkeypatch.setattr(long_inputs, "_late_pool", spy)
    body = await _embed(
        client, input=["one two three four", "five six"], long_input="late", chunk_tokens=2
    )
    assert [len(d["chunks"]) for d in body["data"]] == [2, 1]
    assert threads and threading.get_ident() not in threads


async def test_late_chunks_by_tokens_leave_the_prompt_out(
    client: httpx.AsyncClient, st_model: Any
) -> None:
    """With a prompt, chunk_tokens runs over the document's tokens only: the first chunk
    starts at 0 (it began at minus the prompt's length and held the prompt's tokens)."""
    text = "Berlin is the capital of Germany. It has many museums."
    content = len(st_model.tokenizer(text, add_special_tokens=False)["input_ids"])
    r = await client.post(
        "/v1/embeddings",
        json={"model": "prompted", "input": text, "long_input": "late", "chunk_tokens": 4},
    )
    assert r.status_code == 200, r.text
    chunks = r.json()["data"][0]["chunks"]
    assert chunks[0]["start"] == 0 and chunks[-1]["end"] == len(text)
    assert sum(c["tokens"] for c in chunks) == content
    assert all(0 <= c["start"] < c["end"] <= len(text) for c in chunks)
    assert (
        text[chunks[0]["start"] : chunks[0]["end"]] == "Berlin is the capital"[: chunks[0]["end"]]
    )


async def test_late_chunking_an_empty_input_gives_no_chunks(
    client: httpx.AsyncClient, st_model: Any
) -> None:
    body = await _embed(client, input=["", "   ", "word"], long_input="late", chunk_tokens=3)
    assert [d["chunks"] for d in body["data"][:2]] == [[], []]
    assert len(body["data"][2]["chunks"]) == 1
    np.testing.assert_allclose(body["data"][0]["embedding"], st_model.encode(""), atol=1e-5)
    r = await client.post(
        "/v1/embeddings",
        json={"model": "m", "input": "", "long_input": "late", "chunk_spans": [[[0, 1]]]},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "chunk_spans", r.text
