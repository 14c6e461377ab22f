"""POST /v1/files bodies: multipart streamed straight into the data dir, never held in memory.

The request body is fed to python-multipart's streaming parser as it arrives; the file part's
bytes go to a temp file beside the store's files (written off the event loop, at most
FLUSH_BYTES buffered), counted against the file size limit as they come. Small fields
(`purpose`) are kept in memory, bounded. Whatever goes wrong (a limit, a malformed body, the
client gone mid-upload), the temp file is removed; on success it is fsynced and handed to the
store, which renames it into place.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request

from openai_compat.batch.store import Store
from openai_compat.ground.errors import BadRequest, InsufficientStorage, PayloadTooLarge

FLUSH_BYTES = 1024 * 1024  # file bytes buffered before a write (in a worker thread)
MAX_FIELD_BYTES = 1024  # a non-file field (purpose) is a short string
MAX_PARTS = 8


@dataclass
class Upload:
    path: Path  # the temp file, fsynced; the caller moves it into the store
    filename: str
    fields: dict[str, str]
    size: int
    reserved: int  # bytes counted against the data dir's quota until store.release()


@dataclass
class _Part:
    name: str = ""
    filename: str | None = None
    data: bytearray = field(default_factory=bytearray)


class _Receiver:
    """python-multipart callbacks: one file part to disk, small fields to memory."""

    def __init__(self, folder: Path, limit: int) -> None:
        self.limit = limit
        self.fd, name = tempfile.mkstemp(dir=folder, prefix=".upload-")
        self.path = Path(name)
        self.pending = bytearray()  # file bytes not written yet
        self.size = 0
        self.reserved = 0  # bytes written, held against the quota (store.reserve)
        self.files = 0
        self.parts = 0
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self.part = _Part()
        self.header_name = b""
        self.header_value = b""
        self.disposition = b""
        self.complete = False  # the closing boundary came

    def callbacks(self) -> dict[str, object]:
        return {
            "on_part_begin": self.on_part_begin,
            "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end,
            "on_header_field": self.on_header_field,
            "on_header_value": self.on_header_value,
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
            "on_end": self.on_end,
        }

    def on_end(self) -> None:
        self.complete = True

    def on_part_begin(self) -> None:
        self.parts += 1
        if self.parts > MAX_PARTS:
            raise BadRequest(f"The form has more than {MAX_PARTS} parts.", param="file")
        self.part = _Part()
        self.disposition = b""

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self.header_name += data[start:end]
        if len(self.header_name) > MAX_FIELD_BYTES:
            raise BadRequest("A multipart header is too long.", param="file")

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self.header_value += data[start:end]
        if len(self.header_value) > 4 * MAX_FIELD_BYTES:
            raise BadRequest("A multipart header is too long.", param="file")

    def on_header_end(self) -> None:
        if self.header_name.lower() == b"content-disposition":
            self.disposition = self.header_value
        self.header_name = self.header_value = b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self.disposition)
        self.part.name = options.get(b"name", b"").decode("utf-8", "replace")
        if b"filename" in options:
            self.files += 1
            if self.files > 1 or self.part.name != "file":
                raise BadRequest("Send exactly one file, as the form field 'file'.", param="file")
            self.part.filename = options[b"filename"].decode("utf-8", "replace")
            self.filename = self.part.filename

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if self.part.filename is None:
            self.part.data += chunk
            if len(self.part.data) > MAX_FIELD_BYTES:
                raise BadRequest(f"Form field {self.part.name!r} is too long.", param="file")
            return
        self.size += len(chunk)
        if self.size > self.limit:
            raise PayloadTooLarge(
                f"The file is larger than {self.limit} bytes (batch_max_file_bytes).",
                param="file",
            )
        self.pending += chunk

    def on_part_end(self) -> None:
        if self.part.filename is None:
            self.fields[self.part.name] = self.part.data.decode("utf-8", "replace")

    def write_pending(self) -> None:
        """Blocking: the buffered file bytes to disk."""
        done = 0
        with memoryview(self.pending) as view:
            while done < len(view):
                done += os.write(self.fd, view[done:])
        self.pending.clear()

    def finish(self) -> None:
        """Blocking: the rest to disk, and the bytes durable."""
        self.write_pending()
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


async def receive_upload(request: Request, store: Store, limit: int) -> Upload:
    """The multipart body of `request` with its one file streamed into the store's files
    folder; the data dir's quota and free-disk floor are checked as it grows."""
    folder = store.root / "files"
    _, params = parse_options_header(request.headers.get("content-type", ""))
    boundary = params.get(b"boundary")
    if not boundary:
        raise BadRequest("The multipart body has no boundary.", param="file")
    receiver = await asyncio.to_thread(_Receiver, folder, limit)
    try:
        parser = MultipartParser(boundary, receiver.callbacks())  # type: ignore[arg-type]
        try:
            async for chunk in request.stream():
                parser.write(chunk)
                if len(receiver.pending) >= FLUSH_BYTES:
                    await asyncio.to_thread(_flush, receiver, store)
            parser.finalize()
        except FormParserError as exc:
            raise BadRequest(f"The multipart body could not be read: {exc}", param="file") from exc
        if not receiver.complete:  # a file cut short must not be stored as if whole
            raise BadRequest("The multipart body ended before its closing boundary.", param="file")
        if receiver.filename is None:
            raise BadRequest("'file' is missing (a file part of the form).", param="file")
        await asyncio.to_thread(_flush, receiver, store)
        await asyncio.to_thread(receiver.finish)
    except BaseException:  # a limit, a bad body, the client gone, cancellation: no leftovers
        await asyncio.to_thread(_discard, receiver)
        store.release(receiver.reserved)
        raise
    receiver.close()
    name = Path(receiver.filename).name or "upload.jsonl"
    return Upload(receiver.path, name, receiver.fields, receiver.size, receiver.reserved)


def _flush(receiver: _Receiver, store: Store) -> None:
    """Blocking: the buffered bytes to disk, if the data dir has room for them beside
    everything it holds and every other upload under way."""
    adding = len(receiver.pending)
    refused = store.reserve(adding)
    if refused is not None:
        kind, why = refused
        error = PayloadTooLarge if kind == "quota" else InsufficientStorage
        raise error(f"The file does not fit: {why}.", param="file")
    receiver.reserved += adding
    receiver.write_pending()


def _discard(receiver: _Receiver) -> None:
    receiver.close()
    receiver.path.unlink(missing_ok=True)
