"""The real server process on 127.0.0.1, driven by the openai SDK and raw HTTP."""

from __future__ import annotations

import os
import time

import httpx
import openai
import pytest

from tests.utils import RemoteServer

pytestmark = pytest.mark.slow


def _client(server: RemoteServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def test_models_list_and_retrieve_through_the_sdk(server: RemoteServer) -> None:
    client = _client(server)
    ids = [m.id for m in client.models.list()]
    assert ids == ["all-MiniLM-L6-v2", "text-embedding-3-small"]
    card = client.models.retrieve("text-embedding-3-small")
    assert card.id == "text-embedding-3-small" and card.object == "model"
    extra = card.model_extra or {}
    assert extra["root"] == "all-MiniLM-L6-v2"
    assert "embed" in extra["capabilities"] and extra["dimensions"] == 384
    assert extra["max_input_tokens"] == 256


def test_unknown_model_is_not_found_through_the_sdk(server: RemoteServer) -> None:
    client = _client(server)
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("org/does-not-exist")
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="gpt-unknown", input="x")


def test_same_routes_answer_without_the_v1_prefix(server: RemoteServer) -> None:
    assert httpx.get(server.url + "/models").json()["data"][0]["id"] == "all-MiniLM-L6-v2"
    r = httpx.post(server.url + "/embeddings", json={"model": "all-MiniLM-L6-v2", "input": "x"})
    assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 384


def _envelope(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return error  # type: ignore[no-any-return]


def test_error_envelope_for_400_404_405_and_malformed_json(server: RemoteServer) -> None:
    url = server.url
    err = _envelope(httpx.post(url + "/v1/embeddings", json={"model": "all-MiniLM-L6-v2"}), 400)
    assert err["param"] == "input" and err["type"] == "invalid_request_error"
    err = _envelope(httpx.get(url + "/v1/nothing-here"), 404)
    assert err["code"] == "not_found"
    r = httpx.delete(url + "/v1/embeddings")
    err = _envelope(r, 405)
    assert "POST" in r.headers.get("allow", "")
    err = _envelope(
        httpx.post(
            url + "/v1/embeddings",
            content=b'{"model": "all-MiniLM-L6-v2", "input": ',
            headers={"content-type": "application/json"},
        ),
        400,
    )
    assert err["code"] == "invalid_json"
    err = _envelope(httpx.post(url + "/v1/embeddings", content=b"[1, 2]"), 400)
    assert err["code"] == "invalid_request_body"
    # never FastAPI's 422 {"detail": ...}
    r = httpx.post(url + "/v1/embeddings", json={"model": 5, "input": "x"})
    assert _envelope(r, 400)["param"] == "model"


def test_model_ids_with_slashes_raw_and_percent_encoded(tmp_path, minilm_path: str) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[[models]]\nname = "sentence-transformers/all-MiniLM-L6-v2"\nmodel = "{minilm_path}"\n'
        'aliases = ["org/team/alias"]\nmodel_warmup = false\n'
    )
    with RemoteServer(["--config", str(cfg)]) as srv:
        client = _client(srv)
        for name in ("sentence-transformers/all-MiniLM-L6-v2", "org/team/alias"):
            # the SDK percent-encodes the id; raw slashes work too
            assert client.models.retrieve(name).id == name
            assert httpx.get(f"{srv.url}/v1/models/{name}").json()["id"] == name
            vec = client.embeddings.create(model=name, input="hi").data[0].embedding
            assert len(vec) == 384


def test_health_and_ready_while_loading_then_ready() -> None:
    srv = RemoteServer(wait_ready=False)
    try:
        seen_loading = False
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert srv.proc.poll() is None, srv.output()
            try:
                health = httpx.get(srv.url + "/health", timeout=2)
                ready = httpx.get(srv.url + "/ready", timeout=2)
            except httpx.TransportError:
                time.sleep(0.05)
                continue
            assert health.status_code == 200
            if ready.status_code == 503:
                assert abs(health.json()["unix"] - time.time()) < 60  # infinity's body
                assert ready.json()["error"]["code"] == "loading"
                # API routes refuse work with 503 (and Retry-After) until the models are in
                r = httpx.post(srv.url + "/v1/embeddings", json={"model": "x", "input": "y"})
                if r.status_code == 503:
                    assert r.headers["retry-after"] == "1"
                    seen_loading = True
                time.sleep(0.05)
                continue
            assert ready.status_code == 200
            body = ready.json()
            cpus = body.pop("cpus")  # the CPUs it may use and its pools (tests/test_cpus.py)
            assert cpus["available"] >= 1
            if "OMP_NUM_THREADS" not in os.environ:  # else the operator's choice stands
                assert cpus["torch_threads"] == cpus["available"]
            assert body == {
                "status": "ready",
                "models": ["all-MiniLM-L6-v2"],
                # no Batch API use yet
                "batch_runner": {"state": "idle", "restarts": 0, "pending_other_models": 0},
            }
            assert set(httpx.get(srv.url + "/health").json()) == {"unix"}
            break
        else:
            pytest.fail("server never became ready")
        assert seen_loading, "the port should answer (503) while the model is still loading"
    finally:
        srv.stop()


def test_a_model_that_fails_to_load_stops_the_server_with_its_name(tmp_path) -> None:  # type: ignore[no-untyped-def]
    missing = tmp_path / "no-such-model"
    srv = RemoteServer(["--model", f"broken={missing}"], wait_ready=False)
    try:
        code = srv.proc.wait(240)
        assert code == 1
        out = srv.output()
        assert "broken" in out and "failed to load" in out
    finally:
        srv.stop()


def test_duplicate_names_refuse_to_start(minilm_path: str) -> None:
    srv = RemoteServer(
        ["--model", f"m={minilm_path}", "--model", f"m={minilm_path}"], wait_ready=False
    )
    try:
        assert srv.proc.wait(60) == 2
        assert "duplicate model name or alias 'm'" in srv.output()
    finally:
        srv.stop()
