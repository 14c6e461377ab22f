"""/v1/embeddings against the live server with the real openai, LangChain and LlamaIndex clients.

Every vector is checked against a direct sentence-transformers encode of the same model folder.
"""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest
import tiktoken

from tests.utils import RemoteServer

pytestmark = pytest.mark.slow

MODEL = "all-MiniLM-L6-v2"
FOOD = "A man is eating food."
BREAD = "A man is eating a piece of bread."
STOCKS = "The stock market crashed today."
TEXTS = [FOOD, BREAD, STOCKS, "", "Ünïcödé ✓ and emoji 🚀 survive the trip."]


@pytest.fixture(scope="module")
def reference(st_model) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    vectors = st_model.encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    return dict(zip(TEXTS, vectors, strict=True))


@pytest.fixture(scope="module")
def client(server: RemoteServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def _assert_matches(got: list[float] | np.ndarray, want: np.ndarray) -> None:
    got = np.asarray(got, dtype=np.float32)
    assert got.shape == want.shape
    assert float(np.max(np.abs(got - want))) < 1e-5


def test_sdk_default_base64_equals_sentence_transformers(client, reference) -> None:  # type: ignore[no-untyped-def]
    resp = client.embeddings.create(model=MODEL, input=TEXTS)  # the SDK asks for base64
    assert [d.index for d in resp.data] == list(range(len(TEXTS)))
    for item, text in zip(resp.data, TEXTS, strict=True):
        _assert_matches(item.embedding, reference[text])
    vecs = [np.asarray(d.embedding) for d in resp.data]
    assert _cos(vecs[0], vecs[1]) == pytest.approx(0.7553, abs=0.01)
    assert _cos(vecs[0], vecs[2]) == pytest.approx(0.0088, abs=0.01)
    assert resp.model == MODEL and resp.object == "list"


def test_sdk_float_format_and_base64_decode_to_the_same_floats(server, client, reference) -> None:  # type: ignore[no-untyped-def]
    resp = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    for item, text in zip(resp.data, TEXTS, strict=True):
        _assert_matches(item.embedding, reference[text])
    raw = httpx.post(
        server.base_url + "/embeddings",
        json={"model": MODEL, "input": TEXTS, "encoding_format": "base64"},
    ).json()
    for b64, item in zip(raw["data"], resp.data, strict=True):
        decoded = np.frombuffer(base64.b64decode(b64["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(decoded, np.asarray(item.embedding, dtype=np.float32))


def test_usage_counts_real_model_tokens(client, st_model) -> None:  # type: ignore[no-untyped-def]
    resp = client.embeddings.create(model=MODEL, input=[FOOD, BREAD])
    tok = st_model.tokenizer
    expected = sum(len(tok(t)["input_ids"]) for t in (FOOD, BREAD))
    assert resp.usage.prompt_tokens == expected == resp.usage.total_tokens
    assert expected != len(FOOD) + len(BREAD)  # not characters


def test_long_input_is_refused_by_default_as_openai_does(client) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=MODEL, input=["short", "word " * 1000])
    error = caught.value.body
    assert error["param"] == "input" and error["code"] == "input_too_long"
    assert error["message"].startswith("input[1]: 1002 tokens, more than the 256 this model")
    assert "long_input: 'truncate'" in error["message"]


def test_long_input_is_truncated_and_usage_counts_after_truncation(client, st_model) -> None:  # type: ignore[no-untyped-def]
    long_text = "word " * 1000
    resp = client.embeddings.create(
        model=MODEL, input=long_text, encoding_format="float", extra_body={"long_input": "truncate"}
    )
    assert resp.usage.prompt_tokens == 256
    want = st_model.encode([long_text], normalize_embeddings=True)[0]
    _assert_matches(resp.data[0].embedding, want)


def test_token_id_inputs_equal_text(client, reference) -> None:  # type: ignore[no-untyped-def]
    enc = tiktoken.get_encoding("cl100k_base")
    single = client.embeddings.create(model=MODEL, input=enc.encode(FOOD))
    _assert_matches(single.data[0].embedding, reference[FOOD])
    texts = [t for t in TEXTS if t]  # "" has no token ids: an empty id array is a 400
    many = client.embeddings.create(model=MODEL, input=[enc.encode(t) for t in texts])
    for item, text in zip(many.data, texts, strict=True):
        _assert_matches(item.embedding, reference[text])
    with pytest.raises(openai.BadRequestError, match="empty array of token ids"):
        client.embeddings.create(model=MODEL, input=[enc.encode(FOOD), []])


def test_dimensions_cut_and_renormalise(client, reference) -> None:  # type: ignore[no-untyped-def]
    resp = client.embeddings.create(model=MODEL, input=FOOD, dimensions=64)
    got = np.asarray(resp.data[0].embedding)
    want = reference[FOOD][:64] / np.linalg.norm(reference[FOOD][:64])
    assert got.shape == (64,)
    assert float(np.max(np.abs(got - want))) < 1e-5
    full = client.embeddings.create(model=MODEL, input=FOOD, dimensions=384)
    _assert_matches(full.data[0].embedding, reference[FOOD])


def test_alias_works_from_the_sdk(client, reference) -> None:  # type: ignore[no-untyped-def]
    resp = client.embeddings.create(model="text-embedding-3-small", input=FOOD, user="u-1")
    _assert_matches(resp.data[0].embedding, reference[FOOD])


def test_2048_inputs_succeed_and_2049_are_refused(client) -> None:  # type: ignore[no-untyped-def]
    texts = [f"sentence number {i}" for i in range(2048)]
    resp = client.embeddings.create(model=MODEL, input=texts)
    assert len(resp.data) == 2048 and resp.data[-1].index == 2047
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=MODEL, input=[*texts, "one too many"])
    assert "2048" in info.value.message and info.value.param == "input"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"input": []}, "input"),
        ({"input": [[]], "encoding_format": "hex"}, "encoding_format"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": "x", "dimensions": 385}, "dimensions"),
        ({"input": [[1, 2], [100300]]}, "input"),
        ({"input": [[-1]]}, "input"),
        ({"input": [1, "mixed"]}, "input"),
        ({"input": {"not": "a list"}}, "input"),
    ],
)
def test_bad_input_raises_bad_request_never_5xx(client, kwargs, param) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=MODEL, **kwargs)
    err = info.value.body
    assert isinstance(err, dict) and err["param"] == param  # the SDK unwraps {"error": ...}
    assert err["type"] == "invalid_request_error"


def test_empty_string_is_a_valid_input(client, reference) -> None:  # type: ignore[no-untyped-def]
    resp = client.embeddings.create(model=MODEL, input="")
    _assert_matches(resp.data[0].embedding, reference[""])


def test_langchain_openai_embeddings_with_default_settings(server, reference) -> None:  # type: ignore[no-untyped-def]
    from langchain_openai import OpenAIEmbeddings

    # Defaults: tiktoken chunking on, so LangChain sends cl100k token ids, not text.
    emb = OpenAIEmbeddings(model=MODEL, base_url=server.base_url, api_key="unused", max_retries=0)
    docs = emb.embed_documents([FOOD, BREAD, STOCKS])
    for got, text in zip(docs, [FOOD, BREAD, STOCKS], strict=True):
        _assert_matches(got, reference[text])
    _assert_matches(emb.embed_query(FOOD), reference[FOOD])


def test_llamaindex_openai_like_embedding(server, reference) -> None:  # type: ignore[no-untyped-def]
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding

    emb = OpenAILikeEmbedding(model_name=MODEL, api_base=server.base_url, api_key="unused")
    _assert_matches(emb.get_text_embedding(BREAD), reference[BREAD])
    _assert_matches(emb.get_query_embedding(FOOD), reference[FOOD])
    batch = emb.get_text_embedding_batch([FOOD, STOCKS])
    _assert_matches(batch[1], reference[STOCKS])


def test_curl_style_request_without_content_type(server, reference) -> None:  # type: ignore[no-untyped-def]
    body = b'{"model": "all-MiniLM-L6-v2", "input": "A man is eating food."}'
    # curl -d sends application/x-www-form-urlencoded; the body is still JSON
    r = httpx.post(
        server.url + "/v1/embeddings",
        content=body,
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    _assert_matches(r.json()["data"][0]["embedding"], reference[FOOD])


def test_no_truncate_setting_refuses_long_input_with_index_and_length(minilm_path: str) -> None:
    with RemoteServer(["--no-truncate"]) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as info:
            client.embeddings.create(model=MODEL, input=["short", "word " * 300])
        message = info.value.message
        assert "input[1]" in message and "302 tokens" in message and "256" in message
        assert client.embeddings.create(model=MODEL, input="short").usage.prompt_tokens == 3


def test_one_long_token_id_array_is_one_input(client, st_model) -> None:  # type: ignore[no-untyped-def]
    import tiktoken

    enc = tiktoken.get_encoding("cl100k_base")
    text = "The quick brown fox jumps over the lazy dog. " * 300
    ids = enc.encode(text)
    assert len(ids) > 2048  # more ids than the most inputs a request may carry
    with pytest.raises(openai.BadRequestError, match=r"input\[0\]: 3002 tokens, more than"):
        client.embeddings.create(model=MODEL, input=ids)  # past the window: refused (default)
    resp = client.embeddings.create(
        model=MODEL, input=ids, encoding_format="float", extra_body={"long_input": "truncate"}
    )
    assert len(resp.data) == 1 and resp.usage.prompt_tokens == 256  # truncated, one input
    _assert_matches(resp.data[0].embedding, st_model.encode(enc.decode(ids)))


def test_concurrent_requests_each_get_their_own_vectors(client, st_model) -> None:  # type: ignore[no-untyped-def]
    """Requests that meet in one engine wave (engine/infinity/feeder.py) are sorted and cut into
    batches together; each still gets exactly its own inputs' vectors, in its order."""
    from concurrent.futures import ThreadPoolExecutor

    words = ["river", "engine", "violin", "harbour", "pepper", "glacier", "lantern", "orbit"]
    groups = [
        [
            f"{words[(i + j) % len(words)]} " * (1 + (i * 7 + j * 3) % 11) + f"no. {i}.{j}"
            for j in range(1 + (i * 5) % 13)
        ]
        for i in range(16)
    ]

    def ask(group: list[str]) -> list[list[float]]:
        resp = client.embeddings.create(model=MODEL, input=group, encoding_format="float")
        return [d.embedding for d in resp.data]

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, groups))
    flat = [t for g in groups for t in g]
    want = dict(zip(flat, st_model.encode(flat, normalize_embeddings=True), strict=True))
    for group, got in zip(groups, answers, strict=True):
        assert len(got) == len(group)
        for text, vector in zip(group, got, strict=True):
            _assert_matches(vector, want[text])
