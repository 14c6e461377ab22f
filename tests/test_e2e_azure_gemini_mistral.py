"""Azure OpenAI's, Google Gemini's and Mistral's SDKs end to end (#64) against one real server
with a keys file: `openai.AzureOpenAI` (azure_endpoint, a deployment base_url, `api-key`
and Entra-style bearer tokens), Azure's v1 API, LangChain's `AzureOpenAIEmbeddings`, litellm's
`azure/`,
google-genai (`embed_content` with task types, titles and output_dimensionality),
LangChain's `GoogleGenerativeAIEmbeddings`, and `mistralai` (`output_dtype`,
`output_dimension`). Numbers, not shapes: every vector equals our /v1/embeddings answer for
the same text and prompt (and the library's own computation of the prompted text); wrong
keys, unknown models, scopes, quotas and bad fields are answered as each provider answers
them, so each SDK raises what it raises against the real service."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types
from mistralai.client import Mistral

from tests.utils import RemoteServer, server_with

pytestmark = pytest.mark.slow

DOCS = ["A man is eating food.", "A man is eating a piece of bread.", "The stock market crashed."]
# EmbeddingGemma's prompts (its folder's config_sentence_transformers.json), on MiniLM
GEMMA = {
    "query": "task: search result | query: ",
    "document": "title: none | text: ",
    "STS": "task: sentence similarity | query: ",
    "Classification": "task: classification | query: ",
}


KEYS = """
[[keys]]
name = "all"
key = "all-key"

[[keys]]
name = "scoped"
key = "scoped-key"
models = ["minilm"]

[[keys]]
name = "tokens-azure"
key = "tokens-azure-key"
tpm = 30

[[keys]]
name = "tokens-gemini"
key = "tokens-gemini-key"
tpm = 30

[[keys]]
name = "tokens-mistral"
key = "tokens-mistral-key"
tpm = 30
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RemoteServer]:
    folder = tmp_path_factory.mktemp("cloud-sdks")
    (folder / "keys.toml").write_text(KEYS)
    models = [
        {
            "name": "minilm",
            "model": "builtin:all-MiniLM-L6-v2",
            "aliases": ["text-embedding-3-small", "mistral-embed"],
        },
        {
            "name": "gemma-like",
            "model": "builtin:all-MiniLM-L6-v2",
            "prompts": GEMMA,
            "aliases": ["gemini-embedding-001"],
        },
    ]
    args = ["--keys-file", str(folder / "keys.toml"), "--cache-bytes", "0"]
    with server_with(folder, models, args) as server:
        yield server


def _ours(srv: RemoteServer, model: str, texts: list[str], **extra: Any) -> np.ndarray:
    """Our OpenAI route's float vectors: the reference every dialect must equal."""
    body = {"model": model, "input": texts, **extra}
    headers = {"Authorization": "Bearer all-key"}
    r = httpx.post(srv.url + "/v1/embeddings", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return np.asarray([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


def _vectors(response: Any) -> np.ndarray:
    return np.asarray([d.embedding for d in response.data], dtype=np.float32)


# ---------------------------------------------------------------- Azure OpenAI


def test_azure_sdk_in_both_endpoint_forms_and_the_v1_api_equals_the_openai_route(
    srv: RemoteServer, st_model: Any
) -> None:
    want = _ours(srv, "minilm", DOCS)
    np.testing.assert_allclose(want, st_model.encode(DOCS, normalize_embeddings=True), atol=1e-5)
    common = {"api_version": "2024-10-21", "max_retries": 0}
    # azure_endpoint: /openai/deployments/{model}/embeddings?api-version=..., `api-key`
    by_endpoint = openai.AzureOpenAI(azure_endpoint=srv.url, api_key="scoped-key", **common)
    got = by_endpoint.embeddings.create(model="minilm", input=DOCS)  # base64, decoded
    np.testing.assert_allclose(_vectors(got), want, atol=1e-6)
    assert got.usage.prompt_tokens == 8 + 11 + 7
    # a deployment in the base URL (an alias), an Entra-style bearer token; the body's model
    # is not the deployment and is ignored, as Azure ignores it
    deployment = f"{srv.url}/openai/deployments/text-embedding-3-small"
    by_deployment = openai.AzureOpenAI(base_url=deployment, azure_ad_token="all-key", **common)
    got = by_deployment.embeddings.create(model="text-embedding-ada-002", input=DOCS[:1])
    np.testing.assert_allclose(_vectors(got), want[:1], atol=1e-6)
    assert got.model == "text-embedding-3-small"
    short = by_deployment.embeddings.create(model="x", input=DOCS, dimensions=64)
    np.testing.assert_allclose(
        _vectors(short), _ours(srv, "minilm", DOCS, dimensions=64), atol=1e-6
    )
    # Azure's v1 API: the plain OpenAI client on {endpoint}/openai/v1
    v1 = openai.OpenAI(base_url=srv.url + "/openai/v1", api_key="scoped-key", max_retries=0)
    np.testing.assert_allclose(
        _vectors(v1.embeddings.create(model="minilm", input=DOCS)), want, atol=1e-6
    )
    assert "minilm" in [m.id for m in v1.models.list()]
    # litellm's azure/ provider: the same deployment route, through its own client
    import litellm

    lite = litellm.embedding(
        model="azure/text-embedding-3-small",
        input=DOCS,
        api_base=srv.url,
        api_key="scoped-key",
        api_version="2024-10-21",
        max_retries=0,
    )
    np.testing.assert_allclose([d["embedding"] for d in lite.data], want, atol=1e-6)


def test_azure_refusals_are_what_the_sdk_raises_against_azure(srv: RemoteServer) -> None:
    common = {"api_version": "2024-10-21", "max_retries": 0, "azure_endpoint": srv.url}
    wrong = openai.AzureOpenAI(api_key="wrong-key", **common)
    with pytest.raises(openai.AuthenticationError) as auth:
        wrong.embeddings.create(model="minilm", input="x")
    assert "api-key" in auth.value.message  # the header this client sends is named
    scoped = openai.AzureOpenAI(api_key="scoped-key", **common)
    for deployment in ("gemma-like", "no-such-deployment"):  # out of scope = not there
        with pytest.raises(openai.NotFoundError):
            scoped.embeddings.create(model=deployment, input="x")
    with pytest.raises(openai.BadRequestError) as bad:
        scoped.embeddings.create(model="minilm", input="x", dimensions=0)
    assert bad.value.status_code == 400 and bad.value.body["param"] == "dimensions"  # type: ignore[index]
    limited = openai.AzureOpenAI(api_key="tokens-azure-key", **common)
    limited.embeddings.create(model="minilm", input=["word " * 20])
    with pytest.raises(openai.RateLimitError):  # tpm 30 spent: Azure's 429
        limited.embeddings.create(model="minilm", input=["word " * 20])


def test_langchain_azure_openai_embeddings_with_default_settings(srv: RemoteServer) -> None:
    from langchain_openai import AzureOpenAIEmbeddings

    # defaults: tiktoken chunking on (cl100k token ids sent, decoded by the server)
    emb = AzureOpenAIEmbeddings(
        azure_endpoint=srv.url,
        azure_deployment="minilm",
        api_key="scoped-key",  # type: ignore[arg-type]
        api_version="2024-10-21",
        max_retries=0,
    )
    want = _ours(srv, "minilm", DOCS)
    np.testing.assert_allclose(np.asarray(emb.embed_documents(DOCS)), want, atol=1e-5)
    np.testing.assert_allclose(np.asarray(emb.embed_query(DOCS[0])), want[0], atol=1e-5)


# ---------------------------------------------------------------- Google Gemini


def _gemini(srv: RemoteServer, key: str = "all-key") -> genai.Client:
    options = genai_types.HttpOptions(base_url=srv.url, retry_options=None)
    return genai.Client(api_key=key, http_options=options)


def test_gemini_task_types_and_titles_select_the_models_prompts(
    srv: RemoteServer, st_model: Any
) -> None:
    client = _gemini(srv)
    config = genai_types.EmbedContentConfig
    queries = client.models.embed_content(
        model="models/gemini-embedding-001",
        contents=DOCS,
        config=config(task_type="RETRIEVAL_QUERY"),
    )
    got = np.asarray([e.values for e in queries.embeddings], dtype=np.float32)
    want = _ours(srv, "gemma-like", DOCS, input_type="query")
    np.testing.assert_allclose(got, want, atol=1e-6)
    prompted = [GEMMA["query"] + t for t in DOCS]  # the library, given the prompted text
    np.testing.assert_allclose(got, st_model.encode(prompted, normalize_embeddings=True), atol=1e-5)
    for task, name in (("SEMANTIC_SIMILARITY", "STS"), ("CLASSIFICATION", "Classification")):
        one = client.models.embed_content(
            model="gemma-like", contents=DOCS[:1], config=config(task_type=task)
        )
        np.testing.assert_allclose(
            one.embeddings[0].values, _ours(srv, "gemma-like", DOCS[:1], prompt_name=name)[0],
            atol=1e-6,
        )  # fmt: skip
    # a title takes the document prompt's title slot ("title: {title} | text: ")
    titled = client.models.embed_content(
        model="gemma-like",
        contents=DOCS[:1],
        config=config(task_type="RETRIEVAL_DOCUMENT", title="Lunch"),
    )
    want = st_model.encode(["title: Lunch | text: " + DOCS[0]], normalize_embeddings=True)
    np.testing.assert_allclose(titled.embeddings[0].values, want[0], atol=1e-5)
    # a model without prompts takes every task type and embeds the text as it is
    plain = client.models.embed_content(
        model="minilm", contents=DOCS, config=config(task_type="CLUSTERING")
    )
    np.testing.assert_allclose(
        [e.values for e in plain.embeddings], _ours(srv, "minilm", DOCS), atol=1e-6
    )


def test_gemini_output_dimensionality_cuts_without_renormalising(srv: RemoteServer) -> None:
    client = _gemini(srv)  # held: the client closes its connection pool when collected
    got = client.models.embed_content(
        model="minilm",
        contents=DOCS,
        config=genai_types.EmbedContentConfig(output_dimensionality=64),
    )
    full = _ours(srv, "minilm", DOCS)
    cut = np.asarray([e.values for e in got.embeddings], dtype=np.float32)
    np.testing.assert_allclose(cut, full[:, :64], atol=1e-6)  # Gemini's: not unit length
    assert np.linalg.norm(cut, axis=1).max() < 0.99


def test_gemini_rest_calls_with_a_query_key_and_one_content(srv: RemoteServer) -> None:
    """REST users: `:embedContent` with ?key=, several text parts joined with a space."""
    body = {
        "model": "models/minilm",
        "content": {"parts": [{"text": "A man is eating"}, {"text": "food."}]},
    }
    r = httpx.post(srv.url + "/v1beta/models/minilm:embedContent?key=scoped-key", json=body)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(
        r.json()["embedding"]["values"], _ours(srv, "minilm", DOCS[:1])[0], atol=1e-6
    )
    both = {
        "requests": [{"model": "models/minilm", "content": {"parts": [{"text": t}]}} for t in DOCS]
    }
    r = httpx.post(
        srv.url + "/v1/models/minilm:batchEmbedContents",  # Gemini's v1, the x-goog header
        json=both,
        headers={"x-goog-api-key": "scoped-key"},
    )
    assert r.status_code == 200, r.text
    got = [e["values"] for e in r.json()["embeddings"]]
    np.testing.assert_allclose(got, _ours(srv, "minilm", DOCS), atol=1e-6)


def test_gemini_refusals_are_googles_errors(srv: RemoteServer) -> None:
    wrong_key = _gemini(srv, "wrong-key")
    with pytest.raises(genai_errors.ClientError) as wrong:
        wrong_key.models.embed_content(model="minilm", contents=["x"])
    assert (wrong.value.code, wrong.value.status) == (400, "INVALID_ARGUMENT")
    assert wrong.value.details["error"]["details"][0]["reason"] == "API_KEY_INVALID"
    scoped = _gemini(srv, "scoped-key")
    for model in ("gemma-like", "no-such-model"):  # out of scope = not there
        with pytest.raises(genai_errors.ClientError) as missing:
            scoped.models.embed_content(model=model, contents=["x"])
        assert (missing.value.code, missing.value.status) == (404, "NOT_FOUND")
    with pytest.raises(genai_errors.ClientError) as bad:
        scoped.models.embed_content(
            model="minilm",
            contents=["x"],
            config=genai_types.EmbedContentConfig(output_dimensionality=10**30),
        )
    assert (bad.value.code, bad.value.status) == (400, "INVALID_ARGUMENT")
    limited = _gemini(srv, "tokens-gemini-key")
    limited.models.embed_content(model="minilm", contents=["word " * 20])
    with pytest.raises(genai_errors.ClientError) as spent:
        limited.models.embed_content(model="minilm", contents=["word " * 20])
    assert (spent.value.code, spent.value.status) == (429, "RESOURCE_EXHAUSTED")
    key = {"x-goog-api-key": "all-key"}
    url = srv.url + "/v1beta/models/minilm:batchEmbedContents"
    cases = [  # (body, the field the 400 names): nothing is dropped silently
        ({"requests": [{"content": {"parts": [{"inlineData": {"data": "AA=="}}]}}]}, "inlineData"),
        ({"requests": [{"model": "models/other", "content": {"parts": [{"text": "x"}]}}]}, "model"),
        ({"requests": [{"content": {"parts": [{"text": "x"}]}, "taskType": "POETRY"}]}, "taskType"),
        ({"requests": []}, "requests"),
    ]
    for body, field in cases:
        r = httpx.post(url, json=body, headers=key)
        assert r.status_code == 400, (body, r.text)
        error = r.json()["error"]
        assert error["status"] == "INVALID_ARGUMENT" and field in error["message"], error
    r = httpx.post(srv.url + "/v1beta/models/minilm:generateContent", json={}, headers=key)
    assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"


def test_langchain_google_genai_embeddings(srv: RemoteServer) -> None:
    from langchain_google_genai import GoogleGenerativeAIEmbeddings

    emb = GoogleGenerativeAIEmbeddings(
        model="gemini-embedding-001",
        google_api_key="all-key",  # type: ignore[arg-type]
        base_url=srv.url,
    )
    docs = np.asarray(emb.embed_documents(DOCS))  # RETRIEVAL_DOCUMENT
    np.testing.assert_allclose(
        docs, _ours(srv, "gemma-like", DOCS, input_type="document"), atol=1e-6
    )
    query = emb.embed_query(DOCS[0])  # RETRIEVAL_QUERY
    np.testing.assert_allclose(
        query, _ours(srv, "gemma-like", DOCS[:1], input_type="query")[0], atol=1e-6
    )


# ---------------------------------------------------------------- Mistral


def test_mistral_sdk_floats_dimensions_and_compact_dtypes(srv: RemoteServer) -> None:
    client = Mistral(api_key="scoped-key", server_url=srv.url)
    floats = _ours(srv, "minilm", DOCS)
    got = client.embeddings.create(model="mistral-embed", inputs=DOCS)  # its model: an alias
    assert got.id.startswith("embd-") and got.usage.prompt_tokens == 8 + 11 + 7
    np.testing.assert_allclose(_vectors(got), floats, atol=1e-6)
    short = client.embeddings.create(model="minilm", inputs=DOCS, output_dimension=64)
    np.testing.assert_allclose(
        _vectors(short), _ours(srv, "minilm", DOCS, dimensions=64), atol=1e-6
    )
    bits = np.packbits(floats > 0, axis=1)
    ubinary = client.embeddings.create(model="minilm", inputs=DOCS, output_dtype="ubinary")
    assert (_vectors(ubinary) == bits).all()
    binary = client.embeddings.create(model="minilm", inputs=DOCS, output_dtype="binary")
    assert (_vectors(binary) == bits.astype(np.int16) - 128).all()
    cohere = httpx.post(
        srv.url + "/v2/embed",
        json={"model": "minilm", "texts": DOCS, "input_type": "search_document",
              "embedding_types": ["int8", "uint8"]},
        headers={"Authorization": "Bearer all-key"},
    ).json()["embeddings"]  # fmt: skip
    for dtype in ("int8", "uint8"):
        got = client.embeddings.create(model="minilm", inputs=DOCS, output_dtype=dtype)
        assert (_vectors(got) == np.asarray(cohere[dtype])).all(), dtype
    # base64 of a compact type: that type's bytes
    r = httpx.post(
        srv.url + "/v1/embeddings",
        json={
            "model": "minilm",
            "input": DOCS,
            "output_dtype": "int8",
            "encoding_format": "base64",
        },
        headers={"Authorization": "Bearer all-key"},
    )
    import base64

    raw = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype=np.int8)
    assert (raw == np.asarray(cohere["int8"][0])).all()


def test_mistral_refusals(srv: RemoteServer) -> None:
    from mistralai.client import errors as mistral_errors

    wrong = Mistral(api_key="wrong-key", server_url=srv.url)
    with pytest.raises(mistral_errors.SDKError) as auth:
        wrong.embeddings.create(model="minilm", inputs=["x"])
    assert auth.value.status_code == 401
    client = Mistral(api_key="scoped-key", server_url=srv.url)
    with pytest.raises(mistral_errors.SDKError) as conflict:
        client.embeddings.create(model="minilm", inputs=["x"], output_dimension=0)
    assert conflict.value.status_code == 400 and "output_dimension" in conflict.value.body
    with pytest.raises(mistral_errors.SDKError) as missing:
        client.embeddings.create(model="gemma-like", inputs=["x"])  # not in its scope
    assert missing.value.status_code == 404
    limited = Mistral(api_key="tokens-mistral-key", server_url=srv.url)
    limited.embeddings.create(model="minilm", inputs=["word " * 20])
    with pytest.raises(mistral_errors.SDKError) as spent:
        limited.embeddings.create(model="minilm", inputs=["word " * 20])
    assert spent.value.status_code == 429
    r = httpx.post(
        srv.url + "/v1/embeddings",
        json={"model": "minilm", "input": "x", "dimensions": 64, "output_dimension": 32},
        headers={"Authorization": "Bearer all-key"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "conflicting_parameters"
