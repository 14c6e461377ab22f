"""An export's fidelity to the torch model (engine/fidelity.py): measured per probe alone and
in a batch, kept beside the export, and reported at load, as a warning under the floor; the
int8 recipes' fp32 layers; the runtimes' thread pools sized to our CPUs (engine/backends.py)."""

from __future__ import annotations

import logging
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from openai_compat.engine import backends, fidelity, int8
from openai_compat.ground import cpus


class FakeModel:
    """A sentence-transformers stand-in: fixed vectors per text, optionally bent for one
    text, and (like dynamic int8) bent differently when the text shares a batch."""

    def __init__(self, bend: str | None = None, bend_in_batch: str | None = None) -> None:
        self.bend, self.bend_in_batch = bend, bend_in_batch

    def encode(self, texts: list[str], batch_size: int, normalize_embeddings: bool) -> Any:
        assert normalize_embeddings
        out = []
        for text in texts:
            rng = np.random.default_rng(zlib.crc32(text.encode()))
            v = rng.normal(size=8)
            if text == self.bend or (batch_size > 1 and text == self.bend_in_batch):
                v = v + rng.normal(size=8)  # a vector pulled far from the reference
            out.append(v / np.linalg.norm(v))
        return np.stack(out).astype(np.float32)


def test_a_faithful_export_measures_one_on_every_probe(tmp_path: Path) -> None:
    result = fidelity.measure(FakeModel(), FakeModel(), "int8")
    assert set(result["probes"]) == set(fidelity.PROBES)
    assert result["min_cosine"] == pytest.approx(1.0, abs=1e-5)
    assert fidelity.below_floor(result) == {}
    fidelity.write(tmp_path, result)
    assert fidelity.read(tmp_path) == result
    assert fidelity.describe(result) == "cosine to torch >= 1.0000 on 10 probes"


def test_a_probe_bent_only_inside_a_batch_is_caught() -> None:
    japanese = fidelity.PROBES["Japanese"]
    result = fidelity.measure(FakeModel(), FakeModel(bend_in_batch=japanese), "int8")
    assert list(fidelity.below_floor(result)) == ["Japanese"]
    assert result["min_cosine"] == result["probes"]["Japanese"] < 0.98
    alone = fidelity.measure(FakeModel(), FakeModel(bend=japanese), "fp32")
    assert list(fidelity.below_floor(alone)) == ["Japanese"]


def test_load_warns_about_an_export_under_its_floor(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    empty = fidelity.PROBES["empty"]
    fidelity.write(tmp_path, fidelity.measure(FakeModel(), FakeModel(bend=empty), "int8"))
    with caplog.at_level(logging.INFO, logger="openai_compat"):
        fidelity.report("small-int8", tmp_path)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "'small-int8'" in record.getMessage()
    assert "UNDER the int8 floor 0.98: empty 0." in record.getMessage()
    caplog.clear()
    fidelity.write(tmp_path, fidelity.measure(FakeModel(), FakeModel(), "int8"))
    with caplog.at_level(logging.INFO, logger="openai_compat"):
        fidelity.report("small-int8", tmp_path)
    (record,) = caplog.records
    assert record.levelno == logging.INFO and "UNDER" not in record.getMessage()
    assert fidelity.read(tmp_path / "none") is None
    assert fidelity.describe(None) == "fidelity to torch not measured"


@pytest.mark.parametrize(
    ("node", "kept_fp32"),
    [
        ("/encoder/layer.3/output/dense/MatMul", True),  # BERT, RoBERTa, XLM-R (ONNX)
        ("/encoder/layer.3/attention/output/dense/MatMul", False),
        ("/encoder/layer.3/intermediate/dense/MatMul", False),
        ("/encoder/layer.3/attention/self/query/MatMul", False),
        ("/transformer/layer.1/ffn/lin2/MatMul", True),  # DistilBERT
        ("/encoder/layers.0/mlp/fc2/MatMul", True),
        ("/model/layers.0/mlp/down_proj/MatMul", True),
    ],
)
def test_the_int8_recipe_keeps_the_feed_forward_outputs_fp32(node: str, kept_fp32: bool) -> None:
    assert int8.is_ffn_output(node) is kept_fp32


def test_a_changed_recipe_makes_new_exports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = backends._key(str(tmp_path), None, "onnx", "int8")
    monkeypatch.setattr(backends, "RECIPE", backends.RECIPE + " and more")
    assert backends._key(str(tmp_path), None, "onnx", "int8") != before


def test_onnx_runtime_threads_follow_our_cpus_and_do_not_spin() -> None:
    options = backends.runtime_options("onnx", 3)["session_options"]
    assert options.intra_op_num_threads == 3 and options.inter_op_num_threads == 1
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    ov = backends.runtime_options("openvino", 2)["ov_config"]
    assert ov == {
        "INFERENCE_NUM_THREADS": "2",
        "PERFORMANCE_HINT": "LATENCY",
        "NUM_STREAMS": "1",
        "INFERENCE_PRECISION_HINT": "f32",  # not the CPU plugin's bf16 where it has bf16
    }
    bf16 = backends.runtime_options("openvino", 2, "bfloat16")["ov_config"]
    assert bf16["INFERENCE_PRECISION_HINT"] == "bf16"


def test_engine_threads_take_the_operators_omp_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert cpus.engine_threads() == 5
    monkeypatch.setenv("OMP_NUM_THREADS", "lots")
    assert cpus.engine_threads() == cpus.available()[0]
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert cpus.engine_threads() == cpus.available()[0]
