"""Request bodies: small ones validated in place, big ones in worker processes, with the same
result and the same errors either way."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.requests import Request

from openai_compat.api.infinity.protocol import InfinityClassifyRequest
from openai_compat.api.protocol import EmbeddingRequest
from openai_compat.api.shared import chooser
from openai_compat.api.tutorial.protocol import TutorialClassifyRequest
from openai_compat.ground import bodies
from openai_compat.ground.bodies import BodyParser
from openai_compat.ground.errors import validation_message
from openai_compat.web.fastpath import fast_path_table


@pytest.fixture(scope="module")
def parser() -> BodyParser:
    p = BodyParser(workers=1)
    yield p  # type: ignore[misc]
    p.close()


def _big(body: dict[str, object]) -> bytes:
    raw = orjson.dumps(body)
    assert len(raw) > bodies.INLINE_BYTES
    return raw


async def test_big_bodies_parse_to_the_same_request(parser: BodyParser) -> None:
    texts = [f"text {i} " + "x" * 1000 for i in range(2000)]
    raw = _big({"model": "m", "input": texts, "dimensions": 8})
    req = await parser.parse(raw, EmbeddingRequest)
    assert isinstance(req, EmbeddingRequest) and req.input == texts and req.dimensions == 8
    assert req.model_fields_set == {"model", "input", "dimensions"}


async def test_big_token_id_bodies_come_back_as_arrays(parser: BodyParser) -> None:
    ids = [[i % 50000 for i in range(j, j + 3000)] for j in range(100)]
    req = await parser.parse(_big({"model": "m", "input": ids}), EmbeddingRequest)
    assert isinstance(req.input, list) and len(req.input) == 100
    assert all(isinstance(a, np.ndarray) for a in req.input)
    assert [a.tolist() for a in req.input] == ids  # type: ignore[union-attr]
    flat = list(range(300_000))
    req = await parser.parse(_big({"model": "m", "input": flat}), EmbeddingRequest)
    assert isinstance(req.input, np.ndarray) and req.input.tolist() == flat
    assert req.input.dtype == np.int32  # half the bytes to send back
    wide = [2**40, *flat]  # past int32: int64; past int64: the ints as sent
    req = await parser.parse(_big({"model": "m", "input": wide}), EmbeddingRequest)
    assert req.input.dtype == np.int64 and req.input.tolist() == wide  # type: ignore[union-attr]
    huge = [[7, 8], [2**70, *flat]]
    raw = json.dumps({"model": "m", "input": huge}).encode()  # orjson stops at 64 bits
    assert len(raw) > bodies.INLINE_BYTES
    req = await parser.parse(raw, EmbeddingRequest)
    assert isinstance(req.input, list) and req.input[1] == huge[1]
    assert isinstance(req.input[0], np.ndarray) and req.input[0].tolist() == [7, 8]


async def test_big_and_small_invalid_bodies_fail_alike(parser: BodyParser) -> None:
    padding = "p" * (bodies.INLINE_BYTES + 10)
    for body in (
        {"model": "m", "input": [1, "mixed"], "user": padding},
        {"model": 3, "input": "x", "user": padding},
        {"input": "x", "user": padding},
    ):
        small = {k: v for k, v in body.items() if k != "user"}
        errors = []
        for raw in (orjson.dumps(small), orjson.dumps(body)):
            with pytest.raises(RequestValidationError) as info:
                await parser.parse(raw, EmbeddingRequest)
            errors.append(validation_message(info.value.errors()))
        assert errors[0] == errors[1], body


async def test_a_chooser_picks_the_request_shape_for_big_bodies_too(parser: BodyParser) -> None:
    sentences = ["good " * 200] * 1200
    classify = chooser("/classify")
    req = await parser.parse(_big({"sentences": sentences, "model_index": 2}), classify)
    assert isinstance(req, TutorialClassifyRequest) and req.model_index == 2
    req = await parser.parse(orjson.dumps({"model": "s", "input": "hi"}), classify)
    assert isinstance(req, InfinityClassifyRequest)
    with pytest.raises(RequestValidationError) as info:
        await parser.parse(b"{not json", classify)
    assert validation_message(info.value.errors())[2] == "invalid_json"


def test_fast_path_refuses_handlers_that_declare_dependencies() -> None:
    from fastapi import Depends

    async def plain(request: Request) -> None:
        return None

    def dependency() -> int:
        return 1

    async def with_dep(request: Request, value: int = Depends(dependency)) -> None:
        return None

    async def with_query(request: Request, limit: int = 3) -> None:
        return None

    ok = APIRoute("/ok", plain, methods=["POST"])
    assert fast_path_table([("/ok", ok)]) == {"/ok": plain}
    for handler, name in ((with_dep, "dependency"), (with_query, "limit")):
        route = APIRoute("/bad", handler, methods=["POST"])
        with pytest.raises(RuntimeError, match=name):
            fast_path_table([("/bad", route)])
    guarded = APIRoute("/g", plain, methods=["POST"], dependencies=[Depends(dependency)])
    with pytest.raises(RuntimeError, match="declares dependency"):
        fast_path_table([("/g", guarded)])
