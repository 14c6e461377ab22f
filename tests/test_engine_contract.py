"""InfinityEngine's contract with the installed infinity-emb: every internal it reads is
there, for every kind of model, and a moved attribute fails loudly by name.

When an infinity-emb upgrade breaks this test, openai_compat/engine/infinity/internals.py is
the one file to change.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("infinity_emb")  # its own environment: requirements/infinity.txt

from openai_compat.engine.infinity import hooks as infinity_hooks
from openai_compat.engine.infinity import internals
from openai_compat.engine.infinity.engine import InfinityEngine
from openai_compat.engine.infinity.internals import EngineContractError
from openai_compat.engine.usage import engine_token_count

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PRIVATE = re.compile(
    r"\._(batch_handler|queue_prio|push_task|model_replicas|pipe|infinity_tokenizer)\b"
)


def test_no_module_but_infinity_internals_reads_engine_internals() -> None:
    internals = ROOT / "openai_compat" / "engine" / "infinity" / "internals.py"
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "openai_compat").rglob("*.py")
        if path != internals and PRIVATE.search(path.read_text())
    ]
    assert offenders == []


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory, minilm_path: str) -> dict[str, str]:
    """An (untrained) cross-encoder and classifier with MiniLM's shape; a tiny CLIP."""
    from transformers import AutoTokenizer, BertForSequenceClassification

    from tests.fixtures.tiny_media import build_clip

    root = tmp_path_factory.mktemp("contract")
    out = {"embedder": minilm_path}
    for kind, labels in (("crossencoder", {0: "LABEL_0"}), ("classifier", {0: "no", 1: "yes"})):
        model = BertForSequenceClassification.from_pretrained(
            minilm_path, num_labels=len(labels), id2label=labels
        )
        model.save_pretrained(root / kind)
        AutoTokenizer.from_pretrained(minilm_path).save_pretrained(root / kind)
        out[kind] = str(root / kind)
    out["clip"] = str(build_clip(root / "clip"))
    return out


def _engine(path: str, engine: str = "torch") -> InfinityEngine:
    from infinity_emb import AsyncEmbeddingEngine, EngineArgs

    inner = AsyncEmbeddingEngine.from_args(
        EngineArgs(model_name_or_path=path, engine=engine, model_warmup=False, device="cpu")
    )
    return InfinityEngine(inner, engine)


@pytest.fixture(scope="module")
def engines(model_dirs: dict[str, str]) -> Iterator[dict[str, Any]]:
    built = {kind: _engine(path) for kind, path in model_dirs.items()}
    built["other"] = _engine("debug/engine", "debugengine")
    loop = asyncio.new_event_loop()
    for e in built.values():
        loop.run_until_complete(e.astart())
    built["_loop"] = loop
    yield built
    for kind, e in built.items():
        if kind != "_loop":
            loop.run_until_complete(e.astop())
    loop.close()


EXPECTED_LIMITS = {"embedder": 256, "crossencoder": 512, "classifier": 512, "clip": 77}


@pytest.mark.parametrize("kind", ["embedder", "crossencoder", "classifier", "clip", "other"])
def test_every_internal_is_there_for_every_kind(engines: dict[str, Any], kind: str) -> None:
    engine = engines[kind]
    assert engine.contract_problems() == []
    assert engine.kind == kind
    assert engine.queue_length() == 0
    assert engine.is_running
    if kind == "other":
        assert engine.max_length() is None
        with pytest.raises(ValueError, match="cannot be applied"):
            engine.apply_max_length(16)
        return
    assert engine.tokenizer() is not None
    # infinity-emb's defaults corrected where needed (CLIP: 77, not the generation default 20)
    engine.apply_max_length(None)
    assert engine.max_length() == EXPECTED_LIMITS[kind]
    engine.apply_max_length(24)
    assert engine.max_length() == 24
    with pytest.raises(ValueError, match="more than this model takes"):
        engine.apply_max_length(100_000)
    runner = engine.logits_runner()
    assert (runner is not None) == (kind == "classifier")
    if runner is not None:
        rows = engines["_loop"].run_until_complete(runner.logits(["a text"]))
        assert {row["label"] for row in rows[0]} == {"no", "yes"}
        runner.close()


def test_a_moved_attribute_is_reported_by_name() -> None:
    class CrossEncoderPatched:  # what infinity-emb names it, without its tokenizer
        pass

    with pytest.raises(EngineContractError, match=r"CrossEncoderPatched\.tokenizer is gone"):
        internals.hf_tokenizer(CrossEncoderPatched())

    class Engine:
        is_running = True
        _model_replicas: list[Any] = []

    assert "no model replicas" in internals.contract_problems(Engine())[0]

    class Handler:
        pass

    class Started(Engine):
        _model_replicas = [object()]
        _batch_handler = Handler()

    problems = internals.contract_problems(Started())
    assert any("BatchHandler._queue_prio is gone" in p for p in problems)
    assert any("BatchHandler._push_task is gone" in p for p in problems)


@pytest.mark.parametrize("kind", ["embedder", "crossencoder", "classifier", "clip", "other"])
def test_the_engine_counts_tokens_where_it_can(engines: dict[str, Any], kind: str) -> None:
    engine, loop = engines[kind], engines["_loop"]
    installed = infinity_hooks.count_tokens_in_engine(engine.replica)
    assert installed == (kind == "embedder")
    if not installed:
        return
    engine.apply_max_length(256)
    texts = ["hello world", "word " * 400, ""]
    vectors, _ = loop.run_until_complete(engine.embed(texts))
    # [CLS] hello world [SEP]; the long one truncated at 256; "" is [CLS] [SEP]
    assert [v.tokens for v in vectors] == [4, 256, 2]
    assert engine_token_count(vectors) == 262
    assert engine_token_count([*vectors, vectors[0].view(type(vectors[0]).__base__)]) is None
