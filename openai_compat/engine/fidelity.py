"""How close an exported model's vectors stay to the torch model it was exported from.

Measured once, when an export is made (engine/backends.py), on probes chosen where int8
exports break first: not only short English sentences (what calibration sets hold) but a long
repetitive input, long prose at the model's window, Japanese, Chinese, Russian and German
text, code and the empty string. Each probe is embedded alone and again inside one padded
batch of all of them (ONNX Runtime's dynamic int8 scales activations per batch, so a text's
vector can depend on its neighbours); the cosine to the torch model's vector is the smaller
of the two. The result is kept beside the export (`fidelity.json`), printed by
`openai-compat download` and logged at every start; an export under its floor (0.999 fp32,
0.98 int8) is logged as a warning that names the probes below it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger("openai_compat")

FILE = "fidelity.json"
FLOORS = {"fp32": 0.999, "int8": 0.98}

_PROSE = (
    "The history of the city begins with a small fishing village on the river bank. Over the "
    "centuries the market grew, merchants arrived from distant ports, and the town walls were "
    "extended twice. "
)
PROBES: dict[str, str] = {
    "short English": "The quick brown fox jumps over the lazy dog.",
    "question": "How do I reset my password?",
    "repetitive, 256 tokens": " ".join(["data"] * 254),
    "prose at the window": _PROSE * 12,
    "Japanese": "東京は日本の首都であり、世界で最も人口の多い都市圏の一つです。",
    "Chinese": "机器学习是人工智能的一个分支，它使计算机能够从数据中学习。",  # noqa: RUF001
    "Russian": "Москва является столицей и крупнейшим городом России.",
    "German": "Die Bundesregierung hat ein neues Gesetz zur Förderung erneuerbarer Energien "
    "beschlossen.",
    "code": "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)",
    "empty": "",
}


def measure(reference: Any, candidate: Any, precision: str) -> dict[str, Any]:
    """Cosine of each probe's vector from `candidate` to `reference` (two
    sentence-transformers models), alone and in one batch; the worse of the two per probe."""
    return compare(reference_vectors(reference), candidate, precision)


def reference_vectors(reference: Any) -> Any:
    """The probes' unit vectors from the reference model, one at a time."""
    return reference.encode(list(PROBES.values()), batch_size=1, normalize_embeddings=True)


def compare(want: Any, candidate: Any, precision: str) -> dict[str, Any]:
    """measure, with the reference's vectors (reference_vectors) given."""
    import numpy as np

    texts = list(PROBES.values())
    alone = candidate.encode(texts, batch_size=1, normalize_embeddings=True)
    batched = candidate.encode(texts, batch_size=len(texts), normalize_embeddings=True)
    worst = np.minimum(np.sum(want * alone, axis=1), np.sum(want * batched, axis=1))
    probes = {name: round(float(c), 5) for name, c in zip(PROBES, worst, strict=True)}
    return {
        "precision": precision,
        "floor": FLOORS[precision],
        "min_cosine": min(probes.values()),
        "probes": probes,
    }


def write(folder: Path, result: dict[str, Any]) -> None:
    (folder / FILE).write_text(json.dumps(result, indent=2, ensure_ascii=False))


def read(folder: Path) -> dict[str, Any] | None:
    try:
        result: dict[str, Any] = json.loads((folder / FILE).read_text())
        return result
    except (OSError, ValueError):
        return None


def below_floor(result: dict[str, Any]) -> dict[str, float]:
    floor = float(result["floor"])
    return {name: c for name, c in result["probes"].items() if c < floor}


def describe(result: dict[str, Any] | None) -> str:
    """One line for logs and `openai-compat download`."""
    if result is None:
        return "fidelity to torch not measured"
    low = below_floor(result)
    text = f"cosine to torch >= {result['min_cosine']:.4f} on {len(result['probes'])} probes"
    if low:
        listed = ", ".join(f"{name} {c:.4f}" for name, c in low.items())
        text += f"; UNDER the {result['precision']} floor {result['floor']}: {listed}"
    return text


def report(name: str, folder: Path) -> dict[str, Any] | None:
    """At load: log the export's measured fidelity, as a warning when under its floor."""
    result = read(folder)
    if result is not None and below_floor(result):
        logger.warning(
            "model %r: this export's vectors drift from the torch model's (%s); "
            "serve it with engine = 'torch' or without quantize where that matters",
            name,
            describe(result),
        )
    else:
        logger.info("model %r: %s", name, describe(result))
    return result
