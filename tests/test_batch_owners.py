"""Files and batches belong to the API key that made them: another key sees none of them (in
process, debug model, two keys)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from openai_compat.frame.settings import ModelConfig, Settings
from tests.utils import app_client

A = {"Authorization": "Bearer key-a"}
B = {"Authorization": "Bearer key-b"}
LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", '
LINE += b'"body": {"model": "debug", "input": "abc"}}'


async def test_another_keys_files_and_batches_do_not_exist(tmp_path: Path) -> None:
    settings = Settings(
        models=(ModelConfig(model="debug/engine", name="debug", engine="debugengine"),),
        data_dir=tmp_path / "data",
        api_key=("key-a", "key-b"),
    )
    async with app_client(settings) as c:
        up = await c.post(
            "/v1/files",
            files={"file": ("a.jsonl", LINE)},
            data={"purpose": "batch"},
            headers=A,
        )
        assert up.status_code == 200, up.text
        file_id = up.json()["id"]
        body = {
            "input_file_id": file_id,
            "endpoint": "/v1/embeddings",
            "completion_window": "24h",
        }
        refused = await c.post("/v1/batches", json=body, headers=B)
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "file_not_found"
        created = await c.post("/v1/batches", json=body, headers=A)
        assert created.status_code == 200, created.text
        batch_id = created.json()["id"]
        batch = await _done(c, batch_id)
        output = batch["output_file_id"]

        for path in (f"/v1/files/{file_id}", f"/v1/files/{output}", f"/v1/batches/{batch_id}"):
            assert (await c.get(path, headers=B)).status_code == 404, path
            assert (await c.get(path, headers=A)).status_code == 200, path
        assert (await c.get(f"/v1/files/{output}/content", headers=B)).status_code == 404
        assert (await c.delete(f"/v1/files/{file_id}", headers=B)).status_code == 404
        cancel = await c.post(f"/v1/batches/{batch_id}/cancel", headers=B)
        assert cancel.status_code == 404
        assert (await c.get("/v1/files", headers=B)).json()["data"] == []
        assert (await c.get("/v1/batches", headers=B)).json()["data"] == []
        mine = {f["id"] for f in (await c.get("/v1/files", headers=A)).json()["data"]}
        assert mine == {file_id, output}
        listed = (await c.get("/v1/batches", headers=A)).json()["data"]
        assert [b["id"] for b in listed] == [batch_id]


async def _done(client: httpx.AsyncClient, batch_id: str) -> dict[str, Any]:
    for _ in range(500):
        batch: dict[str, Any] = (await client.get(f"/v1/batches/{batch_id}", headers=A)).json()
        if batch["status"] in ("completed", "failed"):
            assert batch["status"] == "completed", batch
            return batch
        await asyncio.sleep(0.02)
    raise AssertionError(f"batch still {batch['status']}")
