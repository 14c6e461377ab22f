"""/metrics labels every mounted route by its template (batch polling, file downloads and the
admin API's load/unload were all `route="unmatched"`); a path no route serves stays
"unmatched", so client paths never become labels."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from openai_compat.frame.settings import ModelConfig, Settings
from tests.utils import app_client

pytestmark = pytest.mark.slow


async def test_every_mounted_route_is_labelled_by_its_template(tmp_path: Path) -> None:
    debug = ModelConfig(model="debug/m", name="m", engine="debugengine")
    settings = Settings(models=(debug,), admin_key="adm", data_dir=tmp_path, cache_bytes=0)
    admin = {"Authorization": "Bearer adm"}
    async with app_client(settings) as c:
        calls = [
            ("GET", "/v1/batches/batch_abc", {}),
            ("POST", "/v1/batches/batch_abc/cancel", {}),
            ("GET", "/v1/files/file-abc/content", {}),
            ("GET", "/v1/files/file-abc", {}),
            ("POST", "/admin/models/m/load", admin),
            ("POST", "/admin/models/m/unload", admin),
            ("GET", "/v1/models/m", {}),
            ("GET", "/no/such/route", {}),
        ]
        for method, path, headers in calls:
            await c.request(method, path, headers=headers)
        text = (await c.get("/metrics")).text
    routes = set(re.findall(r'openai_compat_requests_total\{[^}]*route="([^"]+)"', text))
    assert {
        "/v1/batches/{batch_id}",
        "/v1/batches/{batch_id}/cancel",
        "/v1/files/{file_id}/content",
        "/v1/files/{file_id}",
        "/admin/models/{name}/load",
        "/admin/models/{name}/unload",
        "/v1/models/{model_id}",
    } <= routes, routes
    assert "unmatched" in routes  # /no/such/route, and nothing else
    assert not any("abc" in r or r.endswith("/m") for r in routes)
