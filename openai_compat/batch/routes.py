"""OpenAI's Files and Batch APIs: /v1/files and /v1/batches, shaped as OpenAI's.

Uploads are JSONL files with purpose "batch"; a batch runs every line of one through this
server's own /v1/embeddings, /v1/rerank, /v2/rerank or /v1/classify (runner.py), at a lower
priority than live requests; state lives in SQLite under --data-dir (store.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator
from starlette.responses import FileResponse, Response

from openai_compat.api.protocol import ERROR_RESPONSES
from openai_compat.api.request import body_openapi, read_body, settings_of
from openai_compat.batch.lines import ENDPOINTS
from openai_compat.batch.service import BatchService, batch_object
from openai_compat.batch.store import Store
from openai_compat.batch.upload import receive_upload
from openai_compat.formats.encoding import orjson_response
from openai_compat.ground.errors import APIError, BadRequest
from openai_compat.tenants.limits import current as current_caller

router = APIRouter(tags=["batch"])


class NotFound(APIError):
    status = 404
    type = "invalid_request_error"
    default_code = "not_found"


class BatchCreateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: StrictStr
    endpoint: StrictStr = Field(description="One of " + ", ".join(ENDPOINTS) + ".")
    completion_window: StrictStr = Field(description='Only "24h", as OpenAI.')
    metadata: dict[StrictStr, StrictStr] | None = Field(
        None,
        description="Up to 16 string pairs (keys up to 64 characters, values up to 512), kept "
        "with the batch.",
    )

    @field_validator("metadata")
    @classmethod
    def _openai_limits(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        if metadata is None:
            return None
        if len(metadata) > 16:
            raise ValueError(f"at most 16 pairs, got {len(metadata)}")
        for key, value in metadata.items():
            if len(key) > 64:
                raise ValueError(f"key {key[:20]!r}... is longer than 64 characters")
            if len(value) > 512:
                raise ValueError(f"the value of {key!r} is longer than 512 characters")
        return metadata


def owner_of(request: Request) -> str:
    """Who owns what this request makes or may see: its key's name in the keys file (so a
    rotated key keeps its jobs), a hash of an --api-key key, '' when the server has no keys
    (tenants.Tenants.owner). Files and batches of other owners do not exist for it (404), as
    on OpenAI."""
    caller = current_caller.get()
    return request.app.state.tenants.owner(caller.key if caller is not None else None)


def _service(request: Request) -> BatchService:
    service: BatchService = request.app.state.batches
    return service


# Every store call runs in a worker thread: its lock can be held by a commit waiting on fsync.
async def _store(request: Request) -> Store:
    return await asyncio.to_thread(lambda: _service(request).store)


async def _existing_store(request: Request) -> Store | None:
    return await asyncio.to_thread(_service(request).existing_store)


def _limit(request: Request, default: int = 20) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= 100:
        raise BadRequest("'limit' must be an integer from 1 to 100.", param="limit")
    return int(raw)


def _page(data: list[dict[str, Any]], has_more: bool) -> Response:
    return orjson_response(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": has_more,
        }
    )


# ---------------------------------------------------------------- files


# The body the route streams itself (batch/upload.py), as OpenAI's spec documents it.
UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "purpose": {"type": "string", "enum": ["batch"]},
                    },
                }
            }
        },
    }
}


@router.post("/files", responses=ERROR_RESPONSES, openapi_extra=UPLOAD_BODY)
async def create_file(request: Request) -> Response:
    """Upload a file (multipart: `file`, `purpose`="batch"), streamed to disk as it comes."""
    service = _service(request)
    limit = settings_of(request).batch_max_file_bytes
    if "multipart/form-data" not in request.headers.get("content-type", ""):
        raise BadRequest("Upload the file as multipart/form-data with 'file' and 'purpose'.")
    async with service.upload_slot():
        store = await _store(request)
        upload = await receive_upload(request, store, limit)
        try:
            purpose = upload.fields.get("purpose")
            if purpose != "batch":
                raise BadRequest(
                    f"purpose {purpose!r} is not supported: this server takes 'batch' files.",
                    param="purpose",
                    code="invalid_purpose",
                )
            found = await asyncio.to_thread(
                store.add_file,
                upload.path,
                purpose="batch",
                filename=upload.filename,
                owner=owner_of(request),
            )
        finally:
            await asyncio.to_thread(upload.path.unlink, missing_ok=True)  # moved, or refused
            store.release(upload.reserved)  # a file of the store now, or gone
    return orjson_response(found)


@router.get("/files", responses=ERROR_RESPONSES)
async def list_files(request: Request) -> Response:
    q = request.query_params
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise BadRequest("'order' must be 'asc' or 'desc'.", param="order")
    limit = _limit(request, 100)
    store = await _existing_store(request)
    if store is None:
        return _page([], False)
    data, more = await asyncio.to_thread(
        store.files,
        purpose=q.get("purpose"),
        after=q.get("after"),
        limit=limit,
        order=order,
        owner=owner_of(request),
    )
    return _page(data, more)


async def _file(request: Request, file_id: str) -> tuple[Store, dict[str, Any]]:
    store = await _existing_store(request)
    owner = owner_of(request)
    found = await asyncio.to_thread(store.file, file_id, owner) if store is not None else None
    if store is None or found is None:
        raise NotFound(f"No such file: {file_id!r}.", param="file_id", code="file_not_found")
    return store, found


@router.get("/files/{file_id}", responses=ERROR_RESPONSES)
async def retrieve_file(file_id: str, request: Request) -> Response:
    _, found = await _file(request, file_id)
    return orjson_response(found)


@router.get("/files/{file_id}/content", responses=ERROR_RESPONSES)
async def file_content(file_id: str, request: Request) -> Response:
    store, found = await _file(request, file_id)
    path = await asyncio.to_thread(store.file_path, file_id)
    assert path is not None
    # OpenAI's spec answers this with application/json (the file's bytes as they are; the
    # SDK's files.content() reads them as binary whatever the type)
    return FileResponse(path, media_type="application/json", filename=found["filename"])


@router.delete("/files/{file_id}", responses=ERROR_RESPONSES)
async def delete_file(file_id: str, request: Request) -> Response:
    store, _ = await _file(request, file_id)
    using = await asyncio.to_thread(store.file_in_use, file_id)
    if using is not None:
        raise BadRequest(
            f"File {file_id!r} is the input of batch {using!r}, which is still running; cancel "
            "it first.",
            param="file_id",
            code="file_in_use",
        )
    await asyncio.to_thread(store.delete_file, file_id)
    return orjson_response({"id": file_id, "object": "file", "deleted": True})


# ---------------------------------------------------------------- batches


@router.post("/batches", responses=ERROR_RESPONSES, openapi_extra=body_openapi(BatchCreateRequest))
async def create_batch(request: Request) -> Response:
    """Start a batch over an uploaded file's lines."""
    service = _service(request)
    body = await read_body(request, BatchCreateRequest)
    store = await _existing_store(request)
    owner = owner_of(request)
    found = (
        await asyncio.to_thread(store.file, body.input_file_id, owner)
        if store is not None
        else None
    )
    if found is None:
        raise BadRequest(
            f"No such file: {body.input_file_id!r}.",
            param="input_file_id",
            code="file_not_found",
        )
    if found["purpose"] != "batch":
        raise BadRequest(
            f"File {body.input_file_id!r} has purpose {found['purpose']!r}; a batch needs a "
            "file uploaded with purpose 'batch'.",
            param="input_file_id",
            code="invalid_file_purpose",
        )
    if body.endpoint not in ENDPOINTS:
        raise BadRequest(
            f"endpoint {body.endpoint!r} is not supported; use one of {', '.join(ENDPOINTS)}.",
            param="endpoint",
            code="unsupported_endpoint",
        )
    if body.completion_window != "24h":
        raise BadRequest(
            "completion_window must be '24h'.", param="completion_window", code="invalid_value"
        )
    obj = await asyncio.to_thread(
        service.submit,
        owner,
        batch_object(
            input_file_id=body.input_file_id,
            endpoint=body.endpoint,
            completion_window=body.completion_window,
            metadata=body.metadata,
            now=int(time.time()),
        ),
    )
    return orjson_response(obj)


async def _batch(request: Request, batch_id: str) -> tuple[Store, dict[str, Any]]:
    store = await _existing_store(request)
    owner = owner_of(request)
    found = await asyncio.to_thread(store.batch, batch_id, owner) if store is not None else None
    if store is None or found is None:
        raise NotFound(f"No such batch: {batch_id!r}.", param="batch_id", code="batch_not_found")
    return store, found


@router.get("/batches/{batch_id}", responses=ERROR_RESPONSES)
async def retrieve_batch(batch_id: str, request: Request) -> Response:
    _, found = await _batch(request, batch_id)
    return orjson_response(found)


@router.get("/batches", responses=ERROR_RESPONSES)
async def list_batches(request: Request) -> Response:
    limit = _limit(request)
    store = await _existing_store(request)
    if store is None:
        return _page([], False)
    after = request.query_params.get("after")
    owner = owner_of(request)
    data, more = await asyncio.to_thread(store.batches, after=after, limit=limit, owner=owner)
    return _page(data, more)


@router.post("/batches/{batch_id}/cancel", responses=ERROR_RESPONSES)
async def cancel_batch(batch_id: str, request: Request) -> Response:
    store, _ = await _batch(request, batch_id)
    obj = await asyncio.to_thread(store.cancel, batch_id)
    assert obj is not None
    _service(request).runner.wake.set()
    return orjson_response(obj)
