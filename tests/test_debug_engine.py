"""The model-free engine on the native engine (engine/debug.py): infinity-emb's debugengine
answers, through our scheduler, chosen wherever infinity-emb is not installed. Runs in both CI
environments; where infinity-emb is installed its DummyTransformer is the reference."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from openai_compat.engine import build, infinity, native
from openai_compat.engine.debug import DebugRunner
from openai_compat.frame import model_config
from tests.utils import record_batches

TEXTS = ["abc", "hello", "", "a longer sentence of some words", *(f"t{i}" * i for i in range(20))]


def _config(**kw: Any) -> Any:
    base = dict(engine="debugengine", served_name="debug", batch_size=32, max_batch_tokens=16384)
    return SimpleNamespace(**{**base, **kw})


def _embed_all(engine: native.NativeEngine, groups: list[list[str]]) -> list[Any]:
    async def main() -> list[Any]:
        await engine.astart()
        try:  # callers at once: their inputs share batches
            return list(await asyncio.gather(*(engine.embed(g) for g in groups)))
        finally:
            await engine.astop()

    return asyncio.run(main())


def test_vectors_and_usage_are_infinitys_debugengine() -> None:
    engine = native.load(_config(), threads=1)
    assert isinstance(engine.runner, DebugRunner) and engine.capabilities == {"embed"}
    groups = [TEXTS[i : i + 3] for i in range(0, len(TEXTS), 3)]
    answers = _embed_all(engine, groups)
    for group, (vectors, usage) in zip(groups, answers, strict=True):
        assert usage == sum(len(t) for t in group)  # characters, as infinity-emb counts them
        for text, vector in zip(group, vectors, strict=True):
            np.testing.assert_array_equal(vector, np.full(13, float(len(text))))
            assert vector.tokens == len(text)
    assert engine.scheduler.stats.inputs == len(TEXTS)


def test_the_same_numbers_as_infinity_embs_dummy_transformer() -> None:
    dummy = pytest.importorskip("infinity_emb.transformer.embedder.dummytransformer")
    theirs = dummy.DummyTransformer.encode_core(None, np.asarray(TEXTS))
    ((ours, _),) = _embed_all(native.load(_config(), threads=1), [TEXTS])
    np.testing.assert_array_equal(np.stack(ours), theirs)


def test_the_token_budget_applies_to_character_counts() -> None:
    engine = native.load(_config(max_batch_tokens=20), threads=1)
    batches = record_batches(engine)
    texts = ["x" * 10] * 6
    ((vectors, _),) = _embed_all(engine, [texts])
    assert batches == [[10, 10]] * 3 and len(vectors) == 6


def test_debugengine_and_torch_are_native_exactly_where_infinity_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default install has no infinity-emb: configurations naming its engine "torch"
    (the old default) or "debugengine" run natively; its other engines are its alone."""
    monkeypatch.setattr(infinity, "installed", lambda: False)
    for engine in ("debugengine", "native", "torch"):
        assert build.runs_natively(engine), engine
    assert not build.runs_natively("optimum")
    assert build.engine_package(["debugengine", "torch"]) == "sentence_transformers"
    monkeypatch.setattr(infinity, "installed", lambda: True)
    assert not build.runs_natively("debugengine")
    assert not build.runs_natively("torch")
    assert build.runs_natively("native")
    assert build.engine_package(["debugengine", "native"]) == "infinity_emb"


def test_backend_engine_names_are_the_native_engine_with_that_backend() -> None:
    config = model_config.ModelConfig(model="m", engine="openvino", quantize="int8")
    assert (config.engine, config.backend, config.quantize) == ("native", "openvino", "int8")
    assert model_config.ModelConfig(model="m").engine == "native"  # the default
    with pytest.raises(ValueError, match="engine = 'onnx' means backend = 'onnx'"):
        model_config.ModelConfig(model="m", engine="onnx", backend="openvino")


def test_inputs_the_models_preparation_refuses_are_a_400(monkeypatch: pytest.MonkeyPatch) -> None:
    """#61.4: a VLM's processor refusing a pair (transformers' "Mismatch in `image` token
    count") reached the client as a 500 with a traceback; preparing is the inputs' alone."""
    from openai_compat.ground.errors import BadRequest
    from openai_compat.inference.embed import engine_errors

    engine = native.load(_config(), threads=1)

    def refuse(*_: Any, **__: Any) -> Any:
        raise ValueError("Mismatch in `image` token count between text and `input_ids`")

    monkeypatch.setattr(engine.runner, "prepare", refuse)

    async def main() -> None:
        await engine.astart()
        try:
            with pytest.raises(BadRequest) as caught, engine_errors():
                await engine.embed(["a page"])
        finally:
            await engine.astop()
        assert caught.value.status == 400 and caught.value.code == "invalid_input"
        assert "could not prepare these inputs: Mismatch in `image` token count" in str(
            caught.value.message
        )

    asyncio.run(main())
