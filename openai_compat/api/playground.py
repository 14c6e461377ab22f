"""GET /playground: a page to look at what the served models do (similarity, rerank, tokens,
images, sparse terms, server state), and GET / that links to it and to the API docs.

The page is static (openai_compat/static/, no third-party code, nothing fetched from elsewhere)
and calls the same public API a client would. It is served with a content security policy
that allows only this server, so the page can neither load nor send anything elsewhere.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_compat import __version__
from openai_compat.formats.encoding import orjson_response

router = APIRouter(include_in_schema=False)

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data: blob:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-cache",
}
_TYPES = {
    "playground.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}


@cache
def _asset(name: str) -> bytes:
    return resources.files("openai_compat").joinpath("static", name).read_bytes()


def _page(name: str) -> Response:
    return Response(_asset(name), media_type=_TYPES[name], headers=SECURITY_HEADERS)


@router.get("/playground")
async def playground() -> Response:
    return _page("playground.html")


@router.get("/playground/app.js")
async def playground_js() -> Response:
    return _page("app.js")


@router.get("/playground/app.css")
async def playground_css() -> Response:
    return _page("app.css")


_INDEX = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>openai-compat</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body><h1>openai-compat {version}</h1><ul>
<li><a href="/playground">Playground</a>: try the served models in the browser</li>
<li><a href="/docs">API documentation</a> (<a href="/openapi.json">OpenAPI</a>)</li>
<li><a href="/v1/models">Served models</a>, <a href="/health">health</a>,
<a href="/ready">readiness</a>, <a href="/metrics">metrics</a></li>
</ul></body></html>
"""


@router.get("/")
async def index(request: Request) -> Response:
    """Browsers get links (the playground, the docs); other clients a small JSON document."""
    if "text/html" in request.headers.get("accept", ""):
        html = _INDEX.format(version=__version__).encode()
        return Response(html, media_type="text/html; charset=utf-8", headers=SECURITY_HEADERS)
    links = {"playground": "/playground", "docs": "/docs", "openapi": "/openapi.json"}
    return orjson_response({"name": "openai-compat", "version": __version__, "links": links})
