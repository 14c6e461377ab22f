"""The native engine's exported forward passes: ONNX Runtime and OpenVINO, without optimum.

sentence-transformers 6's own `backend="onnx"` / `"openvino"` load through optimum-onnx and
optimum-intel, which cannot be installed beside transformers >= 5.3 (optimum-onnx requires
transformers < 4.58; optimum-intel pulls torchvision, which breaks beside torch 2.13 CPU). So
the export is ours, and small: the model's transformers encoder (`transformers_model`, public)
traced once by `torch.onnx.export` or `openvino.convert_model`, from token rows to
`last_hidden_state`; everything around it stays the library's (preprocess, the Transformer
module's dispatch, Pooling, Normalize), because the export is set as the Transformer module's
`model`, which is what the library's own ONNX and OpenVINO backends do with optimum's.

Kept from engine/backends.py (what no library gives): the cache keyed on the weights, the
int8 recipes that keep the feed-forward output projections fp32, calibration on the fixed
texts, fidelity measured once per export against the torch model, runtimes sized to the CPUs
the process may use (and ONNX Runtime's workers not spinning). ONNX fp32 exports are
optimised by ONNX Runtime's transformer optimizer (LayerNorm and GELU fusions, exact GELU).
Text embedders only (one vector per input): other kinds run on torch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from openai_compat.engine import backends, int8

logger = logging.getLogger("openai_compat")

ONNX_FP32 = "model_optimized.onnx"  # ONNX Runtime's transformer optimizer's output
OPENVINO_FP32 = "openvino_model.xml"
OPSET = 17
# Inputs an encoder's trace takes, in the tokenizer's order.
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_EXPORTER = "native-1"  # part of every cache key, beside backends.RECIPE


def serve_exported(model: Any, config: Any, export_dir: Path, threads: int) -> Path:
    """Run `model`'s encoder (a SentenceTransformer text embedder) on `config.backend`'s
    export, made and measured first if it is not cached (backends.export_once). Returns the
    export's folder."""
    backend, quantize = config.backend, config.quantize
    _check_exportable(model)
    folder = backends.cache_folder(
        export_dir,
        config.served_name,
        config.source,
        config.revision,
        f"{_EXPORTER}-{backend}",
        quantize,
    )
    exporter = _export_openvino if backend == "openvino" else _export_onnx

    def make(tmp: Path) -> None:
        tmp.mkdir()
        exporter(model, tmp, quantize)

    graph = backends.export_once(
        folder,
        name=config.served_name,
        backend=backend,
        quantize=quantize,
        find=lambda f: _find(f, backend, quantize),
        make=make,
        measure=lambda _tmp, made: _measure(model, config, made, threads),
    )
    model[0].model = _runtime(model, graph, backend, threads, config.dtype)
    return folder


def _check_exportable(model: Any) -> None:
    from sentence_transformers import SentenceTransformer

    first = model[0] if len(model) else None
    config = getattr(first, "modality_config", {}) or {}
    text = config.get("text", {})
    plain = (
        isinstance(model, SentenceTransformer)
        and set(config) == {"text"}
        and text.get("method") == "forward"
        and text.get("method_output_name") == "last_hidden_state"
    )
    if not plain:
        raise ValueError(
            "an exported backend (onnx, openvino) serves text embedding models only; "
            "serve this model with backend = 'torch'"
        )


def _find(folder: Path, backend: str, quantize: str | None) -> Path | None:
    if backend == "openvino":
        name = backends.OPENVINO_INT8 if quantize else OPENVINO_FP32
        xml = folder / name
        return xml if xml.is_file() and xml.with_suffix(".bin").is_file() else None
    found = sorted(folder.glob("model_qint8_*.onnx")) if quantize else [folder / ONNX_FP32]
    return found[0] if found and found[0].is_file() else None


def _positional(encoder: Any, names: list[str]) -> Any:
    """The encoder as a module of positional token tensors (what the tracer takes), answering
    `last_hidden_state`."""
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, *tensors: Any) -> Any:
            return self.encoder(**dict(zip(names, tensors, strict=True))).last_hidden_state

    return Encoder().eval()


def _input_names(model: Any) -> list[str]:
    """The encoder inputs the tokenizer gives, in its order (the graph's inputs)."""
    return [n for n in model.tokenizer.model_input_names if n in _INPUTS]


def _sample(model: Any) -> tuple[list[str], dict[str, Any]]:
    """The input names and a padded two-input batch of them, to trace with."""
    names = _input_names(model)
    sample = model.tokenizer(["a sample input", "b"], padding=True, return_tensors="pt")
    return names, {n: sample[n] for n in names}


def _trace_onnx(model: Any, folder: Path) -> Path:
    """The encoder traced to ONNX (`model.onnx`): token tensors in, `last_hidden_state` out,
    batch and sequence dynamic."""
    import torch

    names, sample = _sample(model)
    dynamic = {n: {0: "batch", 1: "sequence"} for n in [*names, "last_hidden_state"]}
    raw = folder / "model.onnx"
    with torch.inference_mode():
        torch.onnx.export(
            _positional(model.transformers_model, names),
            tuple(sample.values()),
            str(raw),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=dynamic,
            opset_version=OPSET,
            dynamo=False,  # the TorchScript tracer: one graph for every batch and length
        )
    return raw


def _export_onnx(model: Any, folder: Path, quantize: str | None) -> None:
    raw = _trace_onnx(model, folder)
    if quantize:
        int8.quantize_onnx(folder, int8.target())
        return
    from onnxruntime.transformers.optimizer import optimize_model

    config = model.transformers_model.config
    optimized = optimize_model(
        str(raw),
        model_type="bert",
        num_heads=int(getattr(config, "num_attention_heads", 0) or 0),
        hidden_size=int(getattr(config, "hidden_size", 0) or 0),
    )
    optimized.save_model_to_file(str(folder / ONNX_FP32))


def _export_openvino(model: Any, folder: Path, quantize: str | None) -> None:
    """OpenVINO's IR converted from the ONNX trace (its ONNX front end keeps the names)."""
    import openvino

    raw = _trace_onnx(model, folder)
    with backends.openvino_telemetry_declined():
        graph = openvino.convert_model(str(raw))
        if quantize:
            graph = int8.quantize_openvino_graph(graph, model.tokenizer, model.max_seq_length)
            openvino.save_model(graph, str(folder / backends.OPENVINO_INT8))
        else:
            openvino.save_model(graph, str(folder / OPENVINO_FP32), compress_to_fp16=False)
    raw.unlink()


def _measure(model: Any, config: Any, graph: Path, threads: int) -> None:
    """The new export's fidelity to the torch model (engine/fidelity.py), kept beside it:
    the probes through the torch encoder, then through the export in its place."""
    from openai_compat.engine import fidelity

    want = fidelity.reference_vectors(model)
    first = model[0]
    encoder = first.model
    first.model = _runtime(model, graph, config.backend, threads, config.dtype)
    try:
        result = fidelity.compare(want, model, "int8" if config.quantize else "fp32")
    finally:
        first.model = encoder
    fidelity.write(graph.parent, result)
    logger.info("export of %s: %s", config.source, fidelity.describe(result))


def _runtime(model: Any, graph: Path, backend: str, threads: int, dtype: str) -> Any:
    """A torch module that runs the export in place of the transformers encoder: it takes
    the encoder's token keyword arguments and answers `last_hidden_state`."""
    import numpy as np
    import torch

    names = _input_names(model)
    config = model.transformers_model.config
    # what the thread counts a batch may be given need made before use (ONNX's sessions)
    prepare: Callable[[Iterable[int]], None] | None = None
    if backend == "openvino":
        import openvino

        options = backends.runtime_options("openvino", threads, dtype)["ov_config"]
        with backends.openvino_telemetry_declined():
            compiled = openvino.Core().compile_model(str(graph), "CPU", options)

        def run(feed: dict[str, np.ndarray]) -> np.ndarray:
            return compiled.create_infer_request().infer(feed)[compiled.output(0)]

    else:
        sessions = _OnnxSessions(graph, threads)
        prepare = sessions.make

        def run(feed: dict[str, np.ndarray]) -> np.ndarray:
            session = sessions.get(torch.get_num_threads())
            return session.run(["last_hidden_state"], feed)[0]

    class Exported(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = config  # what the server reads of a model (limits, sizes)
            if prepare is not None:  # text.TextRunner: a count per batch, made at load
                self.prepare_threads = prepare

        def forward(self, **inputs: Any) -> dict[str, Any]:
            ids = inputs["input_ids"]
            feed = {}
            for name in names:
                value = inputs.get(name)
                feed[name] = (torch.zeros_like(ids) if value is None else value).cpu().numpy()
            return {"last_hidden_state": torch.from_numpy(np.asarray(run(feed)))}

    return Exported()


class _OnnxSessions:
    """One ONNX Runtime session per thread count: a session's pool is fixed when it is made,
    and the scheduler gives each batch a count (torch's count on the calling lane's thread,
    which it sets): two lanes side by side run one thread each, a lone batch the tuner's
    count. Session.run is thread-safe, so lanes share a session; one thread runs on the
    caller's thread, no pool. The scheduler names every count it may give while the model
    loads (prepare_threads), so all are made then; each costs the model's weights again
    (MiniLM ~90 MiB), and threads.candidates bounds how many."""

    def __init__(self, graph: Path, threads: int) -> None:
        self.graph = graph
        self._sessions: dict[int, Any] = {}
        self._lock = threading.Lock()
        self.get(threads)  # the start-up count (one CPU: the only one)

    def get(self, count: int) -> Any:
        with self._lock:
            if count not in self._sessions:
                import onnxruntime

                options = backends.runtime_options("onnx", count)["session_options"]
                self._sessions[count] = onnxruntime.InferenceSession(
                    str(self.graph), options, providers=["CPUExecutionProvider"]
                )
            return self._sessions[count]

    def make(self, counts: Iterable[int]) -> None:
        for count in counts:
            self.get(count)
