"""BGE-M3's three outputs and its scores (engine/bge_m3.py) against FlagEmbedding's own
BGEM3FlagModel on a tiny random BGE-M3 folder (models/demo_m3.py): dense, lexical weights and
ColBERT vectors from one forward pass of the library's model, to 1e-5; the dense, sparse,
ColBERT and hybrid scores of query/document pairs, to 1e-5. FlagEmbedding runs in an
environment of its own, in a subprocess (tests/reference/flag.py). The served routes:
test_e2e_bge_m3.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from openai_compat.engine import bge_m3
from openai_compat.models.demo_m3 import build_bge_m3
from tests.reference.flag import flag_reference

# repeated words (a token id's largest weight is kept), an unknown word (<unk> is dropped),
# lengths that pad one another in a batch
TEXTS = [
    "the man is eating food and the man is happy",
    "zzz the cat sleeps",
    "paris is the capital of france",
    "stock prices fell",
]
PAIRS = [
    ("what is the capital of france", "paris is the capital of france"),
    ("what is the capital of france", "the stock market crashed"),
    ("a man eating bread", "the man is eating food and the man is happy"),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bge_m3(tmp_path_factory.mktemp("m3") / "bge-m3")


@pytest.fixture(scope="module")
def reference(folder: Path) -> dict[str, Any]:
    return flag_reference(folder, TEXTS, PAIRS)


@pytest.fixture(scope="module")
def ours(folder: Path) -> tuple[list[bge_m3.M3Output], Any]:
    """The library's model on the folder, one forward of the whole padded batch, and our heads
    on its last hidden state."""
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    heads = bge_m3.M3Heads.load(folder, model.tokenizer, model.get_embedding_dimension())
    features = model.preprocess(TEXTS)
    with torch.inference_mode():
        out = model(dict(features))
    asked = [frozenset(bge_m3.OUTPUTS)] * len(TEXTS)
    made = heads.outputs(
        out["token_embeddings"], out["attention_mask"], features["input_ids"], asked
    )
    return made, out["sentence_embedding"].numpy()


def test_a_folder_with_both_heads_is_bge_m3(folder: Path, tmp_path: Path) -> None:
    assert bge_m3.is_bge_m3(folder)
    (tmp_path / "sparse_linear.pt").write_bytes((folder / "sparse_linear.pt").read_bytes())
    assert not bge_m3.is_bge_m3(tmp_path)  # one head: not BGE-M3


def test_dense_sparse_and_colbert_equal_flagembeddings(
    ours: tuple[list[bge_m3.M3Output], Any], reference: dict[str, Any]
) -> None:
    made, library_dense = ours
    dense = np.stack([m.dense for m in made])
    np.testing.assert_allclose(dense, reference["dense"], atol=1e-5)
    np.testing.assert_allclose(dense, library_dense, atol=1e-6)  # the library's dense path
    for m, want in zip(made, reference["sparse"], strict=True):
        assert m.sparse is not None
        got = {
            str(int(i)): float(v) for i, v in zip(m.sparse.indices, m.sparse.values, strict=True)
        }
        assert got.keys() == want.keys()
        np.testing.assert_allclose([got[k] for k in want], list(want.values()), atol=1e-5)
    assert all("3" not in w for w in reference["sparse"])  # <unk> (id 3) dropped by both
    for m, want in zip(made, reference["colbert"], strict=True):
        assert m.multivector is not None
        np.testing.assert_allclose(m.multivector, want, atol=1e-5)
    assert [m.tokens for m in made] == [12, 6, 8, 5]  # <s> ... </s>


def test_scores_equal_flagembeddings_compute_score(folder: Path, reference: dict[str, Any]) -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    heads = bge_m3.M3Heads.load(folder, model.tokenizer, model.get_embedding_dimension())

    def outputs(texts: list[str]) -> list[bge_m3.M3Output]:
        features = model.preprocess(texts)
        with torch.inference_mode():
            out = model(dict(features))
        asked = [frozenset(bge_m3.OUTPUTS)] * len(texts)
        return heads.outputs(
            out["token_embeddings"], out["attention_mask"], features["input_ids"], asked
        )

    queries, docs = outputs([q for q, _ in PAIRS]), outputs([d for _, d in PAIRS])
    want = reference["scores"]
    for i, (q, d) in enumerate(zip(queries, docs, strict=True)):
        assert q.dense is not None and d.dense is not None
        assert q.sparse is not None and d.sparse is not None
        assert q.multivector is not None and d.multivector is not None
        assert bge_m3.dense_score(q.dense, d.dense) == pytest.approx(want["dense"][i], abs=1e-5)
        assert bge_m3.sparse_score(q.sparse, d.sparse) == pytest.approx(want["sparse"][i], abs=1e-5)
        got = bge_m3.colbert_score(q.multivector, d.multivector)
        assert got == pytest.approx(want["colbert"][i], abs=1e-5)
        hybrid = bge_m3.hybrid_score(q, d)
        assert hybrid == pytest.approx(want["colbert+sparse+dense"][i], abs=1e-5)
    assert len({round(s, 4) for s in want["colbert+sparse+dense"]}) == len(PAIRS)  # distinct


def test_only_what_is_asked_is_computed(folder: Path) -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    heads = bge_m3.M3Heads.load(folder, model.tokenizer, model.get_embedding_dimension())
    features = model.preprocess(TEXTS[:2])
    with torch.inference_mode():
        out = model(dict(features))
    asked = [frozenset({"dense"}), frozenset({"sparse", "multivector"})]
    first, second = heads.outputs(
        out["token_embeddings"], out["attention_mask"], features["input_ids"], asked
    )
    assert first.dense is not None and first.sparse is None and first.multivector is None
    assert second.dense is None and second.sparse is not None and second.multivector is not None


def test_a_damaged_head_is_an_error_naming_its_file(folder: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    (tmp_path / "sparse_linear.pt").write_bytes(b"not a checkpoint")
    (tmp_path / "colbert_linear.pt").write_bytes((folder / "colbert_linear.pt").read_bytes())
    with pytest.raises(bge_m3.HeadError, match=r"sparse_linear\.pt"):
        bge_m3.M3Heads.load(tmp_path, tokenizer, 32)
    (tmp_path / "sparse_linear.pt").write_bytes((folder / "sparse_linear.pt").read_bytes())
    with pytest.raises(
        bge_m3.HeadError, match=r"sparse_linear\.pt cannot be loaded: its weight is \[1, 32\]"
    ):
        bge_m3.M3Heads.load(tmp_path, tokenizer, 64)  # heads for another width


def test_outputs_travel_between_ray_processes_whole(
    ours: tuple[list[bge_m3.M3Output], Any],
) -> None:
    """serve --ray: a replica's M3Outputs reach the ingress as they were (pack, Ray's pickle,
    unpack), their token counts with them."""
    import pickle

    from openai_compat.ray_serve.remote import pack, unpack

    made, _ = ours
    back = unpack(pickle.loads(pickle.dumps(pack(made))))
    for got, want in zip(back, made, strict=True):
        assert got.tokens == want.tokens
        assert got.dense is not None and want.dense is not None
        np.testing.assert_array_equal(got.dense, want.dense)
        assert got.sparse is not None and want.sparse is not None
        np.testing.assert_array_equal(got.sparse.indices, want.sparse.indices)
        np.testing.assert_array_equal(got.sparse.values, want.sparse.values)
        np.testing.assert_array_equal(got.multivector, want.multivector)


def test_requests_asking_different_outputs_share_one_forward_pass(
    folder: Path, ours: tuple[list[bge_m3.M3Output], Any], tmp_path: Path
) -> None:
    """The native engine: a dense request and a sparse + ColBERT one, queued while the forward
    thread is held, run as one batch, and each gets what it asked (equal to the heads on the
    library's own forward)."""
    import asyncio
    import threading

    from openai_compat.engine import native
    from openai_compat.frame.settings import ModelConfig

    config = ModelConfig(model=str(folder), name="m", device="cpu", dtype="float32")
    engine = native.load(config, 1, tmp_path)
    assert engine.outputs() == bge_m3.OUTPUTS and engine.scheduler.lanes == 1
    entered, release = threading.Event(), threading.Event()
    batches: list[list[frozenset[str] | None]] = []
    inner = engine.runner.run

    def held(rows: Any) -> Any:
        if not batches:
            entered.set()
            release.wait(10)
        batches.append([r.outputs for r in rows])
        return inner(rows)

    engine.runner.run = held  # type: ignore[method-assign]
    asked = frozenset({"sparse", "multivector"})

    async def work() -> Any:
        await engine.astart()
        try:
            first = asyncio.create_task(engine.embed(["a first text holds the thread"]))
            await asyncio.to_thread(entered.wait, 10)
            dense = asyncio.create_task(engine.embed([TEXTS[0]]))
            both = asyncio.create_task(engine.embed(TEXTS[1:3], outputs=asked))
            for _ in range(500):  # both queued behind the held batch
                if engine.scheduler.waiting() == 3:
                    break
                await asyncio.sleep(0.01)
            release.set()
            return await asyncio.gather(first, dense, both)
        finally:
            await engine.astop()

    _, (dense, _), (outputs, tokens) = asyncio.run(work())
    assert len(batches) == 2  # the held one, then one batch of the three rows
    assert sorted(batches[1], key=str) == sorted([None, asked, asked], key=str)
    made, library_dense = ours
    np.testing.assert_allclose(dense[0], library_dense[0], atol=1e-6)
    for got, want in zip(outputs, made[1:3], strict=True):
        assert got.dense is None and got.sparse is not None and got.multivector is not None
        assert want.sparse is not None
        np.testing.assert_array_equal(got.sparse.indices, want.sparse.indices)
        np.testing.assert_allclose(got.sparse.values, want.sparse.values, atol=1e-6)
        np.testing.assert_allclose(got.multivector, want.multivector, atol=1e-6)
    assert tokens == 6 + 8


def test_the_dtype_check_judges_all_three_outputs(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dtype = "auto" on a bf16 CPU: a BGE-M3 model is kept in bfloat16 only where its dense,
    sparse and ColBERT outputs each rank as in float32 on the probe set."""
    import dataclasses

    from openai_compat.engine import native, precision, probes
    from openai_compat.formats.sparse import SparseVector
    from openai_compat.frame.settings import ModelConfig

    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    engine = native.load(ModelConfig(model=str(folder), name="m", device="cpu"), 1, tmp_path)
    verdict = engine.precision()
    assert verdict is not None
    check = verdict["check"]
    assert set(check["outputs"]) == {"dense", "sparse", "multivector"}
    assert check["probes"] == len(probes.QUERIES) + len(probes.PASSAGES)
    assert check["passed"] == all(p["passed"] for p in check["outputs"].values())
    assert check["min_cosine"] == min(p["min_cosine"] for p in check["outputs"].values())
    # the dtype applied is the verdict's (this machine's bf16 passes all three: 0.9996 and up)
    want = "bfloat16" if check["passed"] else "float32"
    assert verdict["dtype"] == want
    assert str(next(engine.model[0].parameters()).dtype) == f"torch.{want}"

    # the same readings, the lexical weights' order reversed: the sparse part alone fails
    heads = engine.runner.m3
    assert heads is not None
    engine.model[0] = engine.model[0].float()
    want = bge_m3.probe(engine.model, heads)
    shuffled = [
        dataclasses.replace(
            o, sparse=SparseVector(o.sparse.indices, o.sparse.values[::-1].copy(), o.tokens)
        )
        if o.sparse is not None
        else o
        for o in want
    ]
    failed = bge_m3.judge(want, shuffled)
    assert not failed["passed"]
    assert [k for k, p in failed["outputs"].items() if not p["passed"]] == ["sparse"]
    assert bge_m3.judge(want, want)["passed"]
