"""Compact embedding types, as Cohere defines them: int8, uint8, binary, ubinary (and base64).

- `int8`: each value scaled by one fixed number per model and rounded,
  `clip(round(x * 127 / R), -128, 127)`. R (the model's *range*) is the largest |value| in the
  embeddings of a fixed calibration text set (CALIBRATION_TEXTS), measured once at load, or
  `quantization_range` from the config. One scale for every dimension keeps dot products
  proportional to the float ones, so a vector database can rank int8 vectors directly; and
  since R never depends on the request, a text's int8 vector is the same alone or in a batch.
- `uint8`: the int8 value + 128 (0..255).
- `ubinary`: one sign bit per dimension (1 where the value is > 0), packed 8 per byte, first
  dimension in the highest bit (numpy.packbits); `binary`: the same bytes - 128, as int8.
  Both need dimensions divisible by 8.
- `base64`: the float32 values, little-endian, base64-encoded.

With `output_dimension` the vectors are cut and renormalised first; their range is the
calibration set's range at that size (scaled by the same factor when it comes from config).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from openai_compat.ground.errors import BadRequest

CompactType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
TYPES: tuple[CompactType, ...] = ("float", "int8", "uint8", "binary", "ubinary", "base64")

# Short texts of many kinds (questions, passages, code, numbers, names, other languages):
# their embeddings span what real inputs produce. Changing this list changes every int8
# vector a model serves; keep it fixed.
CALIBRATION_TEXTS: tuple[str, ...] = (
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "How do I reset my password?",
    "Click 'Forgot password' on the sign-in page and follow the link we email you.",
    "The mitochondria is the powerhouse of the cell.",
    "def add(a, b):\n    return a + b",
    "SELECT name, email FROM users WHERE active = 1 ORDER BY created_at DESC;",
    "Invoice #INV-2024-00931, total due: $1,284.50 by March 3.",
    "The quick brown fox jumps over the lazy dog.",
    "Climate change is driving more frequent and severe heatwaves.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "La tour Eiffel a été construite pour l'Exposition universelle de 1889.",
    "El aprendizaje automático permite a las computadoras aprender de los datos.",
    "東京は日本の首都です。",
    "Best running shoes for flat feet under 100 dollars",
    "Error: connection refused (ECONNREFUSED) at 127.0.0.1:5432",
    "The patient presented with a fever of 39.2 C and a persistent dry cough.",
    "Quarterly revenue grew 12% year over year, driven by subscription sales.",
    "To be, or not to be, that is the question.",
    "Mix the flour, sugar and butter, then bake at 180 degrees for 25 minutes.",
    "The Treaty of Westphalia ended the Thirty Years' War in 1648.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Is it safe to take ibuprofen with coffee?",
    "The court ruled that the contract was void for lack of consideration.",
    "Our new phone has a 6.1-inch OLED display and a 48-megapixel camera.",
    "I loved this movie, the acting was superb and the ending surprised me.",
    "Terrible service, the food was cold and the waiter was rude.",
    "Kubernetes schedules containers onto nodes based on resource requests.",
    "The derivative of sin(x) is cos(x).",
    "Ada Lovelace wrote the first published algorithm for a machine.",
    "Where can I find vegan restaurants near the train station?",
    "Shipping takes 3-5 business days within the EU; returns are free for 30 days.",
    "A black hole is a region of spacetime where gravity prevents anything from escaping.",
    "git rebase -i HEAD~3 lets you squash the last three commits.",
    "The football match ended 2-1 after a late penalty in stoppage time.",
    "Product code XJ-9000-B fits models built after 2019.",
    "Meeting moved to Thursday 3pm, room 4B; agenda attached.",
    "Symptoms of dehydration include thirst, dark urine and dizziness.",
    "The Amazon rainforest produces a significant share of the world's oxygen.",
    "hello",
    "OK",
    "2 + 2 = 4",
    "Which programming language should I learn first?",
    "The stock market fell sharply after the central bank raised interest rates.",
    "Bees communicate the location of flowers through a waggle dance.",
    "Please find attached the signed agreement for your records.",
    "The museum is closed on Mondays and public holidays.",
    "An apple a day keeps the doctor away.",
    "Neural networks learn representations by adjusting weights through backpropagation.",
    "Water boils at 100 degrees Celsius at sea level.",
    "The novel follows a young woman's journey across post-war Europe.",
    "How many calories are in a banana?",
    "Our API returns JSON with snake_case keys and ISO 8601 timestamps.",
    "The bridge was closed for repairs after inspectors found cracks in the supports.",
    "Solar panels convert sunlight directly into electricity.",
    "Can I bring my dog on the plane?",
    "The orchestra performed Beethoven's Ninth Symphony to a sold-out hall.",
    "Vaccines train the immune system to recognise a pathogen.",
    "Remote work has changed how companies think about office space.",
    "The password must be at least 12 characters long.",
    "Mount Everest is the highest mountain above sea level.",
    "Tax returns are due on April 15 unless you file for an extension.",
    "A haiku has three lines of five, seven and five syllables.",
    "Turn left at the second traffic light, then continue for 200 meters.",
)


@dataclass
class Quantizer:
    """One model's int8 range, at full size and (cached) at each `output_dimension`."""

    calibration: np.ndarray  # float32 [texts, dimensions]: the calibration embeddings
    configured: float | None = None  # quantization_range from the config, if any
    from_cache: bool = False  # the embeddings were read from disk (calibration_file)
    _ranges: dict[int, float] = field(default_factory=dict)

    def range(self, dimensions: int) -> float:
        cached = self._ranges.get(dimensions)
        if cached is not None:
            return cached
        full = self.calibration.shape[1]
        measured = _max_abs(self.calibration, dimensions)
        if self.configured is not None:
            measured = self.configured * (measured / _max_abs(self.calibration, full))
        self._ranges[dimensions] = measured
        return measured


def _max_abs(vectors: np.ndarray, dimensions: int) -> float:
    cut = vectors[:, :dimensions]
    norms = np.linalg.norm(cut, axis=1, keepdims=True)
    if dimensions < vectors.shape[1]:
        cut = cut / np.where(norms == 0, 1, norms)
    value = float(np.abs(cut).max())
    return value if value > 0 else 1.0


def check_types(types: Sequence[str], dimensions: int | None, param: str) -> None:
    """400 for a type we do not know, or a binary type on a size not divisible by 8."""
    for t in types:
        if t not in TYPES:
            raise BadRequest(
                f"Unknown embedding type {t!r} in '{param}'; use one of: {', '.join(TYPES)}.",
                param=param,
                code="invalid_embedding_type",
            )
    if dimensions is not None and dimensions % 8 and {"binary", "ubinary"} & set(types):
        raise BadRequest(
            f"binary and ubinary pack 8 dimensions per byte: the embedding size "
            f"({dimensions}) must be divisible by 8.",
            param=param,
            code="invalid_embedding_type",
        )


def to_int8(vectors: np.ndarray, value_range: float) -> np.ndarray:
    scaled = np.rint(vectors * (127.0 / value_range))
    return np.clip(scaled, -128, 127).astype(np.int8)


def ubinary(vectors: np.ndarray) -> np.ndarray:
    return np.packbits(vectors > 0, axis=-1)


def encode(vectors: np.ndarray, kind: CompactType, quantizer: Quantizer | None) -> list[Any]:
    """float32 [n, d] -> one row per vector (numpy rows, serialised by orjson) of one type."""
    if kind == "float":
        return list(vectors)
    if kind == "base64":
        data = np.ascontiguousarray(vectors, dtype="<f4")
        return [base64.b64encode(row.tobytes()).decode("ascii") for row in data]
    if kind in ("binary", "ubinary"):
        packed = ubinary(vectors)
        if kind == "binary":
            return list((packed.astype(np.int16) - 128).astype(np.int8))
        return list(packed)
    if quantizer is None:
        raise BadRequest(
            f"This model has no calibrated range for {kind!r} embeddings.",
            param="embedding_types",
            code="invalid_embedding_type",
        )
    q = to_int8(vectors, quantizer.range(vectors.shape[1]))
    if kind == "uint8":
        return list((q.astype(np.int16) + 128).astype(np.uint8))
    return list(q)


def encode_as(
    vectors: np.ndarray, dtype: str | None, quantizer: Quantizer | None, base64_out: bool
) -> list[Any]:
    """Vectors as Voyage's and Mistral's dialects send them: floats or a compact type's
    numbers (`dtype`: None or "float", int8, uint8, binary, ubinary), or (base64) each
    vector's bytes of that type (float32, int8 or uint8), which their SDKs decode."""
    if dtype in (None, "float"):
        return encode(vectors, "base64" if base64_out else "float", quantizer)
    rows = encode(vectors, dtype, quantizer)  # type: ignore[arg-type]
    if not base64_out:
        return rows
    return [base64.b64encode(np.asarray(r).tobytes()).decode("ascii") for r in rows]
