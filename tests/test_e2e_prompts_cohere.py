"""Prompts and Cohere's embed API against a live server, through the clients people use.

References are independent: sentence-transformers' own `encode(prompt=...)` of the packaged
MiniLM, numpy's packbits for binary types, the model's int8 range from /v1/models.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cohere
import httpx
import numpy as np
import openai
import pytest

from tests.media_samples import data_uri, png
from tests.utils import RemoteServer, server_with

pytestmark = pytest.mark.slow

Q, P = "query: ", "passage: "
FOLDER_PROMPTS = {"query": "search_query: ", "document": "search_document: "}

DOCS = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris, France.",
    "Photosynthesis turns sunlight, water and carbon dioxide into glucose and oxygen.",
    "To reset your password, click 'Forgot password' on the sign-in page.",
    "The Great Barrier Reef is the world's largest coral reef system, off Australia.",
    "Python lists are mutable sequences; tuples are immutable.",
]
QUERIES = [
    ("How do plants make food from light?", 1),
    ("I forgot my login password", 2),
    ("famous landmark in the French capital", 0),
]
# One word = one token for MiniLM's tokenizer, so "the last N tokens" is "the last N words".
WORDS = ["apple", "river", "house", "green", "music", "table", "window", "garden", "paper", "light"]


@pytest.fixture(scope="module")
def folder_model(tmp_path_factory: pytest.TempPathFactory, minilm_path: str) -> Path:
    """The packaged MiniLM with sentence-transformers prompts in its folder (no config)."""
    folder = tmp_path_factory.mktemp("prompted-minilm")
    for item in Path(minilm_path).iterdir():
        if item.name != "config_sentence_transformers.json":
            os.symlink(item, folder / item.name)
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": FOLDER_PROMPTS, "default_prompt_name": "document"})
    )
    return folder


@pytest.fixture(scope="module")
def e5_folder(tmp_path_factory: pytest.TempPathFactory, minilm_path: str) -> Path:
    """The e5 convention in a folder: prompts {query, passage}, default passage (no
    "document" prompt: sentence-transformers 6 adds a blank one when it loads it)."""
    folder = tmp_path_factory.mktemp("e5-folder")
    for item in Path(minilm_path).iterdir():
        if item.name != "config_sentence_transformers.json":
            os.symlink(item, folder / item.name)
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": Q, "passage": P}, "default_prompt_name": "passage"})
    )
    return folder


@pytest.fixture(scope="module")
def srv(
    tmp_path_factory: pytest.TempPathFactory,
    folder_model: Path,
    e5_folder: Path,
    tiny_media_models: dict[str, Path],
) -> Iterator[RemoteServer]:
    models = [
        {
            "name": "e5",
            "model": "builtin:all-MiniLM-L6-v2",
            "aliases": ["embed-english-v3.0"],
            "prompts": {"query": Q, "passage": P},
        },
        {"name": "folder-prompts", "model": folder_model},
        {"name": "e5-folder", "model": e5_folder},
        {"name": "clip", "model": tiny_media_models["clip"]},
    ]
    with server_with(tmp_path_factory.mktemp("cfg"), models) as server:
        yield server


def _st(st_model: Any, texts: list[str], prompt: str = "") -> np.ndarray:
    return np.asarray(st_model.encode(texts, prompt=prompt, normalize_embeddings=True))


def _close(got: Any, want: np.ndarray) -> None:
    np.testing.assert_allclose(np.asarray(got, dtype=np.float32), want, atol=1e-5)


def _post(srv: RemoteServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=60)


def _tokens(st_model: Any, text: str) -> int:
    return len(st_model.tokenizer(text, truncation=True, max_length=256)["input_ids"])


# ---------------------------------------------------------------- prompts, every way of asking


def test_every_way_of_asking_for_the_query_prompt_gives_the_prompted_vector(
    srv: RemoteServer, st_model: Any
) -> None:
    texts = [q for q, _ in QUERIES]
    want = _st(st_model, texts, Q)
    plain = _st(st_model, texts)
    assert np.abs(want - plain).max() > 0.01  # the prompt really changes the vector

    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    for extra in (
        {"input_type": "search_query"},
        {"prompt_name": "query"},
        {"task": "retrieval.query"},
    ):
        resp = client.embeddings.create(model="e5", input=texts, extra_body=extra)
        _close([d.embedding for d in resp.data], want)
        assert resp.usage.prompt_tokens == sum(_tokens(st_model, Q + t) for t in texts)
    unprompted = client.embeddings.create(model="e5", input=texts)
    _close([d.embedding for d in unprompted.data], plain)

    v1 = cohere.Client(base_url=srv.url, api_key="x").embed(
        texts=texts, model="e5", input_type="search_query"
    )
    _close(v1.embeddings, want)
    v2 = cohere.ClientV2(base_url=srv.url, api_key="x").embed(
        texts=texts, model="e5", input_type="search_query", embedding_types=["float"]
    )
    _close(v2.embeddings.float_, want)

    tutorial = _post(srv, "/embed", {"sentences": texts, "model_index": 0, "prompt_name": "query"})
    _close(tutorial.json()["embeddings"], want)


def test_search_document_maps_to_the_models_passage_prompt(
    srv: RemoteServer, st_model: Any
) -> None:
    want = _st(st_model, DOCS, P)
    co = cohere.ClientV2(base_url=srv.url, api_key="x")
    got = co.embed(texts=DOCS, model="e5", input_type="search_document", embedding_types=["float"])
    _close(got.embeddings.float_, want)
    assert got.meta is not None and got.meta.billed_units is not None
    assert got.meta.billed_units.input_tokens == sum(_tokens(st_model, P + d) for d in DOCS)
    jina = _post(srv, "/v1/embeddings", {"model": "e5", "input": DOCS, "task": "retrieval.passage"})
    _close([d["embedding"] for d in jina.json()["data"]], want)


def test_prompts_from_the_model_folder_apply_with_no_config(
    srv: RemoteServer, folder_model: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    ref = SentenceTransformer(str(folder_model), device="cpu")
    assert ref.prompts == FOLDER_PROMPTS and ref.default_prompt_name == "document"
    text = ["where is the reef?"]

    def embed(**extra: str) -> np.ndarray:
        r = _post(srv, "/v1/embeddings", {"model": "folder-prompts", "input": text, **extra})
        assert r.status_code == 200, r.text
        return np.asarray(r.json()["data"][0]["embedding"])

    # no name: the folder's default prompt ("document"), exactly as encode() applies it
    _close(embed(), ref.encode(text, normalize_embeddings=True)[0])
    _close(embed(), ref.encode(text, prompt_name="document", normalize_embeddings=True)[0])
    _close(
        embed(input_type="search_query"),
        ref.encode(text, prompt_name="query", normalize_embeddings=True)[0],
    )


def test_a_folders_declared_passage_prompt_is_its_document_side(
    srv: RemoteServer, st_model: Any
) -> None:
    """sentence-transformers 6 loads {query, passage} with a blank "document" added; Cohere's
    search_document, OpenAI's input_type "document" and no input type at all embedded with
    no prompt (0.10 from the passage prompt's vectors). The folder's own prompts decide."""
    want = _st(st_model, DOCS, P)
    co = cohere.ClientV2(base_url=srv.url, api_key="x")
    got = co.embed(
        texts=DOCS, model="e5-folder", input_type="search_document", embedding_types=["float"]
    )
    _close(got.embeddings.float_, want)
    for extra in ({"input_type": "document"}, {}):
        r = _post(srv, "/v1/embeddings", {"model": "e5-folder", "input": DOCS, **extra})
        _close([d["embedding"] for d in r.json()["data"]], want)
    cards = {c["id"]: c for c in httpx.get(srv.url + "/v1/models").json()["data"]}
    assert cards["e5-folder"]["prompts"] == {"query": Q, "passage": P}


def test_models_list_prompts_and_int8_ranges(srv: RemoteServer) -> None:
    cards = {c["id"]: c for c in httpx.get(srv.url + "/v1/models").json()["data"]}
    assert cards["e5"]["prompts"] == {"query": Q, "passage": P}
    assert cards["embed-english-v3.0"]["prompts"] == {"query": Q, "passage": P}
    assert cards["folder-prompts"]["prompts"] == FOLDER_PROMPTS
    assert cards["folder-prompts"]["default_prompt"] == "document"
    assert "prompts" not in cards["clip"]
    assert 0 < cards["e5"]["quantization_range"] < 1


def test_unknown_prompt_names_are_400s_listing_the_prompts(srv: RemoteServer) -> None:
    r = _post(srv, "/v1/embeddings", {"model": "e5", "input": "x", "input_type": "clustering"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "input_type" and err["code"] == "unknown_prompt"
    assert "passage, query" in err["message"]
    r = _post(
        srv,
        "/v1/embeddings",
        {"model": "e5", "input": "x", "input_type": "search_query", "task": "retrieval.passage"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "conflicting_prompts"
    co = cohere.ClientV2(base_url=srv.url, api_key="x")
    with pytest.raises(cohere.BadRequestError) as exc:
        co.embed(texts=["x"], model="e5", input_type="classification")
    assert "its prompts are: passage, query" in exc.value.body["message"]
    # a model without prompts ignores input types (Cohere clients always send one)
    ok = co.embed(texts=["x"], model="clip", input_type="classification", embedding_types=["float"])
    assert ok.embeddings.float_ is not None and len(ok.embeddings.float_) == 1


# ---------------------------------------------------------------- Cohere embed and its types


def test_cohere_v1_floats_and_by_type(srv: RemoteServer, st_model: Any) -> None:
    co = cohere.Client(base_url=srv.url, api_key="x")
    floats = co.embed(texts=DOCS, model="e5", input_type="search_document")
    assert floats.response_type == "embeddings_floats" and floats.texts == DOCS
    _close(floats.embeddings, _st(st_model, DOCS, P))
    assert floats.meta.api_version.version == "1"
    by_type = co.embed(
        texts=DOCS, model="e5", input_type="search_document", embedding_types=["int8", "float"]
    )
    assert by_type.response_type == "embeddings_by_type"
    _close(by_type.embeddings.float_, _st(st_model, DOCS, P))
    assert np.asarray(by_type.embeddings.int8).shape == (len(DOCS), 384)


def test_cohere_v2_every_type_decodes_to_the_float_vectors(srv: RemoteServer) -> None:
    co = cohere.ClientV2(base_url=srv.url, api_key="x")
    types = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    resp = co.embed(texts=DOCS, model="e5", input_type="search_document", embedding_types=types)
    e = resp.embeddings
    f = np.asarray(e.float_, dtype=np.float32)
    value_range = _range(srv, "e5")
    want_int8 = np.clip(np.rint(f * np.float32(127.0 / value_range)), -128, 127)
    np.testing.assert_array_equal(np.asarray(e.int8), want_int8)
    np.testing.assert_array_equal(np.asarray(e.uint8), want_int8 + 128)
    bits = np.packbits(f > 0, axis=1).astype(int)
    np.testing.assert_array_equal(np.asarray(e.ubinary), bits)
    np.testing.assert_array_equal(np.asarray(e.binary), bits - 128)
    decoded = np.stack([np.frombuffer(base64.b64decode(b), dtype="<f4") for b in e.base64])
    np.testing.assert_array_equal(decoded, f)
    i8 = np.asarray(e.int8, dtype=np.float64)
    cos = (i8 * f).sum(1) / np.linalg.norm(i8, axis=1) / np.linalg.norm(f, axis=1)
    assert cos.min() >= 0.99, cos


def _range(srv: RemoteServer, model: str) -> float:
    card = httpx.get(f"{srv.url}/v1/models/{model}").json()
    return float(card["quantization_range"])


def test_int8_and_binary_vectors_rank_the_right_document_first(srv: RemoteServer) -> None:
    co = cohere.ClientV2(base_url=srv.url, api_key="x")
    types = ["int8", "ubinary"]
    docs = co.embed(texts=DOCS, model="e5", input_type="search_document", embedding_types=types)
    queries = co.embed(
        texts=[q for q, _ in QUERIES], model="e5", input_type="search_query", embedding_types=types
    )
    d8 = np.asarray(docs.embeddings.int8, dtype=np.int64)
    q8 = np.asarray(queries.embeddings.int8, dtype=np.int64)
    assert [int(i) for i in (q8 @ d8.T).argmax(1)] == [right for _, right in QUERIES]
    dbits = np.unpackbits(np.asarray(docs.embeddings.ubinary, dtype=np.uint8), axis=1)
    qbits = np.unpackbits(np.asarray(queries.embeddings.ubinary, dtype=np.uint8), axis=1)
    hamming = (qbits[:, None, :] != dbits[None, :, :]).sum(-1)
    assert [int(i) for i in hamming.argmin(1)] == [right for _, right in QUERIES]


def test_a_texts_int8_vector_does_not_depend_on_its_batch(srv: RemoteServer) -> None:
    text = "Product code XJ-9000-B fits models built after 2019."
    others = [f"{WORDS[i % 10]} {WORDS[(i * 7) % 10]} number {i}" for i in range(99)]
    body = {"model": "e5", "input_type": "search_query", "embedding_types": ["int8", "float"]}
    alone = _post(srv, "/v2/embed", {**body, "texts": [text]}).json()["embeddings"]
    batch = _post(srv, "/v2/embed", {**body, "texts": [*others[:40], text, *others[40:]]}).json()
    inside = {k: v[40] for k, v in batch["embeddings"].items()}
    scale = np.float32(127.0 / _range(srv, "e5"))
    fa = np.asarray(alone["float"][0], dtype=np.float32)
    fb = np.asarray(inside["float"], dtype=np.float32)
    assert np.abs(fa - fb).max() < 1e-5  # the same vector, up to batching's float noise
    # each int8 vector is its own float vector at the model's fixed scale: nothing else in
    # the batch enters (a value on a rounding edge may follow its float noise across it)
    np.testing.assert_array_equal(alone["int8"][0], np.clip(np.rint(fa * scale), -128, 127))
    np.testing.assert_array_equal(inside["int8"], np.clip(np.rint(fb * scale), -128, 127))
    assert (np.asarray(alone["int8"][0]) != np.asarray(inside["int8"])).sum() <= 1


# ---------------------------------------------------------------- truncate, sizes, errors


def _words(n: int, start: int = 0) -> list[str]:
    return [WORDS[(start + i) % len(WORDS)] for i in range(n)]


def test_truncate_end_start_and_none(srv: RemoteServer, st_model: Any) -> None:
    long = _words(400)
    text = " ".join(long)
    assert len(st_model.tokenizer(text)["input_ids"]) == 402  # one token per word
    budget = 256 - 2 - (_tokens(st_model, Q) - 2)  # model limit - [CLS]/[SEP] - prompt

    def v2(truncate: str | None, **extra: Any) -> httpx.Response:
        body = {
            "model": "e5",
            "texts": ["short", text],
            "input_type": "search_query",
            "embedding_types": ["float"],
            **extra,
        }
        if truncate:
            body["truncate"] = truncate
        return _post(srv, "/v2/embed", body)

    end = v2("END").json()
    _close(end["embeddings"]["float"][1], _st(st_model, [" ".join(long[:budget])], Q)[0])
    assert end["meta"]["billed_units"]["input_tokens"] == _tokens(st_model, Q + "short") + 256
    _close(v2(None).json()["embeddings"]["float"][1], np.asarray(end["embeddings"]["float"][1]))
    start = v2("START").json()
    _close(start["embeddings"]["float"][1], _st(st_model, [" ".join(long[-budget:])], Q)[0])
    assert start["meta"]["billed_units"]["input_tokens"] == _tokens(st_model, Q + "short") + 256
    refused = v2("NONE")
    assert refused.status_code == 400
    assert refused.json() == {
        "message": "texts[1]: 404 tokens, more than the 256 this model takes. Shorten it, or "
        "let the server truncate."
    }


def test_max_tokens_caps_each_input(srv: RemoteServer, st_model: Any) -> None:
    text = " ".join(_words(60))
    body = {
        "model": "e5",
        "texts": [text],
        "input_type": "search_query",
        "max_tokens": 20,
        "embedding_types": ["float"],
    }
    budget = 20 - 2 - (_tokens(st_model, Q) - 2)
    end = _post(srv, "/v2/embed", body).json()
    _close(end["embeddings"]["float"][0], _st(st_model, [" ".join(_words(budget))], Q)[0])
    assert end["meta"]["billed_units"]["input_tokens"] == 20
    start = _post(srv, "/v2/embed", {**body, "truncate": "START"}).json()
    _close(start["embeddings"]["float"][0], _st(st_model, [" ".join(_words(60)[-budget:])], Q)[0])
    refused = _post(srv, "/v2/embed", {**body, "truncate": "NONE"})
    assert refused.status_code == 400 and "more than the 20" in refused.json()["message"]
    bad = _post(srv, "/v2/embed", {**body, "max_tokens": 0})
    assert bad.status_code == 400 and "max_tokens" in bad.json()["message"]


def test_output_dimension_cuts_and_renormalises(srv: RemoteServer, st_model: Any) -> None:
    co = cohere.ClientV2(base_url=srv.url, api_key="x")
    resp = co.embed(
        texts=DOCS[:2],
        model="e5",
        input_type="search_document",
        embedding_types=["float", "ubinary"],
        output_dimension=128,
    )
    full = _st(st_model, DOCS[:2], P)[:, :128]
    want = full / np.linalg.norm(full, axis=1, keepdims=True)
    _close(resp.embeddings.float_, want)
    assert np.asarray(resp.embeddings.ubinary).shape == (2, 16)
    with pytest.raises(cohere.BadRequestError) as exc:
        co.embed(
            texts=["x"],
            model="e5",
            input_type="search_query",
            embedding_types=["binary"],
            output_dimension=100,
        )
    assert "divisible by 8" in exc.value.body["message"]
    with pytest.raises(cohere.BadRequestError) as exc:
        co.embed(texts=["x"], model="e5", input_type="search_query", output_dimension=1000)
    assert "output_dimension" in exc.value.body["message"]


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"texts": ["x"], "embedding_types": ["int4"]}, 400, "Unknown embedding type 'int4'"),
        ({"texts": ["x"], "truncate": "MIDDLE"}, 400, "truncate"),
        ({"texts": []}, 400, "'texts' must not be empty"),
        ({}, 400, "Send exactly one of 'texts', 'images' or 'inputs'"),
        ({"texts": ["x"], "images": [data_uri(png(), "image/png")]}, 400, "got texts, images"),
        ({"texts": ["x"], "model": "nope"}, 404, "'nope' does not exist"),
        ({"images": ["data:image/png;base64,AAAA"], "model": "clip"}, 400, "images[0]"),
        ({"images": [data_uri(png(), "image/png")]}, 400, "cannot embed images"),
        (
            {
                "inputs": [
                    {
                        "content": [
                            {"type": "text", "text": "a"},
                            {"type": "image_url", "image_url": {"url": "data:x"}},
                        ]
                    }
                ]
            },
            400,
            "cannot embed images",  # a text and an image: one vector on a VLM, not on e5
        ),
    ],
)
def test_bad_requests_are_4xx_in_cohere_shape(
    srv: RemoteServer, body: dict[str, Any], status: int, says: str
) -> None:
    r = _post(srv, "/v2/embed", {"model": "e5", "input_type": "search_query", **body})
    assert r.status_code == status, r.text
    assert set(r.json()) == {"message"} and says in r.json()["message"], r.json()


def test_cohere_sdk_raises_its_own_errors(srv: RemoteServer) -> None:
    co = cohere.ClientV2(base_url=srv.url, api_key="x")
    with pytest.raises(cohere.NotFoundError):
        co.embed(texts=["x"], model="missing", input_type="search_query")
    with pytest.raises(cohere.BadRequestError):
        co.embed(texts=["x"], model="e5", input_type="search_query", embedding_types=["int4"])


# ---------------------------------------------------------------- images and content inputs


def test_images_and_content_inputs_embed_like_the_openai_route(srv: RemoteServer) -> None:
    red, blue = (
        data_uri(png(color=(220, 20, 20)), "image/png"),
        data_uri(png(color=(20, 20, 220)), "image/png"),
    )
    ref = _post(srv, "/v1/embeddings", {"model": "clip", "input": [red, blue], "modality": "image"})
    want_images = np.asarray([d["embedding"] for d in ref.json()["data"]])
    ref_text = _post(srv, "/v1/embeddings", {"model": "clip", "input": ["a red square"]})
    want_text = np.asarray(ref_text.json()["data"][0]["embedding"])

    v1 = cohere.Client(base_url=srv.url, api_key="x").embed(
        images=[red, blue], model="clip", input_type="image"
    )
    _close(v1.embeddings, want_images)
    assert v1.images is not None and v1.images[0].width == 40 and v1.images[0].format == "png"
    assert v1.meta.billed_units.images == 2

    v2 = cohere.ClientV2(base_url=srv.url, api_key="x").embed(
        model="clip",
        input_type="search_document",
        embedding_types=["float"],
        inputs=[
            {"content": [{"type": "image_url", "image_url": {"url": blue}}]},
            {"content": [{"type": "text", "text": "a red"}, {"type": "text", "text": "square"}]},
            {"content": [{"type": "image_url", "image_url": {"url": red}}]},
        ],
    )
    got = np.asarray(v2.embeddings.float_)
    _close(got[[2, 0]], want_images)
    _close(got[1], want_text)
    assert v2.texts == ["a red square"]


# ---------------------------------------------------------------- integrations


def test_langchain_cohere_embeddings_use_the_right_prompts(
    srv: RemoteServer, st_model: Any
) -> None:
    from langchain_cohere import CohereEmbeddings

    emb = CohereEmbeddings(model="e5", cohere_api_key="x", base_url=srv.url)  # type: ignore[call-arg]
    _close(emb.embed_documents(DOCS[:2]), _st(st_model, DOCS[:2], P))
    _close(emb.embed_query(QUERIES[0][0]), _st(st_model, [QUERIES[0][0]], Q)[0])


def test_llamaindex_cohere_embedding_uses_the_right_prompts(
    srv: RemoteServer, st_model: Any
) -> None:
    from llama_index.embeddings.cohere import CohereEmbedding

    emb = CohereEmbedding(
        api_key="x", model_name="embed-english-v3.0", base_url=srv.url, max_retries=0
    )
    _close(emb.get_text_embedding_batch(DOCS[:2]), _st(st_model, DOCS[:2], P))
    _close(emb.get_query_embedding(QUERIES[0][0]), _st(st_model, [QUERIES[0][0]], Q)[0])
