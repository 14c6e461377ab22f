"""The playground page in a real browser: Debian's chromium, headless, driven by Playwright.

Each panel is used as a person would (type, pick, click); what the page shows is checked against
what the API answers for the same input, and the browser console must stay clean. Screenshots
of every panel land in test-artifacts/playground/ (PLAYGROUND_README_SHOT=1 also refreshes
docs/playground.png, the README's).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.media_samples import data_uri, png
from tests.utils import ROOT, RemoteServer, server_with

pytestmark = pytest.mark.slow

ARTIFACTS = ROOT / "test-artifacts" / "playground"
KEY = "playground-secret"


@pytest.fixture(scope="module")
def srv(
    tmp_path_factory: pytest.TempPathFactory,
    trained_models: dict[str, Path],
    tiny_media_models: dict[str, Path],
    splade_path: Path,
) -> Iterator[RemoteServer]:
    models = [
        {
            "name": "minilm",
            "model": "builtin:all-MiniLM-L6-v2",
            "prompts": {"query": "query: ", "passage": "passage: "},
        },
        {"name": "reranker", "model": trained_models["reranker"]},
        {"name": "clip", "model": tiny_media_models["clip"]},
        {"name": "splade", "model": splade_path},
        {"name": "colpali", "model": str(_colpali(tmp_path_factory))},
    ]
    data = tmp_path_factory.mktemp("playground-data")
    folder = tmp_path_factory.mktemp("cfg")
    with server_with(folder, models, ["--data-dir", str(data)]) as server:
        yield server


def _colpali(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from openai_compat.models.demo_vision import build_colpali

    return build_colpali(tmp_path_factory.mktemp("colpali") / "colpali")


class Page:
    """A fresh tab on the playground that records console errors."""

    def __init__(self, browser: Any, url: str, **context: Any) -> None:
        self.context = browser.new_context(**context)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.allowed: tuple[str, ...] = ()  # console errors a test provokes on purpose
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(url + "/playground")
        self.page.wait_for_selector("body[data-ready=true]")

    def tab(self, name: str) -> None:
        self.page.click(f".tab[data-panel={name}]")

    def shot(self, name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

    def close(self) -> None:
        errors = [e for e in self.errors if not any(a in e for a in self.allowed)]
        self.context.close()
        assert errors == [], errors


@pytest.fixture
def page(browser: Any, srv: RemoteServer) -> Iterator[Page]:
    p = Page(browser, srv.url, viewport={"width": 1280, "height": 900})
    yield p
    p.close()


def _post(srv: RemoteServer, path: str, body: Any, **kw: Any) -> Any:
    r = httpx.post(srv.url + path, json=body, timeout=60, **kw)
    assert r.status_code == 200, r.text
    return r.json()


def _get(srv: RemoteServer, path: str) -> Any:
    r = httpx.get(srv.url + path, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _unit(m: np.ndarray) -> np.ndarray:
    return m / np.linalg.norm(m, axis=-1, keepdims=True)


def test_similarity_heatmap_equals_the_cosines_of_the_api_vectors(
    page: Page, srv: RemoteServer
) -> None:
    texts = ["A man is eating food.", "A man eats a meal.", "The stock market fell."]
    p = page.page
    p.select_option("#sim-model", "minilm")
    p.select_option("#sim-prompt", "query")
    p.fill("#sim-texts", "\n".join(texts))
    assert p.get_attribute("#sim-result", "data-runs") == "1"  # the example, computed on open
    p.click("#sim-run")
    p.wait_for_selector("#sim-result[data-runs='2'] #sim-matrix")
    api = _post(srv, "/v1/embeddings", {"model": "minilm", "input": texts, "input_type": "query"})
    vectors = _unit(np.asarray([d["embedding"] for d in api["data"]]))
    want = vectors @ vectors.T
    cells = p.eval_on_selector_all(
        "#sim-matrix td",
        "cells => cells.map(c => [+c.dataset.i, +c.dataset.j, +c.dataset.value, c.textContent])",
    )
    assert len(cells) == 9
    for i, j, value, shown in cells:
        assert value == pytest.approx(want[i, j], abs=1e-6)
        assert shown == f"{want[i, j]:.3f}"
    # the prompt changed the vectors: without it they differ
    plain = _post(srv, "/v1/embeddings", {"model": "minilm", "input": texts[:1]})
    assert not np.allclose(plain["data"][0]["embedding"], api["data"][0]["embedding"])
    page.shot("similarity")
    if os.environ.get("PLAYGROUND_README_SHOT"):
        p.screenshot(path=str(ROOT / "docs" / "playground.png"))


def test_rerank_lists_documents_in_the_apis_order_with_its_scores(
    page: Page, srv: RemoteServer
) -> None:
    query = "How do I cook pasta?"
    docs = ["The stock market fell today.", "Boil salted water and cook the pasta.", "Paris."]
    p = page.page
    page.tab("rerank")
    p.select_option("#rerank-model", "reranker")
    p.fill("#rerank-query", query)
    p.fill("#rerank-docs", "\n".join(docs))
    p.click("#rerank-run")
    p.wait_for_selector("#rerank-list li")
    shown = p.eval_on_selector_all(
        "#rerank-list li",
        "items => items.map(li => [+li.dataset.index, +li.dataset.score, "
        "li.querySelector('.name').textContent])",
    )
    api = _post(srv, "/v1/rerank", {"model": "reranker", "query": query, "documents": docs})
    assert [i for i, _, _ in shown] == [r["index"] for r in api["results"]]
    assert shown[0][2] == docs[1]
    for (_, score, _), r in zip(shown, api["results"], strict=True):
        assert score == pytest.approx(r["relevance_score"], abs=1e-6)
    page.shot("rerank")


def test_tokens_are_the_models_own_and_truncation_is_marked(page: Page, srv: RemoteServer) -> None:
    text = "Tokenizers split lovelace into pieces. " + "word " * 260
    p = page.page
    page.tab("tokens")
    p.select_option("#tok-model", "minilm")
    p.fill("#tok-text", text)
    p.click("#tok-run")
    p.wait_for_selector("#tok-list .tok")
    api = _post(srv, "/tokenize", {"model": "minilm", "prompt": text, "return_token_strs": True})
    chips = p.eval_on_selector_all(
        "#tok-list .tok",
        "cs => cs.map(c => [+c.dataset.id, c.textContent, c.classList.contains('cut')])",
    )
    assert [c[0] for c in chips] == api["tokens"]
    assert [c[1] for c in chips] == api["token_strs"]
    assert api["token_strs"][:3] == ["[CLS]", "token", "##izer"]
    assert sum(c[2] for c in chips) == api["count"] - api["max_model_len"] == len(chips) - 256
    summary = p.text_content("#tok-summary")
    assert f"{api['count']} tokens" in summary and "truncates the last" in summary
    page.shot("tokens")


def test_images_match_captions_with_the_apis_cosines(page: Page, srv: RemoteServer) -> None:
    captions = ["a red square", "a photo of a dog", "a diagram"]
    image = png()
    p = page.page
    page.tab("images")
    p.select_option("#img-model", "clip")
    p.set_input_files(
        "#img-file", files=[{"name": "red.png", "mimeType": "image/png", "buffer": image}]
    )
    p.wait_for_selector("#img-preview:not([hidden])")
    p.fill("#img-captions", "\n".join(captions))
    p.click("#img-run")
    p.wait_for_selector("#img-list li")
    img = _post(
        srv,
        "/v1/embeddings",
        {"model": "clip", "input": [data_uri(image, "image/png")], "modality": "image"},
    )
    txt = _post(srv, "/v1/embeddings", {"model": "clip", "input": captions})
    v = _unit(np.asarray(img["data"][0]["embedding"]))
    want = _unit(np.asarray([d["embedding"] for d in txt["data"]])) @ v
    shown = p.eval_on_selector_all(
        "#img-list li", "items => items.map(li => [li.dataset.caption, +li.dataset.score])"
    )
    assert [c for c, _ in shown] == captions
    for (_, score), w in zip(shown, want, strict=True):
        assert score == pytest.approx(w, abs=1e-5)
    best = captions[int(np.argmax(want))]
    assert p.text_content("#img-best") == f"Best match: {best}"
    assert p.get_attribute("#img-list li.best", "data-caption") == best
    page.shot("images")


def test_sparse_terms_chart_and_an_error_as_the_server_phrased_it(
    page: Page, srv: RemoteServer
) -> None:
    text = "Replacement filter for the ZQ-9183 vacuum cleaner"
    p = page.page
    page.tab("sparse")
    p.select_option("#sparse-model", "splade")
    p.fill("#sparse-text", text)
    p.fill("#sparse-k", "10")
    p.click("#sparse-run")
    p.wait_for_selector("#sparse-list li")
    api = _post(
        srv,
        "/v1/embeddings",
        {"model": "splade", "input": text, "top_k": 10, "return_tokens": True},
    )["data"][0]["embedding"]
    want = sorted(zip(api["tokens"], api["values"], strict=True), key=lambda tv: -tv[1])
    shown = p.eval_on_selector_all(
        "#sparse-list li", "items => items.map(li => [li.dataset.token, +li.dataset.weight])"
    )
    assert [t for t, _ in shown] == [t for t, _ in want]
    assert [w for _, w in shown] == pytest.approx([w for _, w in want], abs=1e-6)
    page.shot("sparse")
    p.fill("#sparse-k", "0")  # the server's 400, shown as it phrased it
    p.click("#sparse-run")
    p.wait_for_selector("#sparse-result .error")
    assert p.text_content("#sparse-result .error") == "400: 'top_k' must be at least 1, got 0."
    page.allowed = ("status of 400 (Bad Request)",)  # chromium logs the failed fetch itself


def test_server_panel_shows_the_models_and_live_metrics(page: Page, srv: RemoteServer) -> None:
    def total() -> float:
        text = httpx.get(srv.url + "/metrics").text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("openai_compat_requests_total{")
        )

    p = page.page
    for _ in range(3):
        _post(srv, "/v1/embeddings", {"model": "minilm", "input": "load"})
    # a finished batch job, shown with its progress
    lines = [
        json.dumps(
            {
                "custom_id": f"p{i}",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": "minilm", "input": f"text {i}"},
            }
        )
        for i in range(5)
    ]
    up = httpx.post(
        srv.url + "/v1/files",
        data={"purpose": "batch"},
        files={"file": ("p.jsonl", "\n".join(lines).encode())},
    ).json()
    batch = _post(
        srv,
        "/v1/batches",
        {"input_file_id": up["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"},
    )
    deadline = time.monotonic() + 60
    while httpx.get(srv.url + f"/v1/batches/{batch['id']}").json()["status"] != "completed":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    before = total()
    page.tab("server")
    # two polls: a rate needs two samples (waiting by selector: the page's CSP forbids the
    # string evaluation wait_for_function uses)
    p.wait_for_selector("#srv-updated[data-polls='2']", timeout=15_000)
    shown = float(p.get_attribute("#srv-requests", "data-value") or "nan")
    after = total()
    assert before <= shown <= after
    rows = p.eval_on_selector_all(
        "#srv-models tbody tr",
        "rs => rs.map(r => [...r.cells].map(c => c.textContent))",
    )
    cards = httpx.get(srv.url + "/v1/models").json()["data"]
    assert [r[0] for r in rows] == [c["id"] for c in cards]
    assert [r[1] for r in rows] == ["loaded"] * len(cards)  # every model eager here
    metrics = httpx.get(srv.url + "/metrics").text
    for row in rows:  # resident: the measured size /metrics reports, in MiB
        line = f'openai_compat_model_resident_bytes{{model="{row[0]}"}} '
        size = float(next(m for m in metrics.splitlines() if m.startswith(line)).split()[-1])
        shown, unit = row[2].split()
        assert unit == "MiB" and abs(float(shown) - size / 2**20) <= 0.051 and size > 0, row
    assert [r[3] for r in rows] == [", ".join(c["capabilities"]) for c in cards]
    assert [r[6] for r in rows] == ["0"] * len(cards)  # nothing queued
    assert "req/s" in (p.text_content("#srv-rate") or "")
    row = p.locator(f"#srv-batches tr[data-batch='{batch['id']}']")
    assert row.get_attribute("data-done") == row.get_attribute("data-total") == "5"
    assert row.locator(".status").text_content() == "completed"
    page.shot("server")


def test_page_search_ranks_page_images_as_the_rerank_api_does(
    page: Page, srv: RemoteServer
) -> None:
    """The pages panel: a few page images dropped, a query, the pages ranked with their
    MaxSim scores (the API's own answer), the best one named and shown first."""
    import base64

    shots = [png(60, 80, (200, 30, 30)), png(80, 60, (30, 200, 30)), png(70, 70, (30, 30, 200))]
    names = ["red.png", "green.png", "blue.png"]
    query = "what is the total amount"
    p = page.page
    page.tab("pages")
    p.select_option("#pages-model", "colpali")
    files = [
        {"name": n, "mimeType": "image/png", "buffer": b} for n, b in zip(names, shots, strict=True)
    ]
    p.set_input_files("#pages-files", files=files)
    p.fill("#pages-query", query)
    p.click("#pages-run")
    p.wait_for_selector("#pages-list li")
    uris = ["data:image/png;base64," + base64.b64encode(b).decode() for b in shots]
    api = _post(
        srv,
        "/v1/rerank",
        {"model": "colpali", "query": query, "documents": [{"image": u} for u in uris]},
    )
    shown = p.eval_on_selector_all(
        "#pages-list li", "items => items.map(li => [li.dataset.name, +li.dataset.score])"
    )
    assert [n for n, _ in shown] == [names[r["index"]] for r in api["results"]]
    for (_, score), r in zip(shown, api["results"], strict=True):
        assert score == pytest.approx(r["relevance_score"], abs=1e-9)
    assert p.text_content("#pages-best") == f"Best page: {names[api['results'][0]['index']]}"
    page.shot("pages")


def test_every_panel_fits_a_phone_screen(browser: Any, srv: RemoteServer) -> None:
    phone = Page(browser, srv.url, viewport={"width": 390, "height": 844}, is_mobile=True)
    p = phone.page
    p.wait_for_selector("#sim-matrix")
    for panel in ("similarity", "rerank", "tokens", "images", "pages", "sparse", "server"):
        phone.tab(panel)
        overflow = p.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, (panel, overflow)
        phone.shot(f"phone-{panel}")
    phone.close()


def test_with_an_api_key_the_page_asks_for_it_then_works(browser: Any) -> None:
    with RemoteServer(["--api-key", KEY]) as keyed:
        assert httpx.get(keyed.url + "/v1/models").status_code == 401
        for path in ("/playground", "/playground/app.js", "/playground/app.css", "/"):
            assert httpx.get(keyed.url + path).status_code == 200, path  # the page loads
        tab = Page(browser, keyed.url, viewport={"width": 1280, "height": 900})
        p = tab.page
        p.wait_for_selector("#auth:not([hidden])")
        assert p.text_content("#auth-message") == (
            "Incorrect or missing API key: send 'Authorization: Bearer <key>'."
        )
        tab.shot("api-key")
        p.fill("#api-key", KEY)
        p.click("#key-form button")
        p.wait_for_selector("#auth", state="hidden")
        p.wait_for_selector("#sim-result[data-runs='1'] #sim-matrix")  # computed once keyed
        assert p.eval_on_selector("#sim-matrix td", "c => c.textContent") == "1.000"
        tab.allowed = ("status of 401 (Unauthorized)",)  # the first, keyless calls
        tab.close()


def test_index_links_to_the_playground_and_the_page_is_locked_down(srv: RemoteServer) -> None:
    html = httpx.get(srv.url + "/", headers={"Accept": "text/html"})
    assert 'href="/playground"' in html.text and html.headers["content-type"].startswith(
        "text/html"
    )
    assert httpx.get(srv.url + "/").json()["links"]["playground"] == "/playground"
    page = httpx.get(srv.url + "/playground")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    assert "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert "<script" not in page.text.replace(
        '<script src="/playground/app.js" defer></script>', ""
    )


def test_on_the_default_server_the_page_explains_what_it_cannot_show(
    browser: Any, server: RemoteServer
) -> None:
    """The quick-start server (one text model): the similarity example is computed on open;
    Images and Sparse say no served model can do them and show the config lines that would
    enable them (no empty menus); a batch whose lines all failed shows a full red bar."""
    lines = [
        json.dumps(
            {
                "custom_id": f"f{i}",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": "not-served", "input": "x"},
            }
        )
        for i in range(4)
    ]
    up = httpx.post(
        server.url + "/v1/files",
        data={"purpose": "batch"},
        files={"file": ("f.jsonl", "\n".join(lines).encode())},
    ).json()
    batch = _post(
        server,
        "/v1/batches",
        {"input_file_id": up["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"},
    )
    deadline = time.monotonic() + 60
    while httpx.get(server.url + f"/v1/batches/{batch['id']}").json()["status"] != "completed":
        assert time.monotonic() < deadline
        time.sleep(0.1)

    tab = Page(browser, server.url, viewport={"width": 1280, "height": 900})
    p = tab.page
    # no click: the example's four texts are compared on open, with the API's cosines
    cells = p.eval_on_selector_all("#sim-matrix td", "cs => cs.map(c => +c.dataset.value)")
    texts = (p.input_value("#sim-texts")).split("\n")
    api = _post(server, "/v1/embeddings", {"model": "all-MiniLM-L6-v2", "input": texts})
    vectors = _unit(np.asarray([d["embedding"] for d in api["data"]]))
    np.testing.assert_allclose(cells, (vectors @ vectors.T).ravel(), atol=1e-6)
    tab.shot("default-similarity")

    enable = (
        ("images", 'model = "openai/clip-vit-base-patch32"'),
        ("pages", 'model = "vidore/colpali-v1.3-hf"'),
        ("sparse", 'kind = "sparse"'),
    )
    for panel, config in enable:
        assert "unavailable" in (p.get_attribute(f".tab[data-panel={panel}]", "class") or "")
        tab.tab(panel)
        section = p.locator(f"#panel-{panel}")
        assert "No model this server serves can do this" in section.locator(".enable").inner_text()
        assert config in section.locator("pre.config").inner_text()
        assert not section.locator(".run").is_visible()  # no dead-end button or empty menu
        assert not section.locator("select").is_visible()
        tab.shot(f"default-{panel}")
    for panel in ("similarity", "rerank", "tokens"):  # what one text model can do stays
        assert "unavailable" not in (p.get_attribute(f".tab[data-panel={panel}]", "class") or "")

    tab.tab("server")
    row = p.locator(f"#srv-batches tr[data-batch='{batch['id']}']")
    row.wait_for()
    assert row.get_attribute("data-done") == row.get_attribute("data-total") == "4"
    widths = row.locator(".bar").evaluate_all("bs => bs.map(b => [b.className, b.style.width])")
    assert widths == [["bar ok", "0%"], ["bar failed", "100%"]]
    red = row.locator(".bar.failed").evaluate("b => getComputedStyle(b).backgroundColor")
    blue = p.eval_on_selector(".tab[aria-selected=true]", "t => getComputedStyle(t).color")
    assert red == "rgb(179, 38, 30)" and red != blue  # --bad, not the accent
    tab.shot("default-server-failed-batch")
    tab.close()


def test_multi_vector_models_are_left_out_of_the_panels_that_need_one_vector(
    page: Page, srv: RemoteServer
) -> None:
    """#61.7: the Images panel listed ColPali and showed "Best match: undefined" and NaN
    scores; the Similarity panel could open on it. Both list one-vector models only; the
    Pages panel still has it."""
    cards = {m["id"]: m for m in _get(srv, "/v1/models")["data"]}
    assert cards["colpali"]["multivector"] is True and "multivector" not in cards["clip"]
    p = page.page
    options = {
        select: p.eval_on_selector_all(f"{select} option", "els => els.map(e => e.value)")
        for select in ("#sim-model", "#img-model", "#pages-model")
    }
    assert "colpali" not in options["#sim-model"] and "colpali" not in options["#img-model"]
    assert "clip" in options["#img-model"] and "colpali" in options["#pages-model"]
