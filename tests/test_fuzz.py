"""schemathesis against the live server's own OpenAPI schema, every route: no 5xx, and every
response conforms to the schema. Bounded for CI; for a long run:

    FUZZ_EXAMPLES=500 python -m pytest tests/test_fuzz.py

(schemathesis' own pytest plugin does not run on pytest 9 yet, so operations are driven with
Hypothesis directly.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.utils import RemoteServer

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[RemoteServer]:
    with RemoteServer(["--max-inputs-per-request", "64", "--max-rerank-documents", "64"]) as srv:
        yield srv


def _operations(url: str) -> list:  # type: ignore[type-arg]
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def test_every_operation_is_documented(fuzz_server: RemoteServer) -> None:
    labels = {op.label for op in _operations(fuzz_server.url)}
    for expected in (
        "POST /v1/embeddings",
        "POST /v1/rerank",
        "POST /v2/rerank",
        "POST /v1/classify",
        "GET /v1/models",
        "GET /health",
        "GET /ready",
        "POST /embed",
        "POST /classify",
    ):
        assert expected in labels


def test_api_conforms_and_never_fails(fuzz_server: RemoteServer) -> None:
    failures: list[str] = []
    for operation in _operations(fuzz_server.url):

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case) -> None:  # type: ignore[no-untyped-def]
            # Schema-valid is not always acceptable: a model name that is not served, a
            # model_index past the configured list, an empty input list are 4xx by design.
            case.call_and_validate(
                timeout=60, excluded_checks=[schemathesis.checks.positive_data_acceptance]
            )

        try:
            run()
        except Exception as exc:  # collect every operation's failure, then report all
            failures.append(f"{operation.label}: {exc}"[:3000])
    assert not failures, "\n\n".join(failures)
    # the run really reached the server, operation after operation
    metrics = httpx.get(fuzz_server.url + "/metrics").text
    served = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("openai_compat_requests_total{")
    )
    assert served >= 10 * len(_operations(fuzz_server.url))
