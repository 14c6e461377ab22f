"""The engine adapter's contract with the installed infinity-emb: every internal it reads is
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

from openai_compat.engine import adapter
from openai_compat.engine.adapter import EngineContractError
from openai_compat.engine.infinity import hooks as infinity_hooks

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


def _engine(path: str, engine: str = "torch") -> Any:
    from infinity_emb import AsyncEmbeddingEngine, EngineArgs

    return AsyncEmbeddingEngine.from_args(
        EngineArgs(model_name_or_path=path, engine=engine, model_warmup=False, device="cpu")
    )


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
    assert adapter.contract_problems(engine) == []
    replica = adapter.replica_of(engine)
    assert adapter.kind_of(replica) == kind
    assert adapter.queue_length(engine) == 0
    assert adapter.batcher_alive(engine)
    if kind == "other":
        assert adapter.applied_max_length(replica) is None
        with pytest.raises(ValueError, match="cannot be applied"):
            adapter.apply_max_length(replica, 16)
        return
    assert adapter.backend_tokenizer(replica) is not None
    # infinity-emb's defaults corrected where needed (CLIP: 77, not the generation default 20)
    assert adapter.apply_max_length(replica, None) == EXPECTED_LIMITS[kind]
    assert adapter.apply_max_length(replica, 24) == 24 == adapter.applied_max_length(replica)
    with pytest.raises(ValueError, match="more than this model takes"):
        adapter.apply_max_length(replica, 100_000)
    runner = infinity_hooks.LogitsRunner.for_replica(replica, kind)
    assert (runner is not None) == (kind == "classifier")
    if runner is not None:
        rows = engines["_loop"].run_until_complete(runner.logits(["a text"]))
        assert {row["label"] for row in rows[0]} == {"no", "yes"}
        runner.close()


def test_a_moved_attribute_is_reported_by_name() -> None:
    class CrossEncoderPatched:  # what infinity-emb names it, without its tokenizer
        pass

    with pytest.raises(EngineContractError, match=r"CrossEncoderPatched\.tokenizer is gone"):
        adapter.hf_tokenizer(CrossEncoderPatched())

    class Engine:
        is_running = True
        _model_replicas: list[Any] = []

    assert "no model replicas" in adapter.contract_problems(Engine())[0]

    class Handler:
        pass

    class Started(Engine):
        _model_replicas = [object()]
        _batch_handler = Handler()

    problems = adapter.contract_problems(Started())
    assert any("BatchHandler._queue_prio is gone" in p for p in problems)
    assert any("BatchHandler._push_task is gone" in p for p in problems)


@pytest.mark.parametrize("kind", ["embedder", "crossencoder", "classifier", "clip", "other"])
def test_the_engine_counts_tokens_where_it_can(engines: dict[str, Any], kind: str) -> None:
    engine, loop = engines[kind], engines["_loop"]
    replica = adapter.replica_of(engine)
    installed = infinity_hooks.count_tokens_in_engine(replica)
    assert installed == (kind == "embedder")
    if not installed:
        return
    adapter.apply_max_length(replica, 256)
    texts = ["hello world", "word " * 400, ""]
    vectors, _ = loop.run_until_complete(engine.embed(texts))
    # [CLS] hello world [SEP]; the long one truncated at 256; "" is [CLS] [SEP]
    assert [v.tokens for v in vectors] == [4, 256, 2]
    assert adapter.engine_token_count(vectors) == 262
    assert (
        adapter.engine_token_count([*vectors, vectors[0].view(type(vectors[0]).__base__)]) is None
    )
