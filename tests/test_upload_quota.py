"""The data dir's quota (batch_max_data_bytes) holds for uploads as they stream in: the bytes
of an upload under way count, its own and every other one's (21.7 MB went in under a 5 MB
quota when only stored files counted). In process, bodies streamed in 1 MiB pieces."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from openai_compat.frame.settings import ModelConfig, Settings
from tests.test_e2e_uploads import BOUNDARY, _leftovers, _lines, _multipart
from tests.utils import app_client

HEADERS = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


def _settings(data_dir: Path) -> Settings:
    debug = ModelConfig(model="debug/engine", name="debug", engine="debugengine")
    return Settings(
        models=(debug,), data_dir=data_dir, batch_max_data_bytes=5 * 2**20, batch_min_free_bytes=0
    )


async def _chunks(megabytes: int) -> object:
    for piece in _multipart(_lines(megabytes)):
        yield piece
        await asyncio.sleep(0)  # the other upload's pieces interleave


@pytest.mark.slow
async def test_an_upload_past_the_quota_is_refused_as_it_streams(tmp_path: Path) -> None:
    async with app_client(_settings(tmp_path)) as c:
        r = await c.post("/v1/files", content=_chunks(8), headers=HEADERS)
        assert r.status_code == 413, r.text
        assert "batch_max_data_bytes" in r.json()["error"]["message"]
        assert _leftovers(tmp_path) == []
        ok = await c.post("/v1/files", content=_chunks(4), headers=HEADERS)  # fits alone
        assert ok.status_code == 200, ok.text
        # 4 MiB stored: another 2 MiB would pass 5 MiB
        more = await c.post("/v1/files", content=_chunks(2), headers=HEADERS)
        assert more.status_code == 413, more.text


@pytest.mark.slow
async def test_uploads_under_way_count_against_each_other(tmp_path: Path) -> None:
    async with app_client(_settings(tmp_path)) as c:
        both = await asyncio.gather(
            c.post("/v1/files", content=_chunks(3), headers=HEADERS),
            c.post("/v1/files", content=_chunks(3), headers=HEADERS),
        )
        assert sorted(r.status_code for r in both) == [200, 413], [r.text for r in both]
        assert _leftovers(tmp_path) == []
        listed = (await c.get("/v1/files")).json()["data"]
        assert sum(f["bytes"] for f in listed) <= 5 * 2**20
