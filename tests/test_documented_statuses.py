"""Every status a route answers is one its /openapi.json operation documents (TEI's POST /,
/embed_sparse and /predict answered 400 Empty without documenting it; infinity's media routes
422), and the schema describes what is served: POST /v1/files has its multipart body, and the
/v1 operations also served bare (/embeddings, /models/{model_id}, /files, /batches) are
documented there. In process, every POST operation sent the same hostile bodies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from openai_compat.frame.settings import ModelConfig, Settings
from tests.utils import app_client

pytestmark = pytest.mark.slow

BODIES: list[Any] = [
    {},
    [],
    "text",
    None,
    {"inputs": []},
    {"inputs": ""},
    {"input": []},
    {"input": "x", "model": "no-such-model"},
    {"input": ["x"], "encoding_format": "hex"},
    {"input": ["not a url"], "modality": "image"},
    {"texts": []},
    {"query": "q", "documents": []},
    {"query": "q", "texts": []},
    {"sentences": []},
    {"prompt": ""},
    {"ids": [[-1]]},
    {"model": 7},
]


async def test_every_answer_is_documented_and_the_twins_are_in_the_schema(
    tmp_path: Path,
) -> None:
    debug = ModelConfig(model="debug/m", name="m", engine="debugengine")
    settings = Settings(models=(debug,), data_dir=tmp_path, cache_bytes=0)
    undocumented: list[str] = []
    async with app_client(settings) as c:
        schema = (await c.get("/openapi.json")).json()
        paths = schema["paths"]
        for path, item in paths.items():
            operation = item.get("post")
            if operation is None or "{" in path or path in ("/v1/files", "/files"):
                continue
            documented = {str(code) for code in operation["responses"]}
            for body in BODIES:
                r = await c.post(path, json=body)
                if str(r.status_code) not in documented:
                    undocumented.append(f"POST {path} {body!r}: {r.status_code} {r.text[:120]}")
    assert undocumented == [], "\n".join(undocumented)
    upload = paths["/v1/files"]["post"]["requestBody"]["content"]["multipart/form-data"]
    assert set(upload["schema"]["required"]) == {"file", "purpose"}
    for method, path in (
        ("post", "/embeddings"),
        ("get", "/models/{model_id}"),
        ("get", "/files"),
        ("post", "/files"),
        ("get", "/files/{file_id}/content"),
        ("post", "/batches"),
        ("get", "/batches/{batch_id}"),
    ):
        assert method in paths.get(path, {}), f"{method.upper()} {path}: served, not documented"
    # bare GET /models stays infinity's own card list, not a copy of OpenAI's
    assert paths["/models"]["get"]["operationId"] != paths["/v1/models"]["get"]["operationId"]
    ids = [op["operationId"] for item in paths.values() for op in item.values()]
    assert len(ids) == len(set(ids))
