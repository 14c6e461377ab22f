"""Visual document retrieval and vision-language models end to end (#53): ColPali and ColQwen2
page images, a vision-language embedder and a multimodal reranker (openai_compat/models/
demo_vision.py), each served from its folder alone, in every peer's input shape, through the
openai and cohere SDKs where they exist. Every served number is compared with the library's
own computation on the same folder (MultiVectorEncoder.encode_document / encode_query /
similarity, SentenceTransformer.encode, CrossEncoder.predict): vectors within 1e-5, orders
exactly. Images go as data: URIs, in orders other than the library's."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cohere
import httpx
import numpy as np
import openai
import pytest

from tests.utils import RemoteServer, server_with

pytestmark = pytest.mark.slow

TOL = 1e-5
# 21 token vectors of 16 values a ColPali page (16 image tokens and the processor's prompt):
# the bound lets 3 pages through, not 4
BOUND = 1100


def _image(seed: int, size: tuple[int, int] = (90, 70)) -> Any:
    from PIL import Image

    rng = np.random.RandomState(seed)
    return Image.fromarray((rng.rand(size[1], size[0], 3) * 255).astype("uint8"))


def _uri(img: Any) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


PAGES = [_image(1), _image(2, (120, 60)), _image(3, (64, 64))]
URIS = [_uri(p) for p in PAGES]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from openai_compat.models import demo_vision as tv

    root = tmp_path_factory.mktemp("vision")
    colpali = tv.build_colpali(root / "colpali")
    return {
        "colpali": colpali,
        "colpali-pooled": tv.build_pooled(colpali, root / "colpali-pooled"),
        "colqwen2": tv.build_colqwen2(root / "colqwen2"),
        "vl": tv.build_vl_embedder(root / "vl"),
        "vlrerank": tv.build_vl_reranker(root / "vlrerank"),
    }


@pytest.fixture(scope="module")
def srv(
    tmp_path_factory: pytest.TempPathFactory, folders: dict[str, Path]
) -> Iterator[RemoteServer]:
    models = [{"name": n, "model": str(f)} for n, f in folders.items()]
    models.append({"name": "minilm", "model": "builtin:all-MiniLM-L6-v2"})
    # the reranker with a short window, cutting (the default) and refusing past it
    short = {"model": str(folders["vlrerank"]), "max_length": 64}
    models.append({"name": "vlrerank-short", **short})
    models.append({"name": "vlrerank-strict", **short, "truncate": False})
    args = ["--max-multivector-values", str(BOUND), "--cache-bytes", "0"]
    with server_with(tmp_path_factory.mktemp("cfg"), models, args) as server:
        yield server


@pytest.fixture(scope="module")
def library(folders: dict[str, Path]) -> dict[str, Any]:
    from sentence_transformers import CrossEncoder, MultiVectorEncoder, SentenceTransformer

    return {
        "colpali": MultiVectorEncoder(str(folders["colpali"]), device="cpu"),
        "colpali-pooled": MultiVectorEncoder(str(folders["colpali-pooled"]), device="cpu"),
        "colqwen2": MultiVectorEncoder(str(folders["colqwen2"]), device="cpu"),
        "vl": SentenceTransformer(str(folders["vl"]), device="cpu"),
        "vlrerank": CrossEncoder(str(folders["vlrerank"]), device="cpu"),
    }


def _close(got: Any, want: Any) -> None:
    np.testing.assert_allclose(np.asarray(got, dtype=np.float32), np.asarray(want), atol=TOL)


def _rows(item: Any) -> np.ndarray:
    """A multi-vector item as the openai SDK hands it back: rows of floats, or (its default
    base64, which it decodes to one flat list) the flat values, shaped by `shape`."""
    if isinstance(item.embedding, str):
        flat = np.frombuffer(base64.b64decode(item.embedding), dtype="<f4")
    else:
        flat = np.asarray(item.embedding, dtype=np.float32)
    return flat.reshape(item.model_extra["shape"])


@pytest.mark.parametrize("name", ["colpali", "colqwen2", "colpali-pooled"])
def test_page_images_are_encode_documents_token_vectors(
    srv: RemoteServer, library: dict[str, Any], name: str
) -> None:
    model = library[name]
    order = [2, 0, 1]  # not the library's order
    want = model.encode_document([PAGES[i] for i in order])
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    for fmt in ("float", "base64"):
        got = client.embeddings.create(
            model=name,
            input=[URIS[i] for i in order],
            encoding_format=fmt,  # type: ignore[arg-type]
            extra_body={"modality": "image"},
        )
        for item, w in zip(got.data, want, strict=True):
            assert item.model_extra["shape"] == list(w.shape)
            _close(_rows(item), w.numpy())
        # usage: the processor's input_ids (image tokens and its prompt) of each page
        lengths = model.preprocess([PAGES[i] for i in order], task="document")["attention_mask"]
        assert got.usage.prompt_tokens == int(lengths.sum())
    # Two queries of as many words: the same shape, so only their values can show a swap
    # (#61.8: the fixtures' tokenizers made every text one <unk>, and these were equal).
    queries = ["what is the total amount", "where is the red tower"]
    want_q = model.encode_query(queries)
    assert not np.allclose(want_q[0].numpy(), want_q[1].numpy(), atol=1e-3)
    asked = client.embeddings.create(model=name, input=queries, extra_body={"input_type": "query"})
    for item, w in zip(asked.data, want_q, strict=True):
        _close(_rows(item), w.numpy())


@pytest.mark.parametrize("name", ["colpali", "colqwen2"])
def test_rerank_page_images_by_maxsim_as_the_library_scores(
    srv: RemoteServer, library: dict[str, Any], name: str
) -> None:
    model = library[name]
    query = "what is the total amount"
    want = model.similarity(model.encode_query([query]), model.encode_document(PAGES))[0]
    body = {"model": name, "query": query, "documents": [{"image": u} for u in URIS]}
    got = httpx.post(srv.url + "/v2/rerank", json=body, timeout=60).json()["results"]
    order = [int(i) for i in np.argsort(-want.numpy(), kind="stable")]
    assert [r["index"] for r in got] == order
    for r in got:
        assert r["relevance_score"] == pytest.approx(float(want[r["index"]]), abs=1e-4)


def test_page_vectors_count_toward_the_response_bound(srv: RemoteServer) -> None:
    """4 pages x 21 vectors x 16 values = 1,344 > the server's 1,100: a 400 naming the
    limit, before any work; 3 pages (1,008) are served."""
    url = srv.url + "/v1/embeddings"
    body = {"model": "colpali", "input": [*URIS, URIS[0]], "modality": "image"}
    refused = httpx.post(url, json=body, timeout=60)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "output_too_large" and "max_multivector_values" in error["message"]
    assert httpx.post(url, json={**body, "input": URIS}, timeout=60).status_code == 200


def test_a_vl_embedder_takes_jinas_items_in_order(
    srv: RemoteServer, library: dict[str, Any]
) -> None:
    """Texts, images and image+text in one request, in the client's order; images on the
    document side (the model's document prompt as its system message)."""
    st = library["vl"]
    items = [
        {"image": URIS[1], "text": "red photo"},
        {"text": "what is the total amount"},
        {"image": URIS[0]},
        {"image": URIS[2].split(",", 1)[1]},  # Jina's bare base64
    ]
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    got = client.embeddings.create(model="vl", input=items)  # type: ignore[arg-type]
    want = [
        st.encode({"image": PAGES[1], "text": "red photo"}, prompt_name="document"),
        st.encode("what is the total amount"),
        st.encode(PAGES[0], prompt_name="document"),
        st.encode(PAGES[2], prompt_name="document"),
    ]
    for item, w in zip(got.data, want, strict=True):
        _close(item.embedding, w)
    as_query = client.embeddings.create(
        model="vl", input=["what is the total amount"], extra_body={"input_type": "query"}
    )
    _close(as_query.data[0].embedding, st.encode("what is the total amount", prompt_name="query"))
    images = client.embeddings.create(
        model="vl", input=URIS[:2], encoding_format="base64", extra_body={"modality": "image"}
    )
    for item, img in zip(images.data, PAGES[:2], strict=True):
        _close(
            np.frombuffer(base64.b64decode(item.embedding), "<f4"),
            st.encode(img, prompt_name="document"),
        )  # type: ignore[arg-type]


def test_cohere_images_and_v4_content_lists_on_a_vl_embedder(
    srv: RemoteServer, library: dict[str, Any]
) -> None:
    st = library["vl"]
    co = cohere.ClientV2(base_url=srv.url, api_key="x")
    got = co.embed(model="vl", images=URIS[:2], input_type="image", embedding_types=["float"])
    for vector, img in zip(got.embeddings.float_ or [], PAGES[:2], strict=True):
        _close(vector, st.encode(img, prompt_name="document"))
    parts_a = [
        {"type": "text", "text": "red photo"},
        {"type": "image_url", "image_url": {"url": URIS[1]}},
    ]
    inputs = [{"content": parts_a}, {"content": parts_a[::-1]}, {"content": parts_a[:1]}]
    got = co.embed(
        model="vl",
        inputs=inputs,  # type: ignore[arg-type]
        input_type="search_document",
        embedding_types=["float"],
    )
    pair = st.encode({"image": PAGES[1], "text": "red photo"}, prompt_name="document")
    vectors = got.embeddings.float_ or []
    _close(vectors[0], pair)
    _close(vectors[1], pair)  # whatever order the parts come in
    _close(vectors[2], st.encode("red photo", prompt_name="document"))


def test_a_multimodal_reranker_scores_as_crossencoder_predict(
    srv: RemoteServer, library: dict[str, Any]
) -> None:
    ce = library["vlrerank"]
    query = "what is the total amount"
    docs: list[Any] = [
        "a page of text",
        {"image": URIS[2]},
        {"image": URIS[0], "text": "red photo"},
    ]
    want = ce.predict(
        [
            (query, "a page of text"),
            (query, PAGES[2]),
            (query, {"image": PAGES[0], "text": "red photo"}),
        ]
    )
    for path in ("/v1/rerank", "/v2/rerank"):  # Jina's / Cohere v1 shape, Cohere v2
        body = {"model": "vlrerank", "query": query, "documents": docs, "return_documents": True}
        got = httpx.post(srv.url + path, json=body, timeout=60).json()["results"]
        assert [r["index"] for r in got] == [int(i) for i in np.argsort(-want, kind="stable")]
        for r in got:
            assert r["relevance_score"] == pytest.approx(float(want[r["index"]]), abs=TOL)
            assert r["document"] == (
                {"text": docs[r["index"]]}
                if isinstance(docs[r["index"]], str)
                else docs[r["index"]]
            )


def test_images_to_a_text_only_model_and_models_modalities(srv: RemoteServer) -> None:
    url = srv.url + "/v1/embeddings"
    body = {"model": "minilm", "input": [{"text": "hi"}, {"image": URIS[0]}]}
    refused = httpx.post(url, json=body).json()["error"]
    assert refused["message"].startswith("input[1]: model 'minilm' takes text only")
    paired = httpx.post(url, json={"model": "colpali", "input": [{"image": URIS[0], "text": "x"}]})
    assert paired.status_code == 400 and "not the two as one input" in paired.text
    cards = {m["id"]: m for m in httpx.get(srv.url + "/v1/models").json()["data"]}
    assert cards["minilm"]["modalities"] == ["text"]
    for name in ("colpali", "colqwen2", "colpali-pooled", "vl", "vlrerank"):
        assert cards[name]["modalities"] == ["text", "image"], name


def test_infinitys_image_route_on_the_new_kinds(srv: RemoteServer, library: dict[str, Any]) -> None:
    got = httpx.post(
        srv.url + "/embeddings_image", json={"model": "vl", "input": URIS[:1]}, timeout=60
    ).json()
    _close(got["data"][0]["embedding"], library["vl"].encode(PAGES[0], prompt_name="document"))


def test_a_batch_line_carries_page_images_as_data_uris(
    srv: RemoteServer, library: dict[str, Any]
) -> None:
    from tests.utils import run_batch

    lines = [
        {"custom_id": "pages", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "vl", "input": [{"image": URIS[0]}, {"text": "red photo"}]}},
    ]  # fmt: skip
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    job = run_batch(client, lines, timeout=120)
    assert job.status == "completed" and job.output_file_id is not None
    import json

    (row,) = [json.loads(r) for r in client.files.content(job.output_file_id).text.splitlines()]
    data = row["response"]["body"]["data"]
    _close(data[0]["embedding"], library["vl"].encode(PAGES[0], prompt_name="document"))
    _close(data[1]["embedding"], library["vl"].encode("red photo"))


def _vm(pid: int, key: str) -> int:
    """A /proc/<pid>/status figure in MiB (VmRSS now, VmHWM the peak since clear_refs)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) // 1024
    raise KeyError(key)


def _page_uri(size: int, color: tuple[int, int, int]) -> str:
    from PIL import Image

    buf = io.BytesIO()
    page = Image.new("P", (size, size), 0)  # one palette colour: decoded to RGB, 48 MiB
    page.putpalette(color)
    page.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_page_images_cannot_pin_gigabytes(srv: RemoteServer, library: dict[str, Any]) -> None:
    """#61.1, measured on the server process (its peak resident memory reset before each
    request: /proc's clear_refs). Before the fix 4 maximal pages (4096 x 4096, single colour:
    a few KB each) took ColPali's server +560 MiB at peak and left +257 MiB resident (a VL
    embedder's +607 / +385), 12 pages +1.5 GB. Now 12 are refused from their headers, and 4
    (the default budget) are decoded one at a time and shrunk to what the processor keeps."""
    pid, url = srv.proc.pid, srv.url + "/v1/embeddings"
    pages = [_page_uri(4096, (i * 20, 90, 200)) for i in range(12)]
    assert sum(len(p) for p in pages) < 200_000

    def measured(body: dict[str, Any]) -> tuple[httpx.Response, int, int]:
        with open(f"/proc/{pid}/clear_refs", "w") as refs:
            refs.write("5")  # VmHWM := VmRSS
        before = _vm(pid, "VmRSS")
        answer = httpx.post(url, json=body, timeout=120)
        return answer, _vm(pid, "VmHWM") - before, _vm(pid, "VmRSS") - before

    refused, peak, _ = measured({"model": "colpali", "input": pages, "modality": "image"})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "too_large" and "--max-request-pixels" in error["message"]
    assert error["message"].startswith("input[4]:")  # the page that crossed 64 Mi pixels
    assert peak < 32, peak
    for model, count in (("colpali", 3), ("vl", 4)):  # ColPali's: this server's BOUND
        body = {"model": model, "input": pages[:count], "modality": "image"}
        answer, peak, kept = measured(body)
        assert answer.status_code == 200, answer.text
        # one full-size decode at a time (48 MiB of RGB) and four shrunk pages
        assert peak < 160 and kept < 64, (model, peak, kept)
    # A shrunk page's vectors are the library's on the page reduced as decoding reduced it
    # (by 5, to twice ColPali's 56-pixel side), close to the whole page's.
    from PIL import Image

    page = Image.fromarray(np.kron(np.asarray(_image(7, (30, 30))), np.ones((20, 20, 1), "uint8")))
    got = httpx.post(
        url, json={"model": "colpali", "input": [_uri(page)], "modality": "image"}, timeout=60
    ).json()["data"][0]
    rows = np.asarray(got["embedding"], dtype=np.float32).reshape(got["shape"])
    _close(rows, library["colpali"].encode_document([page.reduce(5)])[0].numpy())
    whole = library["colpali"].encode_document([page])[0].numpy()
    cosines = (rows * whole).sum(1) / np.linalg.norm(rows, axis=1) / np.linalg.norm(whole, axis=1)
    assert cosines.min() > 0.995, cosines.min()


def test_jina_items_to_a_reranker_are_the_400_a_string_gets(srv: RemoteServer) -> None:
    """#61.10: content items skipped the capability check and reached a cross-encoder (a 500)."""
    url = srv.url + "/v1/embeddings"
    as_string = httpx.post(url, json={"model": "vlrerank", "input": ["hi"]})
    for items in ([{"text": "hi"}], [{"image": URIS[0]}], [{"image": URIS[0], "text": "hi"}]):
        answer = httpx.post(url, json={"model": "vlrerank", "input": items})
        assert answer.status_code == 400, answer.text
        assert answer.json() == as_string.json()


def _sha(key: str) -> str:
    import hashlib

    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture(scope="module")
def keyed(
    tmp_path_factory: pytest.TempPathFactory, folders: dict[str, Path]
) -> Iterator[RemoteServer]:
    """The vision models behind keys with small tokens-per-minute budgets (one each)."""
    root = tmp_path_factory.mktemp("keyed")
    keys = root / "keys.toml"
    keys.write_text(
        "".join(
            f'[[keys]]\nname = "{name}"\nkey_sha256 = "{_sha(name)}"\ntpm = {tpm}\n\n'
            for name, tpm in (("pages", 60), ("rerank", 100), ("template", 50))
        )
    )
    models = [{"name": n, "model": str(folders[n])} for n in ("colpali", "vl", "vlrerank")]
    args = ["--keys-file", str(keys), "--cache-bytes", "0"]
    with server_with(root, models, args) as server:
        yield server


def test_image_paths_take_the_processors_tokens_before_the_model_runs(
    srv: RemoteServer, keyed: RemoteServer
) -> None:
    """#61.2: ColPali pages reserved 0 tokens, image documents in a multimodal rerank none,
    and a VLM's chat template was charged after the answer: a tpm-200 key spent 1,323, 924
    and 4,740 tokens in single requests. Now the engine takes the processor's count once it
    has prepared the inputs, before they queue: over the budget is a 429 before any work."""

    def post(server: RemoteServer, path: str, body: dict[str, Any], key: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"}
        return httpx.post(server.url + path, json=body, headers=headers, timeout=120)

    pages = {"model": "colpali", "input": URIS, "modality": "image"}  # 3 x 21 = 63 > 60
    assert post(srv, "/v1/embeddings", pages, "x").json()["usage"]["prompt_tokens"] == 63
    refused = post(keyed, "/v1/embeddings", pages, "pages")
    assert refused.status_code == 429 and "Request too large" in refused.text, refused.text[:300]
    two = post(keyed, "/v1/embeddings", {**pages, "input": URIS[:2]}, "pages")
    assert two.status_code == 200 and two.json()["usage"]["prompt_tokens"] == 42
    # 18 tokens left: of six concurrent one-page requests (21 each) at most one more passes
    import concurrent.futures

    one = {**pages, "input": URIS[:1]}
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        codes = list(
            pool.map(lambda _: post(keyed, "/v1/embeddings", one, "pages").status_code, range(6))
        )
    assert codes.count(429) >= 5, codes

    query = "what is the total amount of the red invoice on the page " * 3
    rerank = {"model": "vlrerank", "query": query, "documents": [{"image": u} for u in URIS * 2]}
    spent = post(srv, "/v1/rerank", rerank, "x").json()["usage"]["total_tokens"]
    assert spent > 100  # the premise: over the rerank key's whole tpm
    refused = post(keyed, "/v1/rerank", rerank, "rerank")
    assert refused.status_code == 429 and "Request too large" in refused.text, refused.text[:300]

    texts = {"model": "vl", "input": ["red photo", "blue chart", "the cat", "a dog"] * 4}
    spent = post(srv, "/v1/embeddings", texts, "x").json()["usage"]["prompt_tokens"]
    assert spent > 50  # with the template's tokens; the 32 words alone are under the tpm
    refused = post(keyed, "/v1/embeddings", texts, "template")
    assert refused.status_code == 429 and "Request too large" in refused.text, refused.text[:300]


def test_a_long_query_beside_page_images_is_fitted_once_or_refused(srv: RemoteServer) -> None:
    """#61.4: a 2.6 KB query beside one page image was a 500 (the processor's "Mismatch in
    image token count", its traceback), and each pair carried the whole query through the
    model's preparation thread. The query is fitted once to half the window (cut, or refused
    with truncation off); tests/test_debug_engine.py: what a processor still refuses is a 400."""
    url = srv.url + "/v1/rerank"
    query = "what is the total amount on the red invoice " * 60  # 2.7 KB, 540 tokens
    docs = [{"image": u} for u in URIS]
    fitted = httpx.post(url, json={"model": "vlrerank-short", "query": query, "documents": docs})
    assert fitted.status_code == 200, fitted.text[:300]
    assert len(fitted.json()["results"]) == 3
    strict = httpx.post(url, json={"model": "vlrerank-strict", "query": query, "documents": docs})
    assert strict.status_code == 400, strict.text[:300]  # Cohere's body: {"message"}
    assert strict.json()["message"].startswith("query: more than the 32 tokens")
    assert "half the model's window" in strict.json()["message"]
