"""Tenants end to end (#41): a real server process with a keys file. Scopes on every route
family (a model outside a key's scope is a model that does not exist, and is in no list),
OpenAI's rate-limit headers and 429s, permissions (Files/Batch API, /admin), expiry, reload on
a file change and on SIGHUP (a bad file keeps the keys in force), per-key metrics and access
log, and batch ownership by name across a key rotation, with the lines run as their owner."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import cohere
import httpx
import openai
import pytest

from tests.utils import RemoteServer, free_port, run_batch

pytestmark = pytest.mark.slow


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


KEYS = f"""
[[keys]]
name = "scoped"
key_sha256 = "{sha("scoped-key")}"
models = ["minilm"]

[[keys]]
name = "requests"
key_sha256 = "{sha("requests-key")}"
rpm = 2

[[keys]]
name = "tokens"
key_sha256 = "{sha("tokens-key")}"
models = ["minilm", "reranker", "classifier"]
tpm = 40

[[keys]]
name = "nobatch"
key = "nobatch-key"
batch = false

[[keys]]
name = "ops"
key_sha256 = "{sha("ops-key")}"
admin = true

[[keys]]
name = "scoped-ops"
key_sha256 = "{sha("scoped-ops-key")}"
models = ["minilm"]
admin = true

[[keys]]
name = "old"
key_sha256 = "{sha("old-key")}"
expires = "2020-01-01T00:00:00Z"

[[keys]]
name = "batchtpm"
key_sha256 = "{sha("batchtpm-key")}"
models = ["minilm"]
tpm = 30

[[keys]]
name = "owner"
key_sha256 = "{sha("owner-key-1")}"
models = ["minilm"]

[[keys]]
name = "pacer"
key_sha256 = "{sha("pacer-key")}"
models = ["minilm"]
tpm = 600

[[keys]]
name = "slowpace"
key_sha256 = "{sha("slowpace-key")}"
models = ["minilm"]
tpm = 60

[[keys]]
name = "rerank-only"
key_sha256 = "{sha("rerank-only-key")}"
models = ["reranker"]

[[keys]]
name = "secret-only"
key_sha256 = "{sha("secret-only-key")}"
models = ["secret"]
"""


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tenants") / "keys.toml"
    path.write_text(KEYS)
    return path


@pytest.fixture(scope="module")
def metrics_url() -> str:
    """The server's metrics port (--metrics-port): /metrics alone, no key."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def srv(keys_file: Path, minilm_path: str, metrics_url: str) -> Iterator[RemoteServer]:
    from tests.test_native_engine import tiny_cross_encoder

    config = keys_file.parent / "models.toml"
    reranker = tiny_cross_encoder(minilm_path, keys_file.parent / "reranker", 1)
    classifier = tiny_cross_encoder(minilm_path, keys_file.parent / "classifier", 3)
    config.write_text(
        f'[[models]]\nname = "minilm"\nmodel = "{minilm_path}"\naliases = ["mini"]\n\n'
        '[[models]]\nname = "secret"\nmodel = "debug/engine"\nengine = "debugengine"\n\n'
        f'[[models]]\nname = "reranker"\nmodel = "{reranker}"\n\n'
        f'[[models]]\nname = "classifier"\nmodel = "{classifier}"\n'
    )
    args = ["--config", str(config), "--keys-file", str(keys_file), "--api-key", "legacy"]
    args += ["--cache-bytes", "0", "--metrics-port", metrics_url.rsplit(":", 1)[1]]
    with RemoteServer(args) as server:
        yield server


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def post(srv: RemoteServer, path: str, key: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, headers=bearer(key), timeout=60)


def test_a_plain_key_is_warned_about_and_a_key_is_needed(srv: RemoteServer) -> None:
    assert "key 'nobatch' is written in plain text; write its key_sha256" in srv.output()
    body = {"model": "minilm", "input": "hi"}
    assert httpx.post(srv.url + "/v1/embeddings", json=body).status_code == 401
    assert post(srv, "/v1/embeddings", "legacy", body).status_code == 200  # --api-key too
    expired = post(srv, "/v1/embeddings", "old-key", body)
    assert expired.status_code == 401 and expired.json()["error"]["code"] == "expired_api_key"


def test_a_model_outside_the_scope_does_not_exist_on_any_route(srv: RemoteServer) -> None:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="scoped-key")
    assert sorted(m.id for m in client.models.list()) == ["mini", "minilm"]  # aliases follow
    with pytest.raises(openai.NotFoundError) as caught:
        client.embeddings.create(model="secret", input="hi")
    error = caught.value.body
    assert isinstance(error, dict) and error["code"] == "model_not_found"
    assert "Served models: minilm, mini." in error["message"]  # nothing of the other model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("secret")
    assert client.embeddings.create(model="mini", input="hi").data  # an alias is in scope
    co = cohere.ClientV2(base_url=srv.url, api_key="scoped-key")
    with pytest.raises(cohere.errors.NotFoundError):
        co.embed(model="secret", texts=["hi"], input_type="search_query", embedding_types=["float"])
    # every dialect's list and bare path
    for path in ("/models", "/v1/models"):
        listed = httpx.get(srv.url + path, headers=bearer("scoped-key")).json()["data"]
        assert {m["id"] for m in listed} == {"minilm", "mini"}, path
    for path, body in (
        ("/embeddings", {"model": "secret", "input": ["hi"]}),  # infinity's
        ("/v1/classify", {"model": "secret", "input": ["hi"]}),
        ("/tokenize", {"model": "secret", "prompt": "hi"}),  # vLLM's
        ("/api/embed", {"model": "secret", "input": "hi"}),  # Ollama's
        ("/openai/deployments/secret/embeddings", {"input": "hi"}),  # Azure's
        ("/openai/v1/embeddings", {"model": "secret", "input": "hi"}),
        ("/v1beta/models/secret:embedContent", {"content": {"parts": [{"text": "hi"}]}}),
    ):
        answer = post(srv, path, "scoped-key", body)
        assert answer.status_code == 404, (path, answer.text)
    # Voyage answers a model it does not have with a 400 in its own body
    voyage = post(srv, "/voyage/v1/embeddings", "scoped-key", {"model": "secret", "input": "hi"})
    assert voyage.status_code == 400 and "does not exist" in voyage.json()["detail"]
    tags = httpx.get(srv.url + "/api/tags", headers=bearer("scoped-key")).json()["models"]
    assert [m["model"] for m in tags] == ["minilm:latest"]  # Ollama's list: the scope too
    # a key without `models` sees them all
    everything = httpx.get(srv.url + "/v1/models", headers=bearer("nobatch-key")).json()
    served = {"minilm", "mini", "secret", "reranker", "classifier"}
    assert {m["id"] for m in everything["data"]} == served
    # a hostile Host header changes nothing: the decision reads the raw path
    hostile = httpx.post(
        srv.url + "/v1/embeddings",
        json={"model": "secret", "input": "x"},
        headers={**bearer("scoped-key"), "Host": "x/v1?"},
    )
    assert hostile.status_code == 404


def test_requests_per_minute_answer_as_openai_does(srv: RemoteServer) -> None:
    body = {"model": "secret", "input": ["abc"]}
    first = post(srv, "/v1/embeddings", "requests-key", body)
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert first.headers["x-ratelimit-reset-requests"].endswith("s")
    assert "x-ratelimit-limit-tokens" not in first.headers  # no tpm on this key
    assert post(srv, "/v1/embeddings", "requests-key", body).status_code == 200
    over = post(srv, "/v1/embeddings", "requests-key", body)  # 30 s per request to refill
    assert over.status_code == 429
    error = over.json()["error"]
    assert (error["code"], error["type"]) == ("rate_limit_exceeded", "requests")  # OpenAI's
    assert "requests per minute: limit 2" in error["message"]
    assert int(over.headers["retry-after"]) >= 1
    assert over.headers["x-ratelimit-remaining-requests"] == "0"
    # the same limit on another dialect: Cohere's body
    refused = post(srv, "/v2/embed", "requests-key", {"model": "secret", "texts": ["a"]})
    assert refused.status_code == 429 and "message" in refused.json()


def test_tokens_per_minute_count_what_usage_counts(srv: RemoteServer) -> None:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="tokens-key", max_retries=0)
    long = "word " * 60  # 62 tokens with [CLS] and [SEP]: more than the whole tpm of 40
    with pytest.raises(openai.RateLimitError) as caught:
        client.embeddings.create(model="minilm", input=long)
    assert "Request too large for key 'tokens' on tokens per min (TPM): Limit 40" in str(
        caught.value
    )
    body = caught.value.body
    assert isinstance(body, dict) and (body["code"], body["type"]) == (
        "rate_limit_exceeded",
        "tokens",
    )  # what SDKs and dashboards key on, as OpenAI answers it
    raw = client.embeddings.with_raw_response.create(model="minilm", input="word " * 20)
    assert raw.parse().usage.prompt_tokens == 22
    assert raw.headers["x-ratelimit-limit-tokens"] == "40"
    assert int(raw.headers["x-ratelimit-remaining-tokens"]) == 18  # taken before it ran
    with pytest.raises(openai.RateLimitError) as caught:
        client.embeddings.create(model="minilm", input="word " * 20)  # 22 > 18 left
    assert "tokens per minute: limit 40 (22 asked)" in str(caught.value)
    # a cross-encoder's pairs and a classifier's texts are counted before they run too
    for path, body in (
        ("/v1/rerank", {"model": "reranker", "query": long, "documents": ["a", "b"]}),
        ("/v1/classify", {"model": "classifier", "input": [long]}),
    ):
        over = post(srv, path, "tokens-key", body)
        assert over.status_code == 429, (path, over.text)
        assert "Request too large" in over.text and "Limit 40" in over.text, path
    # #61.11: Ollama's /api/show is a metadata read: it spends no tokens (it was a 429 here)
    left = 18  # what the 22-token request above left
    while left >= 3:  # n words are n + 2 tokens: take what is left, down to under 3
        drained = client.embeddings.with_raw_response.create(
            model="minilm", input="word " * (left - 2)
        )
        left = int(drained.headers["x-ratelimit-remaining-tokens"])
    shown = post(srv, "/api/show", "tokens-key", {"model": "minilm"})
    assert shown.status_code == 200, shown.text  # reading a model costs nothing...
    refused = post(srv, "/api/embed", "tokens-key", {"model": "minilm", "input": "hi"})
    assert refused.status_code == 429  # ...where the bucket has no tokens left


def test_permissions_for_batches_and_admin(srv: RemoteServer) -> None:
    files = httpx.get(srv.url + "/v1/files", headers=bearer("nobatch-key"))
    assert files.status_code == 403 and files.json()["error"]["code"] == "permission_denied"
    assert httpx.get(srv.url + "/v1/files", headers=bearer("scoped-key")).status_code == 200
    admin = httpx.get(srv.url + "/admin/models", headers=bearer("ops-key"))
    assert admin.status_code == 200  # admin = true opens /admin without --admin-key
    assert {m["id"] for m in admin.json()["data"]} == {"minilm", "secret", "reranker", "classifier"}
    # an admin key with a scope sees and acts on the models in it only
    scoped = httpx.get(srv.url + "/admin/models", headers=bearer("scoped-ops-key"))
    assert [m["id"] for m in scoped.json()["data"]] == ["minilm"]
    hidden = httpx.post(srv.url + "/admin/models/secret/unload", headers=bearer("scoped-ops-key"))
    assert hidden.status_code == 404
    assert hidden.json()["error"]["message"].endswith("Served models: minilm, mini.")
    assert httpx.get(srv.url + "/admin/models", headers=bearer("scoped-key")).status_code == 401
    # nothing loads a model that is not in the configuration: not the admin API, not a request
    for name in ("sentence-transformers%2Fall-mpnet-base-v2", "..%2F..%2Ftmp"):
        load = httpx.post(srv.url + f"/admin/models/{name}/load", headers=bearer("ops-key"))
        assert load.status_code == 404, load.text
    asked = post(srv, "/v1/embeddings", "nobatch-key", {"model": "/tmp", "input": "x"})
    assert asked.status_code == 404


def test_usage_by_key_in_metrics_and_the_access_log(srv: RemoteServer, metrics_url: str) -> None:
    post(srv, "/v1/embeddings", "scoped-key", {"model": "minilm", "input": ["a b c"]})
    # with a keys file /metrics is an admin's: its series name every key and model
    assert httpx.get(srv.url + "/metrics").status_code == 401
    refused = httpx.get(srv.url + "/metrics", headers=bearer("scoped-key"))
    assert refused.status_code == 403 and "admin = true" in refused.json()["error"]["message"]
    metrics = httpx.get(srv.url + "/metrics", headers=bearer("ops-key")).text
    assert 'openai_compat_key_requests_total{key="scoped",status="200"}' in metrics
    # #61 item 13: the platform's scraper reads the same registry on the metrics port, with no
    # credential, and that port serves nothing else (an API key gets no route there either)
    scraped = httpx.get(metrics_url + "/metrics")
    assert scraped.status_code == 200, scraped.text
    assert scraped.headers["content-type"].startswith("text/plain; version=")
    assert 'openai_compat_key_requests_total{key="scoped",status="200"}' in scraped.text
    assert "openai_compat_queued_inputs" in scraped.text  # the autoscaler's series
    for path in ("/v1/models", "/health", "/ready", "/admin/models", "/docs"):
        other = httpx.get(metrics_url + path, headers=bearer("ops-key"))
        assert other.status_code == 404, (path, other.text)
    body = {"model": "minilm", "input": "x"}
    embed = httpx.post(metrics_url + "/v1/embeddings", json=body, headers=bearer("scoped-key"))
    assert embed.status_code == 404
    assert httpx.post(metrics_url + "/metrics").status_code == 405
    assert 'openai_compat_key_requests_total{key="requests",status="429"}' in metrics
    assert 'openai_compat_key_tokens_total{key="scoped"}' in metrics
    assert "scoped-key" not in srv.output()  # the key itself is never written


def test_reload_on_change_and_on_sighup_keeping_the_keys_on_a_bad_file(
    srv: RemoteServer, keys_file: Path
) -> None:
    body = {"model": "minilm", "input": "hi"}
    keys_file.write_text(KEYS + f'\n[[keys]]\nname = "carol"\nkey_sha256 = "{sha("carol")}"\n')
    deadline = time.monotonic() + 10  # checked every second
    while post(srv, "/v1/embeddings", "carol", body).status_code != 200:
        assert time.monotonic() < deadline, "the changed file was not read"
        time.sleep(0.2)
    good = keys_file.read_text()
    keys_file.write_text(good + "\n[[keys]]\nname = 'broken'\n")
    os.kill(srv.proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "keys file not reloaded, the keys in force stay" not in srv.output():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert "give exactly one of key_sha256" in srv.output()
    assert post(srv, "/v1/embeddings", "carol", body).status_code == 200  # still in force
    keys_file.write_text(KEYS)  # carol gone
    deadline = time.monotonic() + 10
    while post(srv, "/v1/embeddings", "carol", body).status_code != 401:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_batches_are_owned_by_name_and_run_as_their_owner(
    srv: RemoteServer, keys_file: Path
) -> None:
    lines = [
        {"custom_id": "in-scope", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "minilm", "input": "hello"}},
        {"custom_id": "out-of-scope", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "secret", "input": "hello"}},
    ]  # fmt: skip
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="owner-key-1")
    upload = client.files.create(
        file=("in.jsonl", "\n".join(json.dumps(x) for x in lines).encode()), purpose="batch"
    )
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    # another key does not see it
    seen = httpx.get(srv.url + f"/v1/batches/{batch.id}", headers=bearer("scoped-key"))
    assert seen.status_code == 404
    # rotate the owner's key: same name, new key
    keys_file.write_text(KEYS.replace(sha("owner-key-1"), sha("owner-key-2")))
    rotated = openai.OpenAI(base_url=srv.url + "/v1", api_key="owner-key-2")
    deadline = time.monotonic() + 60
    while True:
        try:
            job = rotated.batches.retrieve(batch.id)
        except openai.AuthenticationError:
            job = None  # the file is not read yet
        if job is not None and job.status in ("completed", "failed"):
            break
        assert time.monotonic() < deadline, job
        time.sleep(0.3)
    assert job.status == "completed" and job.request_counts is not None
    assert (job.request_counts.completed, job.request_counts.failed) == (1, 1)
    assert job.error_file_id is not None
    errors = rotated.files.content(job.error_file_id).text
    row = json.loads(errors.splitlines()[0])
    assert row["custom_id"] == "out-of-scope"  # the line ran with the owner's scope
    assert row["response"]["status_code"] == 404
    with pytest.raises(openai.AuthenticationError):
        client.batches.retrieve(batch.id)  # the old key is gone
    keys_file.write_text(KEYS)


def test_a_batch_line_larger_than_the_whole_tpm_fails_instead_of_waiting(
    srv: RemoteServer,
) -> None:
    """Batch lines run at the owner's pace (a rate 429 is tried again), but one larger than
    the owner's whole tokens per minute can never run: it fails, and the batch completes."""
    lines = [
        {"custom_id": "small", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "minilm", "input": "hello"}},
        {"custom_id": "huge", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "minilm", "input": "word " * 40}},
    ]  # fmt: skip
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="batchtpm-key")
    job = run_batch(client, lines)
    assert job.request_counts is not None
    assert (job.request_counts.completed, job.request_counts.failed) == (1, 1)
    assert job.error_file_id is not None
    row = json.loads(client.files.content(job.error_file_id).text.splitlines()[0])
    assert row["custom_id"] == "huge" and row["response"]["status_code"] == 429
    error = row["response"]["body"]["error"]
    assert (error["code"], error["type"]) == ("rate_limit_exceeded", "tokens")
    assert error["message"].startswith("Request too large")


def test_a_batch_under_a_tpm_waits_for_the_owner_budget_and_finishes(srv: RemoteServer) -> None:
    """Four lines of 160 tokens under a tpm of 600 (10 a second): three run at once, the
    fourth waits for its 160 tokens (about 4 s) and runs; none is failed for the rate and no
    line is refused over and over (the runner dropped whole waves before: 0 completed)."""
    text = "word " * 158  # 160 tokens with [CLS] and [SEP]
    lines = [
        {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "minilm", "input": text}}
        for i in range(4)
    ]  # fmt: skip
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="pacer-key", max_retries=0)
    started = time.monotonic()
    job = run_batch(client, lines, timeout=90)
    assert job.status == "completed" and job.request_counts is not None
    assert (job.request_counts.completed, job.request_counts.failed) == (4, 0)
    assert time.monotonic() - started >= 3.0  # the fourth line waited for its tokens
    assert job.output_file_id is not None
    rows = [json.loads(r) for r in client.files.content(job.output_file_id).text.splitlines()]
    assert sorted(r["custom_id"] for r in rows) == [f"line-{i}" for i in range(4)]
    assert all(r["response"]["body"]["usage"]["prompt_tokens"] == 160 for r in rows)
    # the lines took 640 tokens: the owner's bucket holds what refilled since, not a refund
    probe = post(srv, "/v1/embeddings", "pacer-key", {"model": "minilm", "input": "hi"})
    assert int(probe.headers["x-ratelimit-remaining-tokens"]) < 100, probe.headers


def test_a_paced_batch_holds_no_other_keys_batch_and_a_cancel_keeps_what_ran(
    srv: RemoteServer,
) -> None:
    """#61 item 3: a tpm-60 key's batch of six 20-token lines runs three at once and parks
    the rest on its budget (20 s a line); another key's one-line batch, submitted after,
    completes meanwhile (it sat in `validating` behind it before); a cancel keeps the three
    lines that ran and were charged (the whole wave was dropped before)."""
    text = "word " * 18  # 20 tokens with [CLS] and [SEP]
    paced_lines = [
        {"custom_id": f"paced-{i}", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "minilm", "input": text}}
        for i in range(6)
    ]  # fmt: skip
    paced = openai.OpenAI(base_url=srv.url + "/v1", api_key="slowpace-key", max_retries=0)
    upload = paced.files.create(
        file=("in.jsonl", "\n".join(json.dumps(x) for x in paced_lines).encode()),
        purpose="batch",
    )
    slow = paced.batches.create(
        input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    deadline = time.monotonic() + 30
    while (job := paced.batches.retrieve(slow.id)).request_counts is None or (
        job.request_counts.total != 6
    ):
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    other = openai.OpenAI(base_url=srv.url + "/v1", api_key="scoped-key", max_retries=0)
    line = {"custom_id": "quick", "method": "POST", "url": "/v1/embeddings",
            "body": {"model": "minilm", "input": "hello"}}  # fmt: skip
    started = time.monotonic()
    quick = run_batch(other, [line], timeout=15)
    assert quick.status == "completed", quick
    assert time.monotonic() - started < 10
    assert paced.batches.retrieve(slow.id).status == "in_progress"  # still paced
    paced.batches.cancel(slow.id)
    deadline = time.monotonic() + 30
    while (job := paced.batches.retrieve(slow.id)).status != "cancelled":
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
    assert job.request_counts is not None and job.request_counts.completed == 3
    assert job.output_file_id is not None
    rows = [json.loads(r) for r in paced.files.content(job.output_file_id).text.splitlines()]
    assert sorted(r["custom_id"] for r in rows) == ["paced-0", "paced-1", "paced-2"]
    assert all(r["response"]["body"]["usage"]["prompt_tokens"] == 20 for r in rows)


def test_tei_root_and_info_serve_the_first_model_the_key_can_see(srv: RemoteServer) -> None:
    """POST / and /info resolve their model like every route (scope, lease, lazy load): a
    key scoped to the reranker (the third model) gets the reranker, never minilm (the first
    served), and TEI's routes without a model name use the first able model in the key's
    scope, not a hidden server-wide default."""
    texts = ["A man is eating food.", "The stock market crashed today."]
    rerank = {"query": "Who is eating?", "texts": texts}
    root = post(srv, "/", "rerank-only-key", rerank)
    assert root.status_code == 200, root.text
    assert root.json() == post(srv, "/rerank", "rerank-only-key", rerank).json()
    info = httpx.get(srv.url + "/info", headers=bearer("rerank-only-key")).json()
    assert info["served_model_name"] == "reranker" and "reranker" in info["model_type"]
    # minilm serves POST / to a key that sees it (the first served model)
    as_scoped = post(srv, "/", "scoped-key", {"inputs": "hello"})
    direct = post(srv, "/v1/embeddings", "scoped-key", {"model": "minilm", "input": "hello"})
    assert as_scoped.json()[0] == pytest.approx(direct.json()["data"][0]["embedding"], abs=1e-6)
    # a key that sees only the debug model: TEI's /embed and vLLM's /tokenize use it
    embedded = post(srv, "/embed", "secret-only-key", {"inputs": "hello"})
    assert embedded.status_code == 200, embedded.text
    named = post(srv, "/v1/embeddings", "secret-only-key", {"model": "secret", "input": "hello"})
    assert embedded.json()[0] == pytest.approx(named.json()["data"][0]["embedding"], abs=1e-6)
    info = httpx.get(srv.url + "/info", headers=bearer("secret-only-key")).json()
    assert info["served_model_name"] == "secret"
    # the tutorial's routes name only the models the key may use in their errors
    body = {"query": "q", "docs": ["a"], "model_index": 9}
    refused = post(srv, "/rerank", "secret-only-key", body)
    assert refused.status_code == 400, refused.text
    message = refused.json()["error"]["message"]
    assert "(1=secret)" in message and "=minilm" not in message and "=reranker" not in message


def test_a_flooding_key_does_not_hold_back_another_on_a_slow_engine(tmp_path: Path) -> None:
    """Fair share end to end, ordered by events, not timed: on an engine that takes 0.05 s a
    batch (tests/slow_engine.py), key A queues 48 requests of 16 inputs (24 batches), then key
    B sends 2. B is answered after at most a few of A's requests, not after A's queue (on one
    shared FIFO, B would finish last)."""
    import asyncio

    config = tmp_path / "models.toml"
    config.write_text(
        '[[models]]\nname = "debug"\nmodel = "debug/engine"\nengine = "debugengine"\n'
    )
    keys = tmp_path / "keys.toml"
    keys.write_text(
        "".join(f'[[keys]]\nname = "{n}"\nkey_sha256 = "{sha(n)}"\n\n' for n in ("A", "B"))
    )
    body = {"model": "debug", "input": ["twelve chars"] * 16}
    with RemoteServer(
        ["--config", str(config), "--keys-file", str(keys), "--admin-key", "adm"],
        env={"OPENAI_COMPAT_TEST_BATCH_SECONDS": "0.05"},
        slow_engine=True,
    ) as server:
        done: list[str] = []

        async def send(client: httpx.AsyncClient, key: str) -> None:
            answer = await client.post("/v1/embeddings", json=body, headers=bearer(key))
            assert answer.status_code == 200, answer.text
            done.append(key)

        async def main() -> None:
            async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
                flood = [asyncio.create_task(send(client, "A")) for _ in range(48)]
                while True:  # A's inputs are all queued before B comes
                    text = (await client.get("/metrics", headers=bearer("adm"))).text
                    line = next(x for x in text.splitlines() if x.startswith(QUEUED))
                    if float(line.rsplit(" ", 1)[1]) >= 48 * 16:
                        break
                    await asyncio.sleep(0.01)
                await asyncio.gather(send(client, "B"), send(client, "B"), *flood)

        asyncio.run(main())
    a_before_b = done.index("B", done.index("B") + 1) - 1  # A's answers before B's last
    assert a_before_b <= 6, done


QUEUED = 'openai_compat_queued_inputs{model="debug"}'


def test_late_chunking_and_text_pairs_are_charged_before_the_model_runs(
    srv: RemoteServer,
) -> None:
    """Every path takes a key's tokens before the model runs: late chunking (it tokenized but
    never reserved) and TEI's /predict on pairs (counted after the logits) were free, so a
    tpm of 200 passed 11,712 tokens in one request."""
    words = "word " * 30  # 32 tokens with [CLS] and [SEP]: two of them are 64 > 40
    late = {"model": "minilm", "input": [words, words], "long_input": "late", "chunk_tokens": 8}
    over = post(srv, "/v1/embeddings", "tokens-key", late)
    assert over.status_code == 429 and "Request too large" in over.text, over.text
    pairs = {"inputs": [[words, words]]}  # one pair: 62 tokens
    over = post(srv, "/predict", "tokens-key", pairs)
    assert over.status_code == 429 and "Request too large" in over.text, over.text
    # a chunk size near 2**63 is one chunk of the document, not a 500 (numpy overflow)
    huge = {**late, "input": "a few words", "chunk_tokens": 2**63 - 1}
    answer = post(srv, "/v1/embeddings", "scoped-key", huge)
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["data"][0]["chunks"]) == 1


def test_a_newline_in_the_path_cannot_forge_an_access_log_line(srv: RemoteServer) -> None:
    forged = "FORGED-LINE 200 0.1ms"
    answer = httpx.get(srv.url + "/v1/nothing%0a" + forged.replace(" ", "%20"))
    assert answer.status_code in (401, 404)
    answer = httpx.get(
        srv.url + "/v1/nothing%0a" + forged.replace(" ", "%20"), headers=bearer("scoped-key")
    )
    assert answer.status_code == 404
    assert "\\n" + forged in answer.json()["error"]["message"]  # escaped where it is echoed
    lines = srv.output().splitlines()
    assert not any(line.startswith("FORGED-LINE") for line in lines)
    assert any("/v1/nothing\\nFORGED-LINE" in line for line in lines)
