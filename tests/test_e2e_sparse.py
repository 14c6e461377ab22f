"""Sparse (SPLADE) vectors end to end: the server against a direct transformers computation,
the openai SDK, TEI's /embed_sparse, rerank by dot product, hybrid search in a real Qdrant
(qdrant-client's local mode), and overload (200 or 429 only)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from openai_compat.formats.sparse import SparseVector, decode_base64
from tests.utils import RemoteServer, server_with

pytestmark = pytest.mark.slow

TEXTS = [
    "Replacement filter for the XR-7720 vacuum cleaner",
    "Ada Lovelace wrote the first computer program.",
    "The quick brown fox jumps over the lazy dog.",
    "word " * 300,  # longer than the model's 256 tokens: truncated when asked, as for dense
]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, splade_path: Path) -> Iterator[RemoteServer]:
    models = [
        {"name": "minilm", "model": "builtin:all-MiniLM-L6-v2"},
        # detected from the folder (BertForMaskedLM): no kind needed
        {"name": "splade", "model": splade_path, "max_length": 256},
    ]
    with server_with(tmp_path_factory.mktemp("cfg"), models) as server:
        yield server


@pytest.fixture(scope="module")
def reference(splade_path: Path) -> Any:
    """SPLADE's formula computed directly with transformers, one text at a time."""
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(splade_path)
    model = AutoModelForMaskedLM.from_pretrained(splade_path).eval()

    def encode(text: str) -> SparseVector:
        enc = tok(text, truncation=True, max_length=256, return_tensors="pt")
        with torch.no_grad():
            logits = model(**enc).logits[0]
        weights = torch.log1p(torch.relu(logits)) * enc["attention_mask"][0].unsqueeze(-1)
        return SparseVector.from_dense(weights.max(dim=0).values.numpy(), len(enc["input_ids"][0]))

    encode.tokenizer = tok  # type: ignore[attr-defined]
    return encode


def _post(srv: RemoteServer, path: str, body: Any) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=60)


def _sparse(emb: dict[str, Any]) -> SparseVector:
    return SparseVector(np.asarray(emb["indices"], "<u4"), np.asarray(emb["values"], "<f4"))


def _assert_same(got: SparseVector, want: SparseVector) -> None:
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_allclose(got.values, want.values, atol=1e-5, rtol=1e-5)


def test_vectors_equal_a_direct_transformers_computation(srv: RemoteServer, reference: Any) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=srv.url + "/v1", api_key="unused")
    resp = client.embeddings.create(
        model="splade", input=TEXTS, encoding_format="float", extra_body={"long_input": "truncate"}
    )
    wants = [reference(t) for t in TEXTS]
    for item, want in zip(resp.data, wants, strict=True):
        got = _sparse(item.embedding)  # type: ignore[arg-type]
        _assert_same(got, want)
        assert np.all(np.diff(got.indices.astype(np.int64)) > 0) and np.all(got.values > 0)
    # usage: the real tokens, specials included, after truncation
    assert resp.usage.prompt_tokens == sum(w.tokens for w in wants)
    assert wants[3].tokens == 256
    refused = _post(srv, "/v1/embeddings", {"model": "splade", "input": TEXTS})
    assert refused.status_code == 400  # /v1/embeddings' default, as for dense models
    assert refused.json()["error"]["message"].startswith("input[3]: 302 tokens")
    windows = _post(
        srv, "/v1/embeddings", {"model": "splade", "input": TEXTS, "long_input": "mean"}
    )
    assert windows.status_code == 400 and windows.json()["error"]["param"] == "long_input"


def test_the_vectors_mean_something(srv: RemoteServer, reference: Any) -> None:
    """The test model weights a text's own words (what hybrid search relies on)."""
    r = _post(
        srv,
        "/v1/embeddings",
        {"model": "splade", "input": TEXTS[:3], "top_k": 12, "return_tokens": True},
    ).json()
    for text, item in zip(TEXTS[:3], r["data"], strict=True):
        words = set(reference.tokenizer.tokenize(text))
        top = set(item["embedding"]["tokens"])
        assert len(words & top) >= min(6, len(words) - 1), (text, top)


def test_openai_sdk_default_base64_decodes_to_the_floats(srv: RemoteServer) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=srv.url + "/v1", api_key="unused")
    floats = client.embeddings.create(model="splade", input=TEXTS[:2], encoding_format="float")
    # the SDK asks for base64 unless told; it leaves a sparse object as the server sent it
    b64 = client.embeddings.create(model="splade", input=TEXTS[:2])
    for f, b in zip(floats.data, b64.data, strict=True):
        assert isinstance(b.embedding, dict)
        decoded = decode_base64(b.embedding)
        floats = _sparse(f.embedding)  # type: ignore[arg-type]
        np.testing.assert_array_equal(decoded.indices, floats.indices)
        np.testing.assert_array_equal(decoded.values, floats.values)


def test_top_k_min_weight_and_return_tokens(srv: RemoteServer, reference: Any) -> None:
    body = {"model": "splade", "input": TEXTS[1]}
    # selections are checked against the server's own full vector (the same numbers, so ties
    # within float noise of the reference cannot flip which entries are kept)
    full = _sparse(_post(srv, "/v1/embeddings", body).json()["data"][0]["embedding"])
    _assert_same(full, reference(TEXTS[1]))
    top = _post(srv, "/v1/embeddings", {**body, "top_k": 5}).json()["data"][0]["embedding"]
    largest = full.indices[np.lexsort((full.indices, -full.values))[:5]]
    assert top["indices"] == sorted(largest.tolist())  # the 5 largest, indices ascending
    np.testing.assert_array_equal(
        np.asarray(top["values"], "<f4"), full.values[np.isin(full.indices, top["indices"])]
    )
    floor = float(np.median(full.values))
    kept = _post(srv, "/v1/embeddings", {**body, "min_weight": floor}).json()["data"][0]
    assert kept["embedding"]["indices"] == full.indices[full.values >= floor].tolist()
    assert 0 < len(kept["embedding"]["indices"]) < len(full.indices)
    named = _post(srv, "/v1/embeddings", {**body, "return_tokens": True, "top_k": 8}).json()
    emb = named["data"][0]["embedding"]
    assert emb["tokens"] == reference.tokenizer.convert_ids_to_tokens(emb["indices"])
    own = set(reference.tokenizer.tokenize(TEXTS[1]))  # ada, love, ##lace, wrote...
    assert len(own & set(emb["tokens"])) >= 5, emb["tokens"]


def test_tei_embed_sparse(srv: RemoteServer, reference: Any) -> None:
    got = _post(srv, "/embed_sparse", {"inputs": TEXTS[:2]}).json()
    for rows, text in zip(got, TEXTS[:2], strict=True):
        vec = SparseVector(
            np.asarray([r["index"] for r in rows], "<u4"),
            np.asarray([r["value"] for r in rows], "<f4"),
        )
        _assert_same(vec, reference(text))
    one = _post(srv, "/embed_sparse", {"inputs": TEXTS[0]}).json()
    assert len(one) == 1 and one[0] == got[0]


def test_rerank_by_the_dot_product(srv: RemoteServer, reference: Any) -> None:
    query, docs = "XR-7720 filter", TEXTS[:3]
    got = _post(srv, "/v1/rerank", {"model": "splade", "query": query, "documents": docs}).json()
    q = reference(query)
    want = {i: q.dot(reference(d)) for i, d in enumerate(docs)}
    assert got["results"][0]["index"] == 0
    for r in got["results"]:
        # float noise of a batched vs a one-text forward scales with the vectors, not with
        # the score: a near-zero score (0.0129) once differed by 3e-7 (CI)
        assert r["relevance_score"] == pytest.approx(want[r["index"]], rel=1e-5, abs=1e-4)
    assert [r["index"] for r in got["results"]] == sorted(want, key=lambda i: -want[i])


def test_models_say_sparse_and_dense_options_are_refused(srv: RemoteServer) -> None:
    cards = {m["id"]: m for m in httpx.get(srv.url + "/v1/models").json()["data"]}
    assert cards["splade"]["capabilities"] == ["rerank", "sparse"]
    assert cards["splade"]["dimensions"] == 30522  # the vocabulary
    r = _post(srv, "/v1/embeddings", {"model": "splade", "input": "x", "dimensions": 64})
    assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"
    r = _post(srv, "/v1/embeddings", {"model": "minilm", "input": "x", "top_k": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_k"
    r = _post(srv, "/v1/embeddings", {"model": "splade", "input": "x", "top_k": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_k"
    r = _post(srv, "/v1/embeddings", {"model": "splade", "input": "x", "min_weight": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_weight"
    r = _post(srv, "/v2/embed", {"model": "splade", "texts": ["x"], "input_type": "search_query"})
    assert r.status_code == 400 and "sparse" in r.json()["message"]
    r = _post(srv, "/v1/embeddings", {"model": "splade", "input": "x", "modality": "image"})
    assert r.status_code == 400


# Dense MiniLM prefers the question about filters; only the right document holds the part
# code, whose pieces ("z", "##q", "91", "##83") the sparse vectors share: hybrid puts it first.
# RRF (qdrant: 1/(2 + rank)) ties the right document (dense 2nd, sparse 1st) with the dense
# winner if that one is sparse 2nd, so two other "ZQ" documents outrank the question lexically
# while ranking below the right document densely: the margin holds across the few-second
# training of the test SPLADE head, whose weights vary with threads and CPU (CI saw the tie).
CATALOGUE = [
    "Which filter fits my vacuum cleaner?",
    "ZQ-9183: pleated cartridge, 2 per box.",
    "Model ZQ-2000 fan, quiet mode.",
    "Vacuum cleaner accessories and parts.",
    "Washable foam filter for bagless vacuums.",
    "Spare ZQ parts catalogue.",
]
QUERY = "filter ZQ-9183"
RIGHT = 1


def test_hybrid_search_in_qdrant_ranks_the_lexical_match_first(srv: RemoteServer) -> None:
    from qdrant_client import QdrantClient, models

    def dense(texts: list[str]) -> list[list[float]]:
        r = _post(srv, "/v1/embeddings", {"model": "minilm", "input": texts}).json()
        return [d["embedding"] for d in r["data"]]

    def sparse(texts: list[str]) -> list[models.SparseVector]:
        r = _post(srv, "/v1/embeddings", {"model": "splade", "input": texts}).json()
        return [models.SparseVector(**d["embedding"]) for d in r["data"]]

    client = QdrantClient(":memory:")
    client.create_collection(
        "products",
        vectors_config={"dense": models.VectorParams(size=384, distance=models.Distance.COSINE)},
        sparse_vectors_config={"sparse": models.SparseVectorParams()},
    )
    client.upsert(
        "products",
        points=[
            models.PointStruct(id=i, vector={"dense": d, "sparse": s}, payload={"text": t})
            for i, (t, d, s) in enumerate(
                zip(CATALOGUE, dense(CATALOGUE), sparse(CATALOGUE), strict=True)
            )
        ],
    )
    (q_dense,), (q_sparse,) = dense([QUERY]), sparse([QUERY])
    dense_only = client.query_points("products", query=q_dense, using="dense", limit=5).points
    assert dense_only[0].id == 0  # the dense vector alone gets it wrong
    hybrid = client.query_points(
        "products",
        prefetch=[
            models.Prefetch(query=q_dense, using="dense", limit=len(CATALOGUE)),
            models.Prefetch(query=q_sparse, using="sparse", limit=len(CATALOGUE)),
        ],
        query=models.FusionQuery(fusion=models.Fusion.RRF),
        limit=5,
    ).points
    assert hybrid[0].id == RIGHT, [(p.id, p.score) for p in hybrid]


def test_overload_answers_only_200_or_429(tmp_path: Path, splade_path: Path) -> None:
    """40 requests of 16 inputs at once against a queue of 64 inputs, on a sparse model that
    takes 0.2 s more per batch (tests/slow_engine.py): some fit, the rest are refused."""
    cfg = tmp_path / "slow-sparse.toml"
    cfg.write_text(f'[[models]]\nname = "splade"\nmodel = "{splade_path}"\nbatch_size = 16\n')
    with RemoteServer(
        ["--config", str(cfg), "--max-queued-inputs", "64"],
        env={"OPENAI_COMPAT_TEST_BATCH_SECONDS": "0.2"},
        slow_engine=True,
    ) as srv:
        body = {"model": "splade", "input": TEXTS[:2] * 8, "top_k": 4}

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=120) as client:
                return list(
                    await asyncio.gather(
                        *[client.post("/embeddings", json=body) for _ in range(40)]
                    )
                )

        responses = asyncio.run(burst())
        statuses = [r.status_code for r in responses]
        assert set(statuses) <= {200, 429}
        assert statuses.count(200) >= 4 and statuses.count(429) >= 20, statuses
        ok = next(r for r in responses if r.status_code == 200).json()
        assert len(ok["data"]) == 16 and len(ok["data"][0]["embedding"]["indices"]) == 4
        after = _post(srv, "/v1/embeddings", body)
        assert after.status_code == 200  # served normally once the burst is over
        for mine, theirs in zip(after.json()["data"], ok["data"], strict=True):
            _assert_same(_sparse(mine["embedding"]), _sparse(theirs["embedding"]))
