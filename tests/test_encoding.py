from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest

from openai_compat.formats.encoding import (
    decode_base64_embedding,
    embedding_payload,
    truncate_dimensions,
)


def _vectors(n: int = 3, d: int = 8, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return list(rng.standard_normal((n, d)).astype(np.float32))


def test_float_payload_carries_the_exact_float32_values() -> None:
    vectors = _vectors()
    body = orjson.loads(
        embedding_payload(vectors, fmt="float", dimensions=None, model="m", prompt_tokens=7)
    )
    assert body["object"] == "list" and body["model"] == "m"
    assert body["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    for item, vec in zip(body["data"], vectors, strict=True):
        assert item["object"] == "embedding"
        # float32 shortest repr read back as float64 rounds to the very same float32
        np.testing.assert_array_equal(np.asarray(item["embedding"], dtype=np.float32), vec)


def test_base64_is_little_endian_float32_exactly_as_the_openai_sdk_decodes() -> None:
    vectors = _vectors()
    body = orjson.loads(
        embedding_payload(vectors, fmt="base64", dimensions=None, model="m", prompt_tokens=1)
    )
    for item, vec in zip(body["data"], vectors, strict=True):
        raw = base64.b64decode(item["embedding"])
        assert len(raw) == 4 * vec.size
        np.testing.assert_array_equal(np.frombuffer(raw, dtype="<f4"), vec)
        np.testing.assert_array_equal(decode_base64_embedding(item["embedding"]), vec)


def test_float64_engine_output_is_sent_as_float32() -> None:
    vectors = [np.array([1.0, 2.0, 3.0]), np.array([0.5, 0.25, 0.125])]
    body = orjson.loads(
        embedding_payload(vectors, fmt="base64", dimensions=None, model="m", prompt_tokens=1)
    )
    np.testing.assert_array_equal(decode_base64_embedding(body["data"][1]["embedding"]), vectors[1])


@pytest.mark.parametrize("fmt", ["float", "base64"])
def test_dimensions_cut_and_renormalise(fmt: str) -> None:
    vectors = _vectors(d=16)
    body = orjson.loads(
        embedding_payload(vectors, fmt=fmt, dimensions=4, model="m", prompt_tokens=1)  # type: ignore[arg-type]
    )
    for item, vec in zip(body["data"], vectors, strict=True):
        got = (
            np.asarray(item["embedding"], dtype=np.float32)
            if fmt == "float"
            else decode_base64_embedding(item["embedding"])
        )
        expected = vec[:4] / np.linalg.norm(vec[:4])
        np.testing.assert_allclose(got, expected, rtol=1e-6)
        assert abs(np.linalg.norm(got) - 1) < 1e-6


def test_dimensions_equal_to_size_change_nothing() -> None:
    m = np.stack(_vectors(d=5))
    assert truncate_dimensions(m, 5) is m
    assert truncate_dimensions(m, None) is m


def test_zero_vector_survives_renormalisation() -> None:
    out = truncate_dimensions(np.zeros((1, 8), dtype=np.float32), 2)
    assert np.all(np.isfinite(out)) and out.shape == (1, 2)


@pytest.mark.parametrize("fmt", ["float", "base64"])
def test_multivector_items_carry_their_shape(fmt: str) -> None:
    rng = np.random.default_rng(1)
    items = [
        rng.standard_normal((3, 4)).astype(np.float32),
        rng.standard_normal((5, 4)).astype(np.float32),
    ]
    body = orjson.loads(
        embedding_payload(items, fmt=fmt, dimensions=None, model="m", prompt_tokens=1)  # type: ignore[arg-type]
    )
    for item, arr in zip(body["data"], items, strict=True):
        assert item["shape"] == list(arr.shape)
        if fmt == "float":
            got = np.asarray(item["embedding"], dtype=np.float32)
        else:
            got = decode_base64_embedding(item["embedding"]).reshape(item["shape"])
        np.testing.assert_array_equal(got, arr)
