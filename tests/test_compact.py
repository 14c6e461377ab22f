"""Compact embedding types: exact encodings, calibrated ranges, and the 400s."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from openai_compat.formats.compact import Quantizer, check_types, encode, to_int8
from openai_compat.ground.errors import BadRequest


def _unit_rows(n: int, d: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_int8_scales_by_the_range_and_clips() -> None:
    v = np.array([[0.5, -0.5, 0.25, 1.0, -2.0, 0.0]], dtype=np.float32)
    assert to_int8(v, 0.5).tolist() == [[127, -127, 64, 127, -128, 0]]


def test_uint8_is_int8_shifted_and_binary_is_packed_signs() -> None:
    v = np.array([[0.3, -0.1, 0.2, -0.4, 0.1, 0.1, -0.2, 0.0, 0.5, -0.5, 0, 0, 0, 0, 0, 0.2]])
    q = Quantizer(v.astype(np.float32))
    i8 = np.asarray(encode(v, "int8", q))
    u8 = np.asarray(encode(v, "uint8", q))
    assert (u8.astype(int) == i8.astype(int) + 128).all()
    # signs 1 0 1 0 1 1 0 0 | 1 0 0 0 0 0 0 1 -> 0b10101100, 0b10000001
    assert np.asarray(encode(v, "ubinary", None)).tolist() == [[0b10101100, 0b10000001]]
    assert np.asarray(encode(v, "binary", None)).tolist() == [[0b10101100 - 128, 0b10000001 - 128]]


def test_base64_is_little_endian_float32() -> None:
    v = _unit_rows(2, 16)
    rows = encode(v, "base64", None)
    got = np.stack([np.frombuffer(base64.b64decode(r), dtype="<f4") for r in rows])
    np.testing.assert_array_equal(got, v)


def test_the_range_is_the_calibrations_largest_value_at_each_size() -> None:
    cal = _unit_rows(64, 32)
    q = Quantizer(cal)
    assert q.range(32) == pytest.approx(float(np.abs(cal).max()))
    cut = cal[:, :8] / np.linalg.norm(cal[:, :8], axis=1, keepdims=True)
    assert q.range(8) == pytest.approx(float(np.abs(cut).max()))
    # a configured range is scaled to cut sizes by the calibration's own ratio
    configured = Quantizer(cal, configured=0.5)
    assert configured.range(32) == pytest.approx(0.5)
    assert configured.range(8) == pytest.approx(0.5 * q.range(8) / q.range(32))


def test_int8_keeps_cosine_and_never_depends_on_the_batch() -> None:
    cal, v = _unit_rows(64, 384, seed=1), _unit_rows(100, 384, seed=2)
    q = Quantizer(cal)
    batch = np.asarray(encode(v, "int8", q), dtype=np.float64)
    alone = np.asarray(encode(v[7:8], "int8", q), dtype=np.float64)
    np.testing.assert_array_equal(batch[7], alone[0])
    cos = (batch * v).sum(1) / np.linalg.norm(batch, axis=1) / np.linalg.norm(v, axis=1)
    assert cos.min() >= 0.99


def test_unknown_types_and_binary_on_sizes_not_divisible_by_8_are_400s() -> None:
    with pytest.raises(BadRequest, match="Unknown embedding type 'int4'"):
        check_types(["float", "int4"], 384, "embedding_types")
    with pytest.raises(BadRequest, match=r"\(100\) must be divisible by 8"):
        check_types(["ubinary"], 100, "embedding_types")
    check_types(["int8", "float"], 100, "embedding_types")
    check_types(["binary"], 96, "embedding_types")
