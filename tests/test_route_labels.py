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
            ("POST", "/v1beta/models/m:embedContent", {}),
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
        "/v1beta/models/{target}",
    } <= routes, routes
    assert "unmatched" in routes  # /no/such/route, and nothing else
    assert not any("abc" in r or r.endswith("/m") for r in routes)


@pytest.mark.parametrize("reverse", [False, True])
def test_a_one_segment_template_wins_over_one_that_takes_the_rest_of_the_path(
    reverse: bool,
) -> None:
    """GET /v1/models/m is the model card's route, not Gemini's POST /v1/models/{target:path}:
    the label must not depend on the order a set of paths happens to iterate in."""
    from openai_compat.models.metrics import RouteLabels

    templates = ["/v1/models/{target:path}", "/v1/models/{model_id}", "/v1/models"]
    labels = RouteLabels(reversed(templates) if reverse else iter(templates))
    assert labels("/v1/models/m") == "/v1/models/{model_id}"
    assert labels("/v1/models/org/m:embedContent") == "/v1/models/{target}"
    assert labels("/v1/models") == "/v1/models"
