from __future__ import annotations

import orjson
import pytest

from openai_compat.ground.errors import (
    BadRequest,
    ModelNotFound,
    RateLimited,
    api_error_response,
    validation_message,
)


def test_api_errors_render_the_openai_envelope() -> None:
    resp = api_error_response(BadRequest("nope", param="input", code="x"))
    assert resp.status_code == 400
    assert orjson.loads(resp.body) == {
        "error": {"message": "nope", "type": "invalid_request_error", "param": "input", "code": "x"}
    }


def test_model_not_found_names_the_served_models() -> None:
    exc = ModelNotFound("gpt-x", ["a", "b"])
    body = orjson.loads(api_error_response(exc).body)["error"]
    assert exc.status == 404
    assert body["code"] == "model_not_found" and body["param"] == "model"
    assert "gpt-x" in body["message"] and "a, b" in body["message"]


def test_headers_travel_with_the_error() -> None:
    resp = api_error_response(RateLimited("busy", headers={"Retry-After": "2"}))
    assert resp.status_code == 429 and resp.headers["retry-after"] == "2"


@pytest.mark.parametrize(
    ("errors", "expected"),
    [
        (
            [{"type": "json_invalid", "loc": ("body",), "msg": "EOF"}],
            (None, "invalid_json"),
        ),
        (
            [{"type": "missing", "loc": ("body", "input"), "msg": "Field required"}],
            ("input", "missing_required_parameter"),
        ),
        (
            [
                {"type": "string_type", "loc": ("body", "input", "str"), "msg": "m"},
                {"type": "list_type", "loc": ("body", "input", "list[str]"), "msg": "m"},
            ],
            ("input", "invalid_type"),
        ),
        (
            [{"type": "int_type", "loc": ("body", "documents", 3, "text"), "msg": "bad"}],
            ("documents[3].text", "invalid_value"),
        ),
        (
            [{"type": "model_type", "loc": ("body",), "msg": "Input should be an object"}],
            (None, "invalid_request_body"),
        ),
    ],
)
def test_validation_errors_name_the_client_field(
    errors: list[dict[str, object]], expected: tuple[str | None, str]
) -> None:
    message, param, code = validation_message(errors)
    assert (param, code) == expected
    assert message
