"""The int8 recipes both export paths share (engine/backends.py through optimum for
infinity-emb, engine/exported.py for the native engine): ONNX Runtime's dynamic quantisation
and NNCF's static one for OpenVINO, each keeping the projections whose activations carry
outliers an 8-bit scale cannot hold in fp32, calibrated on fixed texts shipped with the
server (no dataset download). What each costs in fidelity is measured per export
(engine/fidelity.py).
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

# Calibration beyond compact.CALIBRATION_TEXTS' short sentences (none of them is one of
# fidelity.PROBES, which measure the result): the extremes activations reach.
CALIBRATION_EXTRA = (
    " ".join(["item"] * 200),
    "The committee met on Tuesday to review the budget for the coming year, discussed "
    "maintenance costs, staff salaries and the new library wing, and postponed the vote. " * 10,
    "a",
    "서울은 대한민국의 수도이며 가장 큰 도시입니다.",
    "القاهرة هي عاصمة مصر وأكبر مدنها.",
    "नई दिल्ली भारत की राजधानी है।",
    "Київ є столицею та найбільшим містом України.",
    "Il treno per Milano parte alle otto e mezza dal binario tre.",
)


def target() -> str:
    """The dynamic-quantisation config that suits this CPU (optimum's names)."""
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "arm64"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        flags = ""
    if "avx512_vnni" in flags:
        return "avx512_vnni"
    if "avx512f" in flags:
        return "avx512"
    return "avx2"


def is_ffn_output(node: str) -> bool:
    """The feed-forward block's second projection in the exporters' node names (BERT, RoBERTa,
    XLM-R, MPNet: `layer.N/output/dense`; DistilBERT `ffn/lin2`; others `fc2`/`down_proj`)."""
    name = node.replace(".", "/")
    ffn_output = "/output/dense/" in name and "/attention/" not in name
    return ffn_output or any(p in name for p in ("/ffn/lin2/", "/fc2/", "/down_proj/"))


def quantize_onnx(onnx_dir: Path, target: str) -> None:
    """Dynamic int8 of the MatMul weights (per channel) but the feed-forward outputs'. On
    AVX2/AVX-512 without VNNI, weights use 7 bits (u8 x s8 products saturate otherwise)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    source = onnx_dir / "model.onnx"
    graph = onnx.load(str(source), load_external_data=False).graph
    keep = [n.name for n in graph.node if n.op_type == "MatMul" and is_ffn_output(n.name)]
    quantize_dynamic(
        source,
        onnx_dir / f"model_qint8_{target}.onnx",
        weight_type=QuantType.QInt8,
        per_channel=True,
        reduce_range=target in ("avx2", "avx512"),
        op_types_to_quantize=["MatMul"],
        nodes_to_exclude=keep,
    )


def quantize_openvino_graph(graph: Any, tokenizer: Any, max_length: int | None) -> Any:
    """Static int8 (activations and weights) with NNCF's transformer preset (SmoothQuant, fast
    bias correction), calibrated on the fixed calibration texts one at a time, so each sees
    its own length; the output projections (feed-forward and attention) stay fp32."""
    import nncf

    from openai_compat.formats.compact import CALIBRATION_TEXTS

    names = {port.get_any_name() for port in graph.inputs}
    items = []
    for text in (*CALIBRATION_TEXTS, *CALIBRATION_EXTRA):
        encoded = tokenizer([text], return_tensors="np", truncation=True, max_length=max_length)
        items.append({k: v for k, v in encoded.items() if k in names})
    return nncf.quantize(
        graph,
        nncf.Dataset(items),
        model_type=nncf.ModelType.TRANSFORMER,
        subset_size=len(items),
        # Node names as optimum-intel's PyTorch conversion and OpenVINO's ONNX front end
        # (engine/exported.py) give them: `layer.N.output.dense/...`, `/layer.N/output/dense/...`.
        # The ONNX trace also spells attention out (query x key, weights x value: MatMuls of two
        # activations, where the PyTorch conversion keeps one attention op NNCF leaves alone):
        # those stay fp32 too (quantised, the repetitive probe fell to 0.937).
        ignored_scope=nncf.IgnoredScope(
            patterns=[
                r".*\.output\.dense/.*",
                r".*/output/dense/.*",
                r".*/(self|attn|attention)/MatMul(_\d+)?$",
            ],
            validate=False,
        ),
    )
