"""/docs and /redoc in Debian's chromium with every address but this server's blocked: both
render the API's operations from what the server itself serves (no CDN), and the browser
console stays clean (a Content-Security-Policy violation would show there)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.utils import ROOT, RemoteServer, server_with

pytestmark = pytest.mark.slow

ARTIFACTS = ROOT / "test-artifacts" / "docs"
KEY = "docs-secret"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RemoteServer]:
    debug = [{"name": "debug", "model": "debug/engine", "engine": "debugengine"}]
    args = ["--api-key", KEY]  # docs stay readable without it (protect_docs_and_metrics off)
    with server_with(tmp_path_factory.mktemp("docs-cfg"), debug, args) as server:
        yield server


def _offline_page(browser: Any, srv: RemoteServer) -> tuple[Any, list[str], list[str]]:
    """A tab that can reach this server only; what it tried elsewhere, and console errors."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    blocked: list[str] = []
    errors: list[str] = []

    def only_this_server(route: Any) -> None:
        url = route.request.url
        if url.startswith(("data:", "blob:")) or urlsplit(url).netloc == f"{srv.host}:{srv.port}":
            route.continue_()
        else:
            blocked.append(url)
            route.abort()

    context.route("**/*", only_this_server)
    page = context.new_page()
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return page, blocked, errors


def test_swagger_ui_renders_every_operation_offline(browser: Any, srv: RemoteServer) -> None:
    page, blocked, errors = _offline_page(browser, srv)
    page.goto(srv.url + "/docs")
    page.wait_for_selector(".opblock", timeout=30_000)
    paths = page.eval_on_selector_all(
        ".opblock-summary-path", "els => els.map(e => e.getAttribute('data-path'))"
    )
    schema = httpx.get(srv.url + "/openapi.json").json()
    documented = sum(len(ops) for ops in schema["paths"].values())
    assert len(paths) == documented and "/v1/embeddings" in paths
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "swagger.png"))
    page.context.close()
    assert blocked == [] and errors == [], (blocked, errors)


def test_redoc_renders_the_reference_offline(browser: Any, srv: RemoteServer) -> None:
    page, blocked, errors = _offline_page(browser, srv)
    page.goto(srv.url + "/redoc")
    page.wait_for_selector("h1:has-text('openai-compat')", timeout=30_000)
    page.wait_for_selector("[data-section-id^='operation/']", state="attached", timeout=30_000)
    schema = httpx.get(srv.url + "/openapi.json").json()
    ids = {op["operationId"] for ops in schema["paths"].values() for op in ops.values()}
    shown = page.eval_on_selector_all(
        "[data-section-id^='operation/']",
        "els => els.map(e => e.getAttribute('data-section-id').slice(10))",
    )
    assert set(shown) == ids  # every operation is in the reference
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "redoc.png"))
    page.context.close()
    # ReDoc's footer points at its maker's logo on a CDN: the policy stops it in the browser
    # (so it is never requested) and says so on the console; nothing else may show there.
    logo = "'https://cdn.redoc.ly/redoc/logo-mini.svg' violates the following Content Security"
    assert blocked == [] and [e for e in errors if logo not in e] == [], (blocked, errors)


def test_docs_pages_allow_only_this_server() -> None:
    from openai_compat.api.docs import DOCS_HEADERS

    policy = DOCS_HEADERS["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "script-src 'self';" in policy
    assert "http" not in policy  # no other origin, no CDN


def test_the_docs_assets_need_no_key_and_the_api_still_does(srv: RemoteServer) -> None:
    for path in ("/docs", "/redoc", "/docs/assets/swagger-ui-bundle.js", "/openapi.json"):
        assert httpx.get(srv.url + path).status_code == 200, path
    assert httpx.get(srv.base_url + "/models").status_code == 401
