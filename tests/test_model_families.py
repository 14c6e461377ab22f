"""The 2026 model families on the native engine (issue #40), from their folders alone: a
decoder embedder with last-token pooling and an instruction prompt (Qwen3-Embedding's shape), a
causal-LM reranker (Qwen3-Reranker's: yes/no log-odds), a multi-vector encoder with query and
document modes (ColBERT: markers, query expansion, skiplist), ModernBERT and Gemma 3 embedders
with their prompts. Tiny random models built here (tests/families.py); every answer equals the
library's own computation on the same folder: vectors within 1e-5, orders exactly."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

st = pytest.importorskip("sentence_transformers")
if int(st.__version__.split(".")[0]) < 6:
    pytest.skip("the 2026 families need sentence-transformers >= 6", allow_module_level=True)

from openai_compat.engine import classes, native  # noqa: E402
from openai_compat.engine.usage import TokenIds  # noqa: E402
from openai_compat.frame.model_config import ModelConfig  # noqa: E402
from tests import families  # noqa: E402
from tests.utils import RemoteServer, run_batch  # noqa: E402

TEXTS = [
    "a man is eating food",
    "what capital france ?",
    "paris is the capital of france . the market crashed today",
    "no",
    "berlin , germany",
]
QUERY = "what is the capital of france ?"


@pytest.fixture(scope="module")
def folders(family_folders: dict[str, Path]) -> dict[str, Path]:
    return family_folders


def config(source: Path, **kw: Any) -> ModelConfig:
    kw.setdefault("dtype", "float32")  # the library's own computation is the reference
    return ModelConfig(model=str(source), name="m", device="cpu", batch_size=8, **kw)


def run(engine: native.NativeEngine, work: Any) -> Any:
    async def main() -> Any:
        await engine.astart()
        try:
            return await work()
        finally:
            await engine.astop()

    return asyncio.run(main())


class Entry:
    """What scoring.raw_score reads of a cross-encoder's entry."""

    cosine_rerank = False
    sparse = False
    outputs = ()  # not BGE-M3


def cls(folder: Path, name: str) -> Any:
    return getattr(st, name)(str(folder), device="cpu")


def test_each_folder_is_read_by_the_class_its_own_files_name(folders: dict[str, Path]) -> None:
    expected = {
        "qwen3-embed": "SentenceTransformer",
        "qwen3-rerank": "CrossEncoder",  # a bare *ForCausalLM folder: yes/no log-odds
        "colbert": "MultiVectorEncoder",  # config_sentence_transformers.json's model_type
        "modernbert": "SentenceTransformer",
        "gemma3": "SentenceTransformer",
    }
    for name, folder in folders.items():
        archs = classes.architectures(str(folder), None, False)
        assert classes.model_class(config(folder), str(folder), archs) == expected[name], name


def test_a_folder_no_class_loads_is_refused_with_what_was_found(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"architectures": ["NoSuchModel"]}')
    with pytest.raises(ValueError) as caught:
        native.load(config(tmp_path), 1)
    message = str(caught.value)
    assert "SentenceTransformer cannot load it" in message
    assert "architectures ['NoSuchModel'], model_type none" in message
    assert "\n" not in message


def test_a_decoder_embedder_pools_the_last_real_token_of_left_padded_rows(
    folders: dict[str, Path],
) -> None:
    engine = native.load(config(folders["qwen3-embed"]), 1)
    assert engine.runner.left  # the tokenizer pads left: the last position is real
    model = cls(folders["qwen3-embed"], "SentenceTransformer")

    async def work() -> Any:  # different lengths in one batch: the padding is exercised
        plain = await engine.embed(TEXTS)
        asked = await engine.embed([families.QWEN_QUERY_PROMPT + t for t in TEXTS])
        return plain, asked

    (plain, tokens), (asked, _) = run(engine, work)
    assert np.abs(np.stack(plain) - model.encode(TEXTS)).max() < 1e-5
    assert np.abs(np.stack(asked) - model.encode_query(TEXTS)).max() < 1e-5
    assert tokens == sum(len(model.tokenizer(t)["input_ids"]) for t in TEXTS)


def test_a_causal_lm_reranker_scores_the_yes_no_log_odds_as_predict_does(
    folders: dict[str, Path],
) -> None:
    engine = native.load(config(folders["qwen3-rerank"]), 1)
    assert engine.kind == "crossencoder" and engine.runner.left  # CrossEncoder pads it left
    model = cls(folders["qwen3-rerank"], "CrossEncoder")
    assert [type(m).__name__ for m in model] == ["Transformer", "LogitScore"]

    async def work() -> Any:
        return (
            await engine.rerank(query=QUERY, docs=TEXTS),
            await engine.rerank(query=QUERY, docs=TEXTS, raw_scores=True),
        )

    (scored, _), (raw, _) = run(engine, work)
    pairs = [(QUERY, d) for d in TEXTS]
    expected = model.predict(pairs)  # sigmoid of logit(yes) - logit(no)
    odds = model.predict(pairs, activation_fn=__import__("torch").nn.Identity())
    assert np.abs(np.array([s.relevance_score for s in scored]) - expected).max() < 1e-5
    assert np.abs(np.array([s.relevance_score for s in raw]) - odds).max() < 1e-5
    assert np.abs(1 / (1 + np.exp(-odds)) - expected).max() < 1e-5  # the documented transform
    # confident pairs keep their log-odds through the sigmoid (TEI's raw_scores inverts it)
    from openai_compat.engine import tails
    from openai_compat.inference.scoring import raw_score

    for odds_value in (-30.0, -16.0, 16.0, 25.0):
        logit = np.array([odds_value], dtype=np.float32)
        score = float(tails.activation(engine.model, logit)[0])
        assert abs(raw_score(Entry(), score) - odds_value) < 1e-4, odds_value


def test_a_multi_vector_encoder_embeds_queries_and_documents_apart(
    folders: dict[str, Path],
) -> None:
    engine = native.load(config(folders["colbert"]), 1)
    assert engine.modes and engine.runner.multivector
    model = cls(folders["colbert"], "MultiVectorEncoder")
    q, d = families.COLBERT_PROMPTS["query"], families.COLBERT_PROMPTS["document"]
    short = TEXTS[:2] + TEXTS[3:]  # under the query length: expanded, not cut

    async def work() -> Any:
        queries = await engine.embed([q + t for t in short], "query")
        documents = await engine.embed([d + t for t in TEXTS], "document")
        default = await engine.embed([d + t for t in TEXTS])  # encode()'s side
        return queries, documents, default

    (queries, used), (documents, _), (default, _) = run(engine, work)
    want_q = model.encode_query(short, convert_to_numpy=True)
    want_d = model.encode_document(TEXTS, convert_to_numpy=True)
    for got, want in zip(queries, want_q, strict=True):
        assert got.shape == want.shape == (families.QUERY_LENGTH, 16)  # expansion kept
        assert np.abs(got - want).max() < 1e-5
    for got, want, same in zip(documents, want_d, default, strict=True):
        assert got.shape == want.shape and np.abs(got - want).max() < 1e-5
        assert np.array_equal(got, same)
    # the sides' markers and expansion are the library's preprocessing: ids cannot take them
    with pytest.raises(ValueError, match="query/document mode"):
        engine.runner.prepare([TokenIds("what", [101, 2054, 102])], "query")
    # usage counts the tokens sent (markers and specials), not the expansion's
    assert used == sum(len(model.tokenizer(q + t)["input_ids"]) for t in short)
    assert used < families.QUERY_LENGTH * len(short)


@pytest.mark.parametrize("name", ["modernbert", "gemma3"])
def test_modernbert_and_gemma_embedders_equal_encode_with_their_prompts(
    folders: dict[str, Path], name: str
) -> None:
    engine = native.load(config(folders[name]), 1)
    model = cls(folders[name], "SentenceTransformer")
    prompts = model.prompts

    async def work() -> Any:
        return (
            await engine.embed([prompts["query"] + t for t in TEXTS]),
            await engine.embed([prompts["document"] + t for t in TEXTS]),
        )

    (queries, _), (documents, _) = run(engine, work)
    assert np.abs(np.stack(queries) - model.encode_query(TEXTS)).max() < 1e-5
    assert np.abs(np.stack(documents) - model.encode_document(TEXTS)).max() < 1e-5


# ---------------------------------------------------------------- through a server


@pytest.fixture(scope="module")
def server(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Every family with `name` and `model` alone (and the exact cache on, its default)."""
    toml = tmp_path_factory.mktemp("cfg") / "families.toml"
    toml.write_text(
        "".join(f'[[models]]\nname = "{n}"\nmodel = "{p}"\n\n' for n, p in folders.items())
        # the same Gemma folder with its Matryoshka sizes declared
        + f'[[models]]\nname = "gemma3-mrl"\nmodel = "{folders["gemma3"]}"\n'
        "matryoshka_dimensions = [16, 8]\n\n"
        # the decoder embedder again, loaded by the model pool on its first request
         + f'[[models]]\nname = "qwen3-lazy"\nmodel = "{folders["qwen3-embed"]}"\nload = "lazy"\n'
    )
    with RemoteServer(["--config", str(toml)]) as srv:
        yield srv


def _floats(item: dict[str, Any]) -> np.ndarray:
    if isinstance(item["embedding"], str):
        flat = np.frombuffer(base64.b64decode(item["embedding"]), "<f4")
        return flat.reshape(item["shape"]) if "shape" in item else flat
    return np.asarray(item["embedding"], dtype=np.float32)


@pytest.mark.slow
def test_every_family_answers_its_routes_from_its_folder_alone(
    server: Any, folders: dict[str, Path]
) -> None:
    import cohere
    import openai

    models = {m["id"]: m for m in httpx.get(server.url + "/v1/models").json()["data"]}
    assert set(models["qwen3-embed"]["capabilities"]) == {"embed", "rerank"}
    assert set(models["qwen3-rerank"]["capabilities"]) == {"rerank"}
    assert set(models["colbert"]["capabilities"]) == {"embed", "rerank"}
    assert models["colbert"]["modes"] == ["query", "document"]
    assert models["gemma3"]["default_prompt"] == "document"

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    co = cohere.ClientV2(base_url=server.url, api_key="unused")

    # decoder embedder: the folder's query instruction on every route that embeds
    qwen = cls(folders["qwen3-embed"], "SentenceTransformer")
    want_q, want_d = qwen.encode_query(TEXTS), qwen.encode_document(TEXTS)
    got = client.embeddings.create(
        model="qwen3-embed", input=TEXTS, extra_body={"input_type": "query"}
    )
    assert np.abs(np.array([d.embedding for d in got.data]) - want_q).max() < 1e-5
    plain = client.embeddings.create(model="qwen3-embed", input=TEXTS, encoding_format="base64")
    decoded = [np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in plain.data]
    assert np.abs(np.stack(decoded) - want_d).max() < 1e-5  # base64: the floats
    cohered = co.embed(
        model="qwen3-embed", texts=TEXTS, input_type="search_query", embedding_types=["float"]
    )
    assert np.abs(np.array(cohered.embeddings.float_) - want_q).max() < 1e-5
    tei = httpx.post(
        server.url + "/embed",
        json={"model": "qwen3-embed", "inputs": TEXTS, "prompt_name": "query"},
    ).json()
    assert np.abs(np.array(tei) - want_q).max() < 1e-5

    # ModernBERT, Gemma 3: their prompts, Gemma's "document" default
    for name in ("modernbert", "gemma3"):
        model = cls(folders[name], "SentenceTransformer")
        got = co.embed(
            model=name, texts=TEXTS, input_type="search_document", embedding_types=["float"]
        )
        assert np.abs(np.array(got.embeddings.float_) - model.encode_document(TEXTS)).max() < 1e-5
    gemma = cls(folders["gemma3"], "SentenceTransformer")
    default = client.embeddings.create(model="gemma3", input=TEXTS)
    assert np.abs(np.array([d.embedding for d in default.data]) - gemma.encode(TEXTS)).max() < 1e-5

    # Matryoshka sizes, where declared: a prefix renormalised; other sizes are a 400
    mrl = models["gemma3-mrl"]
    assert (
        mrl["matryoshka_dimensions"] == [16, 8] and "matryoshka_dimensions" not in models["gemma3"]
    )
    cut = gemma.encode(TEXTS, truncate_dim=16)
    cut = cut / np.linalg.norm(cut, axis=1, keepdims=True)
    got16 = client.embeddings.create(model="gemma3-mrl", input=TEXTS, dimensions=16)
    assert np.abs(np.array([d.embedding for d in got16.data]) - cut).max() < 1e-5
    for body, path in (
        ({"model": "gemma3-mrl", "input": TEXTS, "dimensions": 12}, "/v1/embeddings"),
        ({"model": "gemma3-mrl", "texts": TEXTS, "output_dimension": 12}, "/v2/embed"),
    ):
        refused = httpx.post(server.url + path, json=body)
        assert refused.status_code == 400, refused.text
        assert "of 32, 16, 8 only; got 12" in refused.text
    assert (
        len(client.embeddings.create(model="gemma3", input="x", dimensions=12).data[0].embedding)
        == 12
    )

    # causal-LM reranker: the library's order and scores on Cohere's, Jina's and TEI's routes
    reranker = cls(folders["qwen3-rerank"], "CrossEncoder")
    pairs = [(QUERY, d) for d in TEXTS]
    expected = reranker.predict(pairs)
    odds = reranker.predict(pairs, activation_fn=__import__("torch").nn.Identity())
    order = list(np.argsort(-expected, kind="stable"))
    ranked = co.rerank(model="qwen3-rerank", query=QUERY, documents=TEXTS).results
    assert [r.index for r in ranked] == order
    assert max(abs(r.relevance_score - expected[r.index]) for r in ranked) < 1e-5
    jina = httpx.post(
        server.url + "/v1/rerank",
        json={"model": "qwen3-rerank", "query": QUERY, "documents": TEXTS},
    ).json()["results"]
    assert [r["index"] for r in jina] == order
    raw = httpx.post(
        server.url + "/rerank",
        json={"model": "qwen3-rerank", "query": QUERY, "texts": TEXTS, "raw_scores": True},
    ).json()
    assert [r["index"] for r in raw] == order
    assert max(abs(r["score"] - odds[r["index"]]) for r in raw) < 1e-5  # the log-odds
    infinity = httpx.post(  # infinity's /rerank: documents, not texts
        server.url + "/rerank",
        json={"model": "qwen3-rerank", "query": QUERY, "documents": TEXTS},
    ).json()["results"]
    assert [r["index"] for r in infinity] == order
    v1 = cohere.Client(base_url=server.url, api_key="unused").rerank(
        model="qwen3-rerank", query=QUERY, documents=TEXTS
    )
    assert [r.index for r in v1.results] == order

    # multi-vector: the sides by input_type, the cache keyed on the side, MaxSim as the library
    colbert = cls(folders["colbert"], "MultiVectorEncoder")
    short = [TEXTS[0], TEXTS[3]]
    for asked, want in (
        ({"input_type": "query"}, colbert.encode_query(short, convert_to_numpy=True)),
        ({"input_type": "document"}, colbert.encode_document(short, convert_to_numpy=True)),
        ({}, colbert.encode_document(short, convert_to_numpy=True)),
        ({"input_type": "query"}, colbert.encode_query(short, convert_to_numpy=True)),  # cached
    ):
        body = {"model": "colbert", "input": short, "encoding_format": "base64", **asked}
        data = httpx.post(server.url + "/v1/embeddings", json=body).json()["data"]
        for item, vectors in zip(data, want, strict=True):
            assert item["shape"] == list(vectors.shape), asked
            assert np.abs(_floats(item) - vectors).max() < 1e-5, asked
    # ... and through the Batch API: a line's side is its input_type, as on the live route
    line = {"model": "colbert", "input": short, "input_type": "query", "encoding_format": "base64"}
    job = run_batch(
        client, [{"custom_id": "q", "method": "POST", "url": "/v1/embeddings", "body": line}]
    )
    assert job.output_file_id is not None
    row = json.loads(client.files.content(job.output_file_id).text.splitlines()[0])
    want = colbert.encode_query(short, convert_to_numpy=True)
    for item, vectors in zip(row["response"]["body"]["data"], want, strict=True):
        assert np.abs(_floats(item) - vectors).max() < 1e-5
    scores = colbert.similarity(colbert.encode_query([QUERY]), colbert.encode_document(TEXTS))[
        0
    ].numpy()
    ranked = co.rerank(model="colbert", query=QUERY, documents=TEXTS).results
    assert [r.index for r in ranked] == list(np.argsort(-scores, kind="stable"))
    assert max(abs(r.relevance_score - scores[r.index]) for r in ranked) < 1e-4


LONG = " ".join(families.WORDS[2:] * 12)  # ~400 words: past the decoder's 128-token window


@pytest.mark.slow
def test_the_families_have_what_every_model_has(server: Any, folders: dict[str, Path]) -> None:
    """Long inputs, Cohere's compact types, the tutorial's /rerank by position, `late`
    refused on last-token pooling, and the model pool, on the families' folders."""
    import cohere

    qwen = cls(folders["qwen3-embed"], "SentenceTransformer")
    post = functools.partial(httpx.post, timeout=60)

    # long inputs: every window is the library's vector of that slice; "mean" their
    # token-weighted average, renormalised
    body = {"model": "qwen3-embed", "input": LONG, "long_input": "chunks"}
    answer = post(server.url + "/v1/embeddings", json=body).json()
    chunks = answer["data"][0]["chunks"]
    slices = [LONG[c["start"] : c["end"]] for c in chunks]
    assert len(chunks) >= 3 and chunks[0]["start"] == 0 and chunks[-1]["end"] == len(LONG)
    want = qwen.encode(slices)
    assert np.abs(np.array([c["embedding"] for c in chunks]) - want).max() < 1e-5
    tokens = [len(qwen.tokenizer(s)["input_ids"]) for s in slices]
    assert [c["tokens"] for c in chunks] == tokens and max(tokens) <= 128
    pooled = (want * np.array(tokens)[:, None]).sum(axis=0)
    mean = post(server.url + "/v1/embeddings", json={**body, "long_input": "mean"}).json()
    got = np.array(mean["data"][0]["embedding"])
    assert np.abs(got - pooled / np.linalg.norm(pooled)).max() < 1e-5
    # ... and "late" needs token vectors that mean pooling makes: refused on last-token
    late = post(server.url + "/v1/embeddings", json={**body, "long_input": "late"})
    assert late.status_code == 400 and "pooling" in late.text, late.text
    assert late.json()["error"]["param"] == "long_input"

    # Cohere's compact types: ubinary is the library's own packed signs, int8 keeps the cosine
    co = cohere.ClientV2(base_url=server.url, api_key="unused")
    compact = co.embed(
        model="qwen3-embed",
        texts=TEXTS,
        input_type="search_document",
        embedding_types=["float", "int8", "ubinary"],
    ).embeddings
    floats = qwen.encode_document(TEXTS)
    packed = st.quantize_embeddings(floats, precision="ubinary")
    assert np.array_equal(np.array(compact.ubinary, dtype=np.uint8), packed)
    int8 = np.array(compact.int8, dtype=np.float64)
    cosines = (int8 * floats).sum(1) / np.linalg.norm(int8, axis=1) / np.linalg.norm(floats, axis=1)
    assert cosines.min() > 0.99, cosines

    # the tutorial's /rerank picks its model by position: the causal-LM reranker is #1
    reranker = cls(folders["qwen3-rerank"], "CrossEncoder")
    expected = reranker.predict([(QUERY, d) for d in TEXTS])
    tutorial = post(
        server.url + "/rerank", json={"query": QUERY, "docs": TEXTS, "model_index": 1}
    ).json()
    assert tutorial["model"] == "qwen3-rerank"
    ranked = tutorial["rankings"]
    assert [r["index"] for r in ranked] == list(np.argsort(-expected, kind="stable"))
    assert max(abs(r["relevance_score"] - expected[r["index"]]) for r in ranked) < 1e-5

    # the model pool: a lazy family model is loaded by its first request, then answers as
    # the library does
    listed = {m["id"]: m for m in httpx.get(server.url + "/v1/models").json()["data"]}
    assert listed["qwen3-lazy"]["state"] == "unloaded"
    lazy = post(
        server.url + "/v1/embeddings",
        json={"model": "qwen3-lazy", "input": TEXTS, "input_type": "query"},
    ).json()
    got = np.array([d["embedding"] for d in lazy["data"]])
    assert np.abs(got - qwen.encode_query(TEXTS)).max() < 1e-5
    listed = {m["id"]: m for m in httpx.get(server.url + "/v1/models").json()["data"]}
    assert listed["qwen3-lazy"]["state"] == "loaded"
    assert listed["qwen3-lazy"]["capabilities"] == listed["qwen3-embed"]["capabilities"]
