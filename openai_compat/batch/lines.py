"""One Batch API input line -> one output or error record, in OpenAI's batch line format.

Shared by the server's runner (runner.py), the CLI and the Ray Data job (ray_job.py), so a
line gets the same checks and the same record wherever it runs; and reading input files in
waves of whole lines (line numbers, input counts, duplicate custom_ids).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from openai_compat.batch.store import new_id

logger = logging.getLogger("openai_compat.batch")

ENDPOINTS = ("/v1/embeddings", "/v1/rerank", "/v2/rerank", "/v1/classify")
RETRY_STATUSES = (429, 503)  # overloaded or draining: the line is tried again, not failed

# (status, body bytes, request id) for a POST of `body` to `url`
Dispatch = Callable[[str, bytes], Awaitable[tuple[int, bytes, str]]]


class Retry(Exception):
    """A line the server could not take now (429/503): the chunk is tried again later."""


@dataclass
class LineResult:
    ok: bool
    record: dict[str, Any]

    def encoded(self) -> bytes:
        """The record as one JSON line, without its newline (floats exactly as served)."""
        return orjson.dumps(self.record)


def scan(
    path: Path, limit: int, served: frozenset[str] | None = None
) -> tuple[int, frozenset[int], frozenset[str]]:
    """Non-blank lines of an input file; the line numbers (0-based, blank lines not counted)
    whose custom_id an earlier line already used; and which of the `served` model names the
    lines' bodies name (bounded by `served`: other names are not kept). Stops counting past
    `limit`."""
    seen: set[str] = set()
    duplicates: set[int] = set()
    models: set[str] = set()
    n = 0
    with path.open("rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            try:
                line = orjson.loads(raw)
                custom_id = line.get("custom_id")
                body = line.get("body")
                model = body.get("model") if isinstance(body, dict) else None
            except (ValueError, AttributeError):
                custom_id = model = None
            if isinstance(custom_id, str):
                if custom_id in seen:
                    duplicates.add(n)
                seen.add(custom_id)
            if served is not None and isinstance(model, str) and model in served:
                models.add(model)
            n += 1
            if n > limit:
                break
    return n, frozenset(duplicates), frozenset(models)


def _error(custom_id: Any, code: str, message: str, line: int | None = None) -> LineResult:
    """An error record; `line` (1-based, in the input file) as OpenAI's validation errors."""
    error: dict[str, Any] = {"code": code, "message": message}
    if line is not None:
        error["line"] = line
    return LineResult(
        False,
        {
            "id": new_id("batch_req_"),
            "custom_id": custom_id if isinstance(custom_id, str) else None,
            "response": None,
            "error": error,
        },
    )


def duplicate_record(custom_id: str, number: int | None = None) -> LineResult:
    """The record of a line whose custom_id an earlier line used."""
    return _error(
        custom_id, "duplicate_custom_id", f"custom_id {custom_id!r} was used before.", number
    )


def expired_record(custom_id: Any, number: int | None = None) -> LineResult:
    """The record of a line not run before its batch expired (OpenAI's wording and code)."""
    return _error(
        custom_id,
        "batch_expired",
        "This request could not be executed before the completion window expired.",
        number,
    )


async def run_line(
    raw: bytes, endpoint: str, duplicate: bool, dispatch: Dispatch, number: int | None = None
) -> LineResult:
    """One input line (line `number` of the file, 1-based) -> its output or error record
    (OpenAI's batch line format). Whatever the line holds, it fails alone: it never raises
    but Retry (the server is busy) or cancellation."""
    where = f"Line {number}" if number is not None else "The line"
    try:
        line = orjson.loads(raw)
    except ValueError as exc:
        return _error(None, "invalid_json", f"{where} is not valid JSON: {exc}.", number)
    if not isinstance(line, dict):
        return _error(None, "invalid_request", f"{where} must be a JSON object.", number)
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _error(None, "missing_custom_id", f"{where} needs a string 'custom_id'.", number)
    if duplicate:
        return duplicate_record(custom_id, number)
    if line.get("method") != "POST":
        return _error(custom_id, "invalid_method", "'method' must be 'POST'.", number)
    if line.get("url") != endpoint:
        return _error(
            custom_id,
            "invalid_url",
            f"'url' must be the batch's endpoint {endpoint!r}, got {line.get('url')!r}.",
            number,
        )
    body = line.get("body")
    if not isinstance(body, dict):
        return _error(custom_id, "invalid_body", "'body' must be a JSON object.", number)
    try:
        encoded = orjson.dumps(body)
    except orjson.JSONEncodeError as exc:  # e.g. nested deeper than orjson writes (254)
        return _error(custom_id, "invalid_body", f"'body' cannot be sent: {exc}.", number)
    try:
        status, content, request_id = await dispatch(endpoint, encoded)
    except TimeoutError:
        return _error(custom_id, "timeout", "The line took longer than its time limit.", number)
    except Exception as exc:  # the route or transport broke on this line: it fails alone
        logger.exception("batch line %s (%s) failed on the server", number, custom_id)
        return _error(
            custom_id,
            "server_error",
            f"The server failed on this line ({type(exc).__name__}).",
            number,
        )
    if status in RETRY_STATUSES:
        raise Retry(status)
    try:
        parsed = orjson.loads(content)
    except ValueError:
        parsed = content.decode(errors="replace")
    record = {
        "id": new_id("batch_req_"),
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": parsed},
        "error": None,
    }
    return LineResult(200 <= status < 300, record)


def _inputs(raw: bytes) -> int:
    """How many inputs a line asks for (its body's input / documents list), at least 1."""
    try:
        body = orjson.loads(raw).get("body") or {}
        items = body.get("input", body.get("documents", body.get("texts")))
    except (ValueError, AttributeError):
        return 1
    return max(1, len(items)) if isinstance(items, list) else 1


def read_wave(
    f: BinaryIO, max_lines: int, max_inputs: int, physical: int
) -> tuple[list[tuple[int, bytes]], int, int]:
    """Non-blank lines from f's position (which is after line `physical` of the file), up to
    max_lines or until they hold max_inputs inputs, each with its 1-based line number; the
    offset after the last one read, and its line number."""
    lines: list[tuple[int, bytes]] = []
    inputs = 0
    while len(lines) < max_lines and inputs < max_inputs:
        start = f.tell()
        raw = f.readline()
        if not raw:
            break
        if raw.strip():
            n = _inputs(raw)
            if lines and inputs + n > max_inputs:
                f.seek(start)  # the next wave's first line: a wave admission can take whole
                break
            lines.append((physical + 1, raw))
            inputs += n
        physical += 1
    return lines, f.tell(), physical


def count_lines(path: Path, end: int) -> int:
    """Lines of the file before byte offset `end` (where a resumed job carries on)."""
    n = 0
    with path.open("rb") as f:
        while end > 0:
            chunk = f.read(min(end, 1 << 20))
            if not chunk:
                break
            n += chunk.count(b"\n")
            end -= len(chunk)
    return n


def expire_rest(inp: BinaryIO, err: BinaryIO, physical: int) -> int:
    """Blocking: an error record for every line from inp's position on, as OpenAI writes for
    a batch that expired (code batch_expired); how many."""
    n = 0
    for raw in inp:
        physical += 1
        if not raw.strip():
            continue
        try:
            custom_id = orjson.loads(raw).get("custom_id")
        except (ValueError, AttributeError):
            custom_id = None
        record = expired_record(custom_id, physical)
        err.write(record.encoded() + b"\n")
        n += 1
    err.flush()
    return n
