"""The native engine (engine/native.py) on sentence-transformers 6: every kind it serves equals
the library's own computation (1e-5), in-process and through a real server process.

Needs the new stack (sentence-transformers >= 6, transformers >= 5.3), which infinity-emb's
pins keep out of the default environment: CI runs this module in a venv of its own
(`.ci/run`, requirements/native.txt); elsewhere it is skipped.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import numpy as np
import pytest

st = pytest.importorskip("sentence_transformers")
if int(st.__version__.split(".")[0]) < 6:
    pytest.skip("the native engine needs sentence-transformers >= 6", allow_module_level=True)

from openai_compat.engine import native  # noqa: E402
from openai_compat.engine.usage import TokenIds  # noqa: E402
from openai_compat.frame.model_config import ModelConfig  # noqa: E402
from tests.utils import RemoteServer, record_batches  # noqa: E402

TEXTS = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The stock market crashed today.",
    *(f"sentence {i} " + "word " * (i % 13) for i in range(45)),
]


def config(source: Path | str, **kw: Any) -> ModelConfig:
    """A model's configuration as the server builds it (its validators included)."""
    # float32: the library's own computation is the reference (precision.py's policy aside)
    base: dict[str, Any] = dict(
        model=str(source), name="m", device="cpu", batch_size=8, dtype="float32"
    )
    return ModelConfig(**{**base, **kw})


def tiny_cross_encoder(minilm: str, out: Path, labels: int) -> Path:
    """A small randomly initialised BERT classifier on MiniLM's vocabulary (seeded)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(labels)
    tokenizer = AutoTokenizer.from_pretrained(minilm)
    cfg = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=labels,
        id2label={i: f"class-{i}" for i in range(labels)},
        label2id={f"class-{i}": i for i in range(labels)},
    )
    model = BertForSequenceClassification(cfg).eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def models(
    tmp_path_factory: pytest.TempPathFactory,
    minilm_path: str,
    splade_path: Path,
    tiny_media_models: dict[str, Path],
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("native")
    colbert = root / "colbert"
    shutil.copytree(minilm_path, colbert)
    cfg = json.loads((colbert / "config.json").read_text())
    cfg["architectures"] = ["HF_ColBERT"]
    (colbert / "config.json").write_text(json.dumps(cfg))
    return {
        "minilm": Path(minilm_path),
        "reranker": tiny_cross_encoder(minilm_path, root / "reranker", 1),
        "classifier": tiny_cross_encoder(minilm_path, root / "classifier", 3),
        "colbert": colbert,
        "splade": splade_path,
        **tiny_media_models,
    }


def run(engine: native.NativeEngine, work: Any) -> Any:
    async def main() -> Any:
        await engine.astart()
        try:
            return await work()
        finally:
            await engine.astop()

    return asyncio.run(main())


def test_embeddings_equal_the_librarys_encode_with_counts_and_norms(
    models: dict[str, Path],
) -> None:
    engine = native.load(config(models["minilm"]), threads=2)
    reference = engine.model.encode(TEXTS, normalize_embeddings=False)
    tokenizer = engine.model.tokenizer

    async def work() -> Any:  # many callers at once: their inputs share batches
        return await asyncio.gather(*(engine.embed(TEXTS[i : i + 5]) for i in range(0, 48, 5)))

    answers = run(engine, work)
    vectors = [v for vs, _ in answers for v in vs]
    got = np.stack([np.asarray(v) * v.norm for v in vectors])  # back to the raw output
    assert np.max(np.abs(got - reference)) < 1e-5
    unit = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    assert np.max(np.abs(np.stack(vectors) - unit)) < 1e-5
    counts = [len(tokenizer(t)["input_ids"]) for t in TEXTS]
    assert [v.tokens for v in vectors] == counts
    assert [u for _, u in answers] == [sum(counts[i : i + 5]) for i in range(0, 48, 5)]
    assert float(vectors[0] @ vectors[1]) == pytest.approx(0.7553, abs=1e-4)
    stats = engine.scheduler.stats
    assert stats.inputs == len(TEXTS) and stats.batches >= len(TEXTS) // 8


def test_token_ids_are_embedded_as_given(models: dict[str, Path]) -> None:
    engine = native.load(config(models["minilm"]), threads=1)
    ids = engine.model.tokenizer(TEXTS[0])["input_ids"]
    cut = ids[:4]  # ids no tokenizer would make from any text: [CLS] a man is

    async def work() -> Any:
        return await engine.embed([TokenIds("x", ids), TokenIds("y", cut), TEXTS[1]])

    (whole, part, text), tokens = run(engine, work)
    ref = engine.model.encode([TEXTS[0], TEXTS[1]], normalize_embeddings=True)
    assert np.max(np.abs(whole - ref[0])) < 1e-5 and np.max(np.abs(text - ref[1])) < 1e-5
    assert part.tokens == 4 and tokens == len(ids) + 4 + text.tokens
    assert float(part @ whole) < 0.99  # the cut ids were embedded, not the text


def test_the_forward_thread_uses_the_threads_it_is_given(models: dict[str, Path]) -> None:
    import torch

    engine = native.load(config(models["minilm"]), threads=1)
    seen: list[tuple[str, int]] = []
    inner = engine.runner.run

    def spy(rows: Any) -> Any:
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return inner(rows)

    engine.runner.run = spy  # type: ignore[method-assign]
    run(engine, lambda: engine.embed(TEXTS[:3]))
    assert seen == [("forward-m-0", 1)]


def test_forward_lanes_follow_the_setting(models: dict[str, Path]) -> None:
    """forward_lanes: by default two lanes on two CPUs (torch on the CPU), one on one CPU or
    with compile; a number given is kept (its forward threads start), and more lanes than
    CPUs run a thread each; OpenVINO's export or a compiled forward refuses more than one."""
    from pydantic import ValidationError

    def lane_threads(engine: native.NativeEngine) -> list[str]:
        async def names() -> list[str]:
            return sorted(t.name for t in threading.enumerate() if t.name.startswith("forward-m"))

        return cast(list[str], run(engine, names))

    minilm = models["minilm"]
    two = native.load(config(minilm), threads=2)
    assert lane_threads(two) == ["forward-m-0", "forward-m-1"] and two.scheduler.narrow == 1
    assert native.load(config(minilm), threads=1).scheduler.lanes == 1
    assert native.load(config(minilm, compile=True), threads=2).scheduler.lanes == 1
    one = native.load(config(minilm, forward_lanes=1), threads=2)
    assert lane_threads(one) == ["forward-m-0"]
    three = native.load(config(minilm, forward_lanes=3), threads=2)
    assert len(lane_threads(three)) == 3 and three.scheduler.narrow == 1
    for refused in ({"backend": "openvino"}, {"compile": True}):
        with pytest.raises(ValidationError, match="forward_lanes > 1 needs backend"):
            config(minilm, forward_lanes=2, **refused)
    assert config(minilm, forward_lanes=2, backend="onnx").forward_lanes == 2


def test_torchs_thread_count_is_per_thread_once_the_thread_has_read_it() -> None:
    """What the lanes rely on (text.TextRunner.on_thread), pinned on the installed torch: two
    threads set 1 and 2 and each keeps its own; a thread that set its count before ever
    reading it is reset to the other's on its first read."""
    import torch

    def counts(read_first: bool) -> dict[int, int]:
        barrier, out = threading.Barrier(2, timeout=10), {}
        ready = threading.Event()

        def lane(n: int) -> None:
            if read_first:
                torch.get_num_threads()
            if n == 2:
                ready.wait(10)  # set after the other: the global count ends at 2
            torch.set_num_threads(n)
            if n == 1:
                ready.set()
            barrier.wait()
            out[n] = torch.get_num_threads()

        threads = [threading.Thread(target=lane, args=(n,)) for n in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    before = torch.get_num_threads()
    try:
        assert counts(read_first=True) == {1: 1, 2: 2}
        assert counts(read_first=False) == {1: 2, 2: 2}
    finally:
        torch.set_num_threads(before)


def test_two_lanes_run_on_their_own_thread_counts_and_equal_the_library(
    models: dict[str, Path],
) -> None:
    """Two CPUs: two forward lanes share the model. Each batch runs on the count its own lane
    gave torch (the count is per thread: without reading it first on each lane, the other
    lane's last choice would win), and the vectors equal the library's encode."""
    import torch

    engine = native.load(config(models["minilm"], batch_size=4), threads=2)
    assert engine.scheduler.lanes == 2
    given: dict[str, int] = {}
    seen: list[tuple[str, int, int]] = []
    inner_run, inner_set = engine.runner.run, engine.runner.set_threads

    def set_threads(count: int) -> None:
        given[threading.current_thread().name] = count
        inner_set(count)

    def spy(rows: Any) -> Any:
        name = threading.current_thread().name
        seen.append((name, given.get(name, 2), torch.get_num_threads()))
        return inner_run(rows)

    engine.runner.set_threads = set_threads  # type: ignore[method-assign]
    engine.runner.run = spy  # type: ignore[method-assign]

    async def work() -> list[Any]:
        calls = [engine.embed(TEXTS[i : i + 6]) for i in range(0, len(TEXTS), 6)]
        return [v for vectors, _ in await asyncio.gather(*calls) for v in vectors]

    vectors = run(engine, work)
    reference = engine.model.encode(TEXTS, normalize_embeddings=True)
    assert np.max(np.abs(np.stack(vectors) - reference)) < 1e-5
    assert [(lane, count) for lane, count, _ in seen] == [(lane, n) for lane, _, n in seen]
    assert {lane for lane, _, _ in seen} <= {"forward-m-0", "forward-m-1"}
    assert 1 in {n for _, _, n in seen}  # work was left: batches ran narrow, one thread each


def test_max_batch_tokens_bounds_every_batch(models: dict[str, Path]) -> None:
    engine = native.load(config(models["minilm"], batch_size=32, max_batch_tokens=64), 1)
    batches = record_batches(engine)
    vectors, _ = run(engine, lambda: engine.embed(TEXTS))
    assert sum(len(b) for b in batches) == len(TEXTS)
    assert all(len(b) == 1 or max(b) * len(b) <= 64 for b in batches)
    assert max(len(b) for b in batches) < 32  # the budget, not batch_size, cut them
    reference = engine.model.encode(TEXTS, normalize_embeddings=True)
    assert np.max(np.abs(np.stack(vectors) - reference)) < 1e-5


def test_pooling_method_and_late_chunking_read_the_librarys_pooling(
    models: dict[str, Path],
) -> None:
    """sentence-transformers 6 names a Pooling's mode in one attribute (3.x had a flag per
    mode, which 6 ignores): pooling_method = "cls" gives the CLS token's vector, and late
    chunking sees the mode it pools with."""
    from openai_compat.engine import late, pooling

    engine = native.load(config(models["minilm"]), threads=1)
    assert engine.pooling_mode() == late.pooling_mode(engine.model) == "mean"
    tokens = engine.model.encode(TEXTS[:3], output_value="token_embeddings")
    pooling.apply_pooling(engine.model, "cls", pooled=True)
    assert engine.pooling_mode() == "cls"
    vectors, _ = run(engine, lambda: engine.embed(TEXTS[:3]))
    cls = np.stack([t[0].float().numpy() for t in tokens])
    cls /= np.linalg.norm(cls, axis=1, keepdims=True)
    assert np.max(np.abs(np.stack(vectors) - cls)) < 1e-5


def test_rerank_equals_cross_encoder_predict(models: dict[str, Path]) -> None:
    engine = native.load(config(models["reranker"]), threads=2)
    assert engine.capabilities == {"rerank"}
    docs = TEXTS[1:20]
    expected = engine.model.predict([(TEXTS[0], d) for d in docs])  # sigmoid of the logit

    async def work() -> Any:
        return await engine.rerank(query=TEXTS[0], docs=docs)

    results, tokens = run(engine, work)
    assert [r.index for r in results] == list(range(len(docs)))
    assert np.max(np.abs(np.array([r.relevance_score for r in results]) - expected)) < 1e-5
    pair_tokens = engine.model.tokenizer([TEXTS[0]] * len(docs), docs)["input_ids"]
    assert tokens == sum(len(p) for p in pair_tokens)


def test_classify_equals_predict_softmax_and_logits_are_raw(models: dict[str, Path]) -> None:
    engine = native.load(config(models["classifier"]), threads=2)
    assert engine.capabilities == {"classify"}
    # predict takes a list as one input pair: single texts go one by one
    probs = np.stack([engine.model.predict(t, apply_softmax=True) for t in TEXTS[:10]])
    logits = engine.model.predict([(TEXTS[0], TEXTS[1])], activation_fn=torch_identity())

    async def work() -> Any:
        labelled, _ = await engine.classify(sentences=TEXTS[:10])
        raw = await engine.logits([{"text": TEXTS[0], "text_pair": TEXTS[1]}])
        return labelled, raw

    labelled, raw = run(engine, work)
    got = np.array([[d["score"] for d in row] for row in labelled])
    assert [d["label"] for d in labelled[0]] == ["class-0", "class-1", "class-2"]
    assert np.max(np.abs(got - probs)) < 1e-5
    assert np.max(np.abs(np.array([d["score"] for d in raw[0]]) - logits[0])) < 1e-5


def torch_identity() -> Any:
    import torch

    return torch.nn.Identity()


def test_colbert_style_models_give_their_token_vectors(models: dict[str, Path]) -> None:
    engine = native.load(config(models["colbert"]), threads=2)
    # an HF_ColBERT architecture (Stanford's checkpoints) is a MultiVectorEncoder, as the
    # library detects it; its document side by default
    assert type(engine.model).__name__ == "MultiVectorEncoder" and engine.modes
    reference = engine.model.encode_document(TEXTS[:6])

    async def work() -> Any:
        return await engine.embed(TEXTS[:6])

    vectors, _ = run(engine, work)
    for got, ref in zip(vectors, reference, strict=True):
        assert got.shape == tuple(ref.shape)
        assert np.max(np.abs(got - ref.numpy())) < 1e-5


def test_sparse_vectors_equal_the_sparse_encoders_encode(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from openai_compat.engine import text

    engine = native.load(config(models["splade"]), threads=2)
    assert engine.kind == "sparse" and engine.runner.sparse_size == 30522
    texts = [*TEXTS[:20], "word " * 300]
    reference = engine.model.encode(texts).to_dense().numpy()
    tokenizer = engine.model.tokenizer
    # A logits budget of 3 rows of the longest input: every forward pass is cut to it.
    longest = max(len(tokenizer(t, truncation=True)["input_ids"]) for t in texts)
    monkeypatch.setattr(text, "SPARSE_LOGITS_BUDGET", 3 * longest * 30522)
    passes: list[tuple[int, int]] = []  # rows, padded width
    inner = engine.runner._forward

    def spy(rows: Any) -> Any:
        passes.append((len(rows), max(r.length for r in rows)))
        return inner(rows)

    engine.runner._forward = spy  # type: ignore[method-assign]
    vectors, tokens = run(engine, lambda: engine.embed(texts))
    assert all(n * width <= 3 * longest for n, width in passes)
    assert sum(n for n, _ in passes) == len(texts) and max(n for n, _ in passes) > 3
    for got, want in zip(vectors, reference, strict=True):
        np.testing.assert_array_equal(got.indices, np.flatnonzero(want))
        np.testing.assert_allclose(got.values, want[got.indices], atol=1e-5, rtol=1e-5)
    counts = [len(tokenizer(t, truncation=True)["input_ids"]) for t in texts]
    assert [v.tokens for v in vectors] == counts and tokens == sum(counts)


def test_a_dense_folder_asked_for_sparse_is_refused_by_name(models: dict[str, Path]) -> None:
    # sentence-transformers would put a sparse auto-encoder over MiniLM: not SPLADE
    with pytest.raises(ValueError, match=r"needs a SPLADE model.*SparseAutoEncoder"):
        native.load(config(models["minilm"], kind="sparse"), threads=1)


def _images() -> list[Any]:
    from PIL import Image

    rng = np.random.default_rng(0)
    return [
        Image.fromarray((rng.random((30 + 7 * i, 50 - 3 * i, 3)) * 255).astype("uint8"))
        for i in range(6)
    ]


def test_clip_images_and_texts_equal_the_librarys_and_transformers(
    models: dict[str, Path],
) -> None:
    import torch
    from transformers import CLIPModel, CLIPProcessor

    engine = native.load(config(models["clip"]), threads=2)
    assert engine.kind == "clip" and engine.capabilities == {"embed", "image_embed"}
    images, texts = _images(), TEXTS[:5]
    modalities: list[set[str]] = []
    inner = engine.runner._forward

    def spy(rows: Any) -> Any:
        modalities.append({r.shared["modality"] for r in rows})
        return inner(rows)

    engine.runner._forward = spy  # type: ignore[method-assign]

    async def work() -> Any:  # images and texts queued together share batches, not passes
        return await asyncio.gather(
            engine.image_embed(images=images[:3]),
            engine.embed(texts),
            engine.image_embed(images=images[3:]),
        )

    (first, image_usage), (text_vectors, _), (rest, _) = run(engine, work)
    assert all(len(m) == 1 for m in modalities) and {"text", "image"} == set().union(*modalities)
    unit = lambda m: m / np.linalg.norm(m, axis=1, keepdims=True)  # noqa: E731
    assert np.max(np.abs(np.stack(first + rest) - unit(engine.model.encode(images)))) < 1e-5
    assert np.max(np.abs(np.stack(text_vectors) - unit(engine.model.encode(texts)))) < 1e-5
    assert image_usage == 3 * ((32 // 8) ** 2 + 1)  # a ViT's patches and its class token
    model = CLIPModel.from_pretrained(models["clip"]).eval()
    processor = CLIPProcessor.from_pretrained(models["clip"])
    with torch.no_grad():
        direct = model.get_image_features(**processor(images=images, return_tensors="pt"))
    assert np.max(np.abs(np.stack(first + rest) - unit(direct.pooler_output.numpy()))) < 1e-5


def test_clap_audio_equals_the_librarys_and_transformers(models: dict[str, Path]) -> None:
    import io

    import soundfile
    import torch
    from transformers import ClapModel, ClapProcessor

    from tests.media_samples import wav

    engine = native.load(config(models["clap"]), threads=2)
    assert engine.kind == "clap" and engine.sampling_rate == 16000
    clips = [wav(freq=f, seconds=s) for f, s in ((440.0, 0.5), (880.0, 1.0), (220.0, 0.25))]
    vectors, _ = run(engine, lambda: engine.audio_embed(audios=clips))
    samples = [soundfile.read(io.BytesIO(c), dtype="float32")[0] for c in clips]
    library = engine.model.encode([{"array": a, "sampling_rate": 16000} for a in samples])
    unit = library / np.linalg.norm(library, axis=1, keepdims=True)
    assert np.max(np.abs(np.stack(vectors) - unit)) < 1e-5
    model = ClapModel.from_pretrained(models["clap"]).eval()
    processor = ClapProcessor.from_pretrained(models["clap"])
    features = processor(audio=samples, sampling_rate=16000, return_tensors="pt", padding=True)
    with torch.no_grad():
        direct = model.get_audio_features(input_features=features["input_features"])
    own = direct.pooler_output.numpy()
    own = own / np.linalg.norm(own, axis=1, keepdims=True)
    assert np.max(np.abs(np.stack(vectors) - own)) < 1e-5


@pytest.mark.parametrize(
    ("backend", "quantize", "floor"),
    [
        ("onnx", None, 1e-5),
        ("onnx", "int8", 0.98),
        ("openvino", None, 1e-5),
        ("openvino", "int8", 0.98),
    ],
)
def test_exported_backends_serve_the_model_within_their_fidelity(
    models: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    backend: str,
    quantize: str | None,
    floor: float,
) -> None:
    """Our own export (engine/exported.py, no optimum) in place of the torch encoder: fp32
    equals encode within 1e-5, int8 keeps every probe over its floor; the export is made
    once, measured, and the next load takes it from the cache."""
    from openai_compat.engine import fidelity

    exports = tmp_path_factory.mktemp(f"exports-{backend}-{quantize}")
    options = dict(backend=backend, quantize=quantize)
    engine = native.load(config(models["minilm"], **options), threads=2, export_dir=exports)
    assert engine.torch_modules() == []  # the runtime holds the weights, not torch
    (folder,) = exports.glob("m-*")
    measured = fidelity.read(folder)
    assert measured is not None and measured["precision"] == ("int8" if quantize else "fp32")
    vectors, _ = run(engine, lambda: engine.embed(TEXTS))
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(models["minilm"]), device="cpu").encode(
        TEXTS, normalize_embeddings=True
    )
    got = np.stack(vectors)
    # ONNX Runtime's sessions are thread-safe: two lanes on two CPUs, as torch has
    assert engine.scheduler.lanes == (2 if backend == "onnx" else 1)
    if backend == "onnx" and quantize is None:
        onnx_sessions_follow_the_thread_count(config(models["minilm"], **options), exports)
    if quantize is None:
        assert np.max(np.abs(got - reference)) < floor
        assert measured["min_cosine"] >= 0.9999
    else:
        assert measured["min_cosine"] >= floor
        assert float(np.min(np.sum(got * reference, axis=1))) >= floor
        assert np.max(np.abs(got - reference)) > 1e-4  # it is the quantised graph that ran
    made = {p: p.stat().st_mtime_ns for p in folder.iterdir()}
    again = native.load(config(models["minilm"], **options), threads=1, export_dir=exports)
    assert list(exports.glob("m-*")) == [folder]
    assert {p: p.stat().st_mtime_ns for p in folder.iterdir()} == made  # not exported anew
    # the same batches (int8's activation scales are per batch: the same neighbours too)
    second, _ = run(again, lambda: again.embed(TEXTS))
    assert np.max(np.abs(np.stack(second) - got)) < 1e-5


def onnx_sessions_follow_the_thread_count(model: ModelConfig, exports: Path) -> None:
    """An ONNX export runs each batch on a session of the calling lane's thread count (torch's
    count on that thread, which the scheduler sets), each made once while the model loads: a
    lane side by side runs one thread, a lone batch the tuner's count; both answer the
    library's vectors."""
    import onnxruntime
    import torch

    made: list[int] = []
    real = onnxruntime.InferenceSession

    def spy(path: str, options: Any, **kw: Any) -> Any:
        made.append(options.intra_op_num_threads)
        return real(path, options, **kw)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(onnxruntime, "InferenceSession", spy)
        engine = native.load(model, threads=2, export_dir=exports)  # from the cache
        # every count the scheduler may give a batch, made while the model loads
        assert sorted(made) == [1, 2] and engine.scheduler.narrow == 1
        served = engine.runner.model  # the library's model, the export as its encoder
        features = served.preprocess(TEXTS)
        answers: dict[int, list[np.ndarray]] = {}

        def lane(count: int) -> None:
            torch.get_num_threads()  # a thread's first read resets its count (on_thread)
            torch.set_num_threads(count)
            for _ in range(2):
                with torch.inference_mode():
                    out = served(dict(features))["sentence_embedding"].numpy()
                answers.setdefault(count, []).append(out)

        for count in (1, 2, 1):
            thread = threading.Thread(target=lane, args=(count,))
            thread.start()
            thread.join()
        assert sorted(made) == [1, 2]  # none made again
    library = st.SentenceTransformer(model.source, device="cpu")
    with torch.inference_mode():
        expected = library(dict(features))["sentence_embedding"].numpy()
    assert sorted(answers) == [1, 2]
    for outs in answers.values():
        for out in outs:
            assert np.max(np.abs(out - expected)) < 1e-5


def test_exported_backends_refuse_what_is_not_a_text_embedder(
    models: dict[str, Path], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="serves text embedding models only"):
        native.load(config(models["reranker"], backend="onnx", quantize=None), 1, tmp_path)
    with pytest.raises(ValueError, match="serves text embedding models only"):
        native.load(config(models["clip"], backend="openvino", quantize=None), 1, tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing was exported


# ---------------------------------------------------------------- through a server process


@pytest.fixture(scope="module")
def server(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    toml = tmp_path_factory.mktemp("cfg") / "native.toml"
    toml.write_text(
        "".join(
            f'[[models]]\nmodel = "{models[n]}"\nname = "{n}"\nengine = "native"\n\n'
            for n in ("minilm", "reranker", "classifier", "splade", "clip", "clap")
        )
        + f'[[models]]\nmodel = "{models["minilm"]}"\nname = "minilm-onnx"\nengine = "native"\n'
        'backend = "onnx"\n'
    )
    # `openai-compat download` makes the ONNX export ahead of time; the server finds it.
    made = subprocess.run(
        [sys.executable, "-m", "openai_compat", "download", "--config", str(toml)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert made.returncode == 0, made.stderr
    assert "minilm-onnx: onnx export -> " in made.stdout
    assert "minilm-onnx: cosine to torch >= 1.0000 on 10 probes" in made.stdout
    with RemoteServer(["--config", str(toml)]) as srv:
        yield srv


@pytest.mark.slow
def test_a_server_on_the_native_engine_answers_every_kind(
    server: Any, models: dict[str, Path]
) -> None:
    import base64

    import openai
    from sentence_transformers import CrossEncoder, SentenceTransformer

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    got = client.embeddings.create(model="minilm", input=TEXTS[:20])
    reference = SentenceTransformer(str(models["minilm"]), device="cpu").encode(
        TEXTS[:20], normalize_embeddings=True
    )
    matrix = np.array([d.embedding for d in got.data], dtype=np.float32)
    assert np.max(np.abs(matrix - reference)) < 1e-5
    b64 = httpx.post(
        server.url + "/v1/embeddings",
        json={"model": "minilm", "input": TEXTS[0], "encoding_format": "base64"},
    ).json()["data"][0]["embedding"]
    assert np.max(np.abs(np.frombuffer(base64.b64decode(b64), "<f4") - reference[0])) < 1e-5
    exported = client.embeddings.create(model="minilm-onnx", input=TEXTS[:20])
    matrix = np.array([d.embedding for d in exported.data], dtype=np.float32)
    assert np.max(np.abs(matrix - reference)) < 1e-5  # ONNX Runtime ran it (exported.py)
    assert "exporting 'minilm-onnx'" not in server.output()  # download's export, reused

    docs = TEXTS[1:8]
    answer = httpx.post(
        server.url + "/v1/rerank",
        json={"model": "reranker", "query": TEXTS[0], "documents": docs},
    ).json()
    ranked = answer["results"]
    cross = CrossEncoder(str(models["reranker"]), device="cpu")
    expected = cross.predict([(TEXTS[0], d) for d in docs])
    # usage is the engine's own count of the pairs it tokenized (no second tokenizer pass)
    pairs = cross.tokenizer([TEXTS[0]] * len(docs), docs)["input_ids"]
    assert answer["usage"]["prompt_tokens"] == sum(len(p) for p in pairs)
    assert [r["index"] for r in ranked] == list(np.argsort(-expected, kind="stable"))
    for r in ranked:
        assert r["relevance_score"] == pytest.approx(float(expected[r["index"]]), abs=1e-5)

    classified = httpx.post(
        server.url + "/classify", json={"model": "classifier", "input": [TEXTS[2]]}
    )
    assert classified.status_code == 200, classified.text
    probs = CrossEncoder(str(models["classifier"]), device="cpu").predict(
        TEXTS[2], apply_softmax=True
    )
    scores = {d["label"]: d["score"] for d in classified.json()["data"][0]}
    assert classified.json()["usage"]["prompt_tokens"] == len(
        cross.tokenizer(TEXTS[2])["input_ids"]
    )
    for i, p in enumerate(probs):
        assert scores[f"class-{i}"] == pytest.approx(float(p), abs=1e-5)


@pytest.mark.slow
def test_a_server_on_the_native_engine_serves_sparse_image_and_audio_models(
    server: Any, models: dict[str, Path]
) -> None:
    import io

    import openai
    import soundfile
    from PIL import Image
    from sentence_transformers import SentenceTransformer, SparseEncoder

    from tests.media_samples import data_uri, png, wav

    listed = {m["id"]: m for m in httpx.get(server.url + "/v1/models").json()["data"]}
    assert "sparse" in listed["splade"]["capabilities"]
    assert {"image", "embed"} <= set(listed["clip"]["capabilities"])
    assert {"audio", "embed"} <= set(listed["clap"]["capabilities"])
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")

    sparse = client.embeddings.create(model="splade", input=TEXTS[:4], encoding_format="float")
    reference = SparseEncoder(str(models["splade"]), device="cpu").encode(TEXTS[:4])
    for item, want in zip(sparse.data, reference.to_dense().numpy(), strict=True):
        got: dict[str, Any] = item.embedding  # type: ignore[assignment]
        np.testing.assert_array_equal(got["indices"], np.flatnonzero(want))
        np.testing.assert_allclose(got["values"], want[got["indices"]], atol=1e-5, rtol=1e-5)

    clip = SentenceTransformer(str(models["clip"]), device="cpu")
    picture = png(41, 29)
    image = client.embeddings.create(
        model="clip", input=[data_uri(picture, "image/png")], extra_body={"modality": "image"}
    )
    want = clip.encode([Image.open(io.BytesIO(picture)).convert("RGB")])[0]
    got_image = np.asarray(image.data[0].embedding)
    assert np.max(np.abs(got_image - want / np.linalg.norm(want))) < 1e-5
    assert image.usage.prompt_tokens == (32 // 8) ** 2 + 1

    clap = SentenceTransformer(str(models["clap"]), device="cpu")
    tone = wav(freq=660.0)
    audio = client.embeddings.create(
        model="clap", input=[data_uri(tone, "audio/wav")], extra_body={"modality": "audio"}
    )
    samples = soundfile.read(io.BytesIO(tone), dtype="float32")[0]
    want = clap.encode([{"array": samples, "sampling_rate": 16000}])[0]
    got_audio = np.asarray(audio.data[0].embedding)
    assert np.max(np.abs(got_audio - want / np.linalg.norm(want))) < 1e-5
    text = client.embeddings.create(model="clap", input="a beep")
    want = clap.encode(["a beep"])[0]
    assert np.max(np.abs(np.asarray(text.data[0].embedding) - want / np.linalg.norm(want))) < 1e-5
