"""GET /docs (Swagger UI) and /redoc (ReDoc), served whole by this server, so they work
offline and air-gapped: FastAPI's own pages load their JavaScript and CSS from a CDN.

The UI builds (Swagger UI, ReDoc; MIT) ship in the fastapi-offline package; the pages and
Swagger UI's start-up script are ours (openai_compat/static/docs/), with no inline script, under
a Content-Security-Policy that lets them load and call nothing but this server. The pages use
relative URLs, so they also work behind a proxy that adds a path prefix.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path

from fastapi import APIRouter
from starlette.responses import Response

router = APIRouter(include_in_schema=False)

# Swagger UI and ReDoc set styles inline (style attributes, styled-components) and ReDoc runs
# its search in a blob: worker; scripts and connections stay this server's.
DOCS_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; worker-src blob:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
# asset name -> (package, media type); the package's static/ folder holds it
ASSETS = {
    "swagger-ui-bundle.js": ("fastapi_offline", "text/javascript; charset=utf-8"),
    "swagger-ui.css": ("fastapi_offline", "text/css; charset=utf-8"),
    "redoc.standalone.js": ("fastapi_offline", "text/javascript; charset=utf-8"),
    "favicon.png": ("fastapi_offline", "image/png"),
    "swagger-init.js": ("openai_compat", "text/javascript; charset=utf-8"),
}
ASSET_PATHS = frozenset(f"/docs/assets/{name}" for name in ASSETS)

_SWAGGER = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>openai-compat - API</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="docs/assets/favicon.png">
<link rel="stylesheet" href="docs/assets/swagger-ui.css"></head>
<body><div id="swagger-ui"></div>
<script src="docs/assets/swagger-ui-bundle.js"></script>
<script src="docs/assets/swagger-init.js"></script></body></html>
"""
_REDOC = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>openai-compat - API reference</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="docs/assets/favicon.png"></head>
<body><redoc spec-url="openapi.json"></redoc>
<script src="docs/assets/redoc.standalone.js"></script></body></html>
"""


@cache
def _asset(name: str) -> bytes:
    package, _ = ASSETS[name]
    folder = "static/docs" if package == "openai_compat" else "static"
    return resources.files(package).joinpath(folder, name).read_bytes()


def _html(page: str) -> Response:
    return Response(page, media_type="text/html; charset=utf-8", headers=DOCS_HEADERS)


@router.get("/docs")
async def swagger_ui() -> Response:
    return _html(_SWAGGER)


@router.get("/redoc")
async def redoc() -> Response:
    return _html(_REDOC)


def _serve(name: str) -> None:
    async def asset() -> Response:
        return Response(_asset(name), media_type=ASSETS[name][1], headers=DOCS_HEADERS)

    asset.__name__ = "docs_asset_" + Path(name).stem.replace("-", "_").replace(".", "_")
    router.add_api_route(f"/docs/assets/{name}", asset, methods=["GET"])


for _name in ASSETS:
    _serve(_name)
