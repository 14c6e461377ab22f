"""OpenAI's Files and Batch APIs: /v1/files and /v1/batches, shaped as OpenAI's.

Uploads are JSONL files with purpose "batch"; a batch runs every line of one through this
server's own /v1/embeddings, /v1/rerank, /v2/rerank or /v1/classify (runner.py), at a lower
priority than live requests; state lives in SQLite under --data-dir (store.py).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictStr
from starlette.datastructures import UploadFile
from starlette.responses import FileResponse, Response

from openai_compat.api.request import body_openapi, read_body, settings_of
from openai_compat.batch.lines import ENDPOINTS
from openai_compat.batch.service import BatchService, batch_object
from openai_compat.encoding import orjson_response
from openai_compat.errors import APIError, BadRequest, PayloadTooLarge
from openai_compat.protocol import ERROR_RESPONSES

router = APIRouter(tags=["batch"])

_COPY_CHUNK = 1024 * 1024


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
        None, description="Up to 16 string pairs, kept with the batch."
    )


def _service(request: Request) -> BatchService:
    service: BatchService = request.app.state.batches
    return service


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


@router.post("/files", responses=ERROR_RESPONSES)
async def create_file(request: Request) -> Response:
    """Upload a file (multipart: `file`, `purpose`="batch")."""
    service = _service(request)
    limit = settings_of(request).batch_max_file_bytes
    if "multipart/form-data" not in request.headers.get("content-type", ""):
        raise BadRequest("Upload the file as multipart/form-data with 'file' and 'purpose'.")
    try:
        form = await request.form(max_files=1, max_fields=8)
    except Exception as exc:  # python-multipart's and starlette's parse errors
        raise BadRequest(f"The multipart body could not be read: {exc}") from exc
    try:
        purpose, upload = form.get("purpose"), form.get("file")
        if purpose != "batch":
            raise BadRequest(
                f"purpose {purpose!r} is not supported: this server takes 'batch' files.",
                param="purpose",
                code="invalid_purpose",
            )
        if not isinstance(upload, UploadFile):
            raise BadRequest("'file' is missing (a file part of the form).", param="file")
        path = await asyncio.to_thread(_spool, upload, service.store.root / "files", limit)
        filename = Path(upload.filename or "upload.jsonl").name
    finally:
        await form.close()
    return orjson_response(
        await asyncio.to_thread(service.store.add_file, path, purpose="batch", filename=filename)
    )


def _spool(upload: UploadFile, folder: Path, limit: int) -> Path:
    """The upload copied to a temp file beside the store's files, at most `limit` bytes."""
    upload.file.seek(0)
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".upload-", delete=False) as out:
        size = 0
        while chunk := upload.file.read(_COPY_CHUNK):
            size += len(chunk)
            if size > limit:
                out.close()
                Path(out.name).unlink(missing_ok=True)
                raise PayloadTooLarge(
                    f"The file is larger than {limit} bytes (batch_max_file_bytes).",
                    param="file",
                )
            out.write(chunk)
    return Path(out.name)


@router.get("/files", responses=ERROR_RESPONSES)
async def list_files(request: Request) -> Response:
    q = request.query_params
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise BadRequest("'order' must be 'asc' or 'desc'.", param="order")
    limit = _limit(request, 100)
    store = _service(request).existing_store()
    if store is None:
        return _page([], False)
    data, more = store.files(
        purpose=q.get("purpose"), after=q.get("after"), limit=limit, order=order
    )
    return _page(data, more)


def _file(request: Request, file_id: str) -> dict[str, Any]:
    store = _service(request).existing_store()
    found = store.file(file_id) if store is not None else None
    if found is None:
        raise NotFound(f"No such file: {file_id!r}.", param="file_id", code="file_not_found")
    return found


@router.get("/files/{file_id}", responses=ERROR_RESPONSES)
async def retrieve_file(file_id: str, request: Request) -> Response:
    return orjson_response(_file(request, file_id))


@router.get("/files/{file_id}/content", responses=ERROR_RESPONSES)
async def file_content(file_id: str, request: Request) -> Response:
    found = _file(request, file_id)
    path = _service(request).store.file_path(file_id)
    assert path is not None
    return FileResponse(path, media_type="application/jsonl", filename=found["filename"])


@router.delete("/files/{file_id}", responses=ERROR_RESPONSES)
async def delete_file(file_id: str, request: Request) -> Response:
    store = _service(request).store
    _file(request, file_id)
    using = store.file_in_use(file_id)
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
    store = service.existing_store()
    found = store.file(body.input_file_id) if store is not None else None
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
    if body.metadata is not None and len(body.metadata) > 16:
        raise BadRequest("metadata takes at most 16 pairs.", param="metadata")
    obj = service.submit(
        batch_object(
            input_file_id=body.input_file_id,
            endpoint=body.endpoint,
            completion_window=body.completion_window,
            metadata=body.metadata,
            now=int(time.time()),
        )
    )
    return orjson_response(obj)


def _batch(request: Request, batch_id: str) -> dict[str, Any]:
    store = _service(request).existing_store()
    found = store.batch(batch_id) if store is not None else None
    if found is None:
        raise NotFound(f"No such batch: {batch_id!r}.", param="batch_id", code="batch_not_found")
    return found


@router.get("/batches/{batch_id}", responses=ERROR_RESPONSES)
async def retrieve_batch(batch_id: str, request: Request) -> Response:
    return orjson_response(_batch(request, batch_id))


@router.get("/batches", responses=ERROR_RESPONSES)
async def list_batches(request: Request) -> Response:
    limit = _limit(request)
    store = _service(request).existing_store()
    if store is None:
        return _page([], False)
    data, more = store.batches(after=request.query_params.get("after"), limit=limit)
    return _page(data, more)


@router.post("/batches/{batch_id}/cancel", responses=ERROR_RESPONSES)
async def cancel_batch(batch_id: str, request: Request) -> Response:
    service = _service(request)
    _batch(request, batch_id)
    obj = service.store.cancel(batch_id)
    assert obj is not None
    service.runner.wake.set()
    return orjson_response(obj)
