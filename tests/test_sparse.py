"""formats/sparse.py: selection, dot products and the wire format, on hand-made vectors."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from openai_compat.formats.sparse import (
    SparseVector,
    check_options,
    decode_base64,
    embedding_object,
)
from openai_compat.ground.errors import BadRequest


def _vec(pairs: dict[int, float]) -> SparseVector:
    dense = np.zeros(100, dtype=np.float32)
    for i, v in pairs.items():
        dense[i] = v
    return SparseVector.from_dense(dense, tokens=7)


def test_from_dense_keeps_the_non_zero_entries_in_index_order() -> None:
    v = _vec({40: 0.5, 3: 1.25, 99: 2.0})
    assert v.indices.dtype == np.dtype("<u4") and v.values.dtype == np.dtype("<f4")
    assert v.indices.tolist() == [3, 40, 99] and v.values.tolist() == [1.25, 0.5, 2.0]
    assert v.tokens == 7


def test_select_top_k_and_min_weight() -> None:
    v = _vec({1: 0.1, 5: 0.9, 9: 0.5, 20: 0.9, 30: 0.3})
    top = v.select(3, None)
    assert top.indices.tolist() == [5, 9, 20] and top.values.tolist() == pytest.approx(
        [0.9, 0.5, 0.9]
    )
    tie = v.select(1, None)  # equal weights: the lower index wins
    assert tie.indices.tolist() == [5]
    assert v.select(None, 0.5).indices.tolist() == [5, 9, 20]
    assert v.select(2, 0.4).indices.tolist() == [5, 20]
    assert v.select(10, None).indices.tolist() == [1, 5, 9, 20, 30]
    assert v.select(None, None).indices.tolist() == v.indices.tolist()


def test_dot_product_over_shared_indices() -> None:
    a = _vec({1: 2.0, 5: 3.0, 7: 1.0})
    b = _vec({5: 0.5, 7: 4.0, 8: 9.0})
    assert a.dot(b) == pytest.approx(3.0 * 0.5 + 1.0 * 4.0)
    assert a.dot(_vec({2: 1.0})) == 0.0


def test_base64_is_little_endian_uint32_and_float32() -> None:
    v = _vec({3: 1.5, 70: 0.25})
    item = embedding_object(v, 2, fmt="base64")
    assert item["object"] == "embedding" and item["index"] == 2
    raw = base64.b64decode(item["embedding"]["indices"])
    assert raw == np.asarray(v.indices, "<u4").tobytes() and len(raw) == 4 * v.indices.size
    back = decode_base64(item["embedding"])
    assert back.indices.tolist() == v.indices.tolist()
    assert back.values.tolist() == v.values.tolist()


def test_return_tokens_names_each_index() -> None:
    v = _vec({3: 1.0, 8: 2.0})
    item = embedding_object(v, 0, fmt="float", token_of=lambda i: f"tok{i}")
    assert item["embedding"]["tokens"] == ["tok3", "tok8"]


@pytest.mark.parametrize(
    ("top_k", "min_weight", "param"),
    [
        (0, None, "top_k"),
        (-3, None, "top_k"),
        (None, -0.1, "min_weight"),
        (None, float("nan"), "min_weight"),
        (None, float("inf"), "min_weight"),
    ],
)
def test_bad_options_are_400s(top_k: int | None, min_weight: float | None, param: str) -> None:
    with pytest.raises(BadRequest) as info:
        check_options(top_k, min_weight)
    assert info.value.param == param
