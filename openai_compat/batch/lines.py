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
from openai_compat.ground.bodies import INLINE_BYTES
from openai_compat.tenants.limits import TOO_LARGE

logger = logging.getLogger("openai_compat.batch")

ENDPOINTS = ("/v1/embeddings", "/v1/rerank", "/v2/rerank", "/v1/classify")
BIG = 1 << 30  # the input count of a line too big to parse on the loop: alone in its wave
RETRY_STATUSES = (429, 503)  # overloaded or draining: the line is tried again, not failed

# (status, body bytes, request id) for a POST of `body` to `url`
Dispatch = Callable[[str, bytes], Awaitable[tuple[int, bytes, str]]]


class Retry(Exception):
    """A line the server could not take now (429/503): the chunk is tried again later.
    `final` is the line's record should it never get through (its last answer)."""

    def __init__(self, status: int, final: LineResult | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.final = final


# A line's envelope, read by split_line: ("ok", custom_id, method, url, body bytes or None,
# model or None) or ("invalid", code, message). Big lines are split in a worker process.
Parts = tuple[Any, ...]
# Runs split_line (or validates a big answer) off the event loop: the app's body workers.
OffLoop = Callable[..., Awaitable[Any]]


def split_line(raw: bytes, encode_body: bool = True) -> Parts:
    """An input line's envelope, its body re-encoded for the route (if `encode_body`);
    blocking and GIL-bound (orjson never releases it): big lines run it in a worker process."""
    try:
        line = orjson.loads(raw)
    except ValueError as exc:
        return ("invalid", "invalid_json", f"is not valid JSON: {exc}")
    if not isinstance(line, dict):
        return ("invalid", "invalid_request", "must be a JSON object")
    body = line.get("body")
    encoded: bytes | str | None = None
    if isinstance(body, dict) and encode_body:
        try:
            encoded = orjson.dumps(body)
        except orjson.JSONEncodeError as exc:  # e.g. nested deeper than orjson writes (254)
            encoded = f"'body' cannot be sent: {exc}."
    model = body.get("model") if isinstance(body, dict) else None
    return ("ok", line.get("custom_id"), line.get("method"), line.get("url"), encoded, model)


def line_size(raw: bytes) -> int:
    """A line's length without its line ending (the request it holds is what is limited)."""
    return len(raw) - (2 if raw.endswith(b"\r\n") else 1 if raw.endswith(b"\n") else 0)


def is_json(content: bytes) -> bool:
    """Whether an answer's body is one JSON document (blocking; big ones off the loop)."""
    try:
        orjson.loads(content)
    except ValueError:
        return False
    return True


async def _inline(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


@dataclass
class LineResult:
    ok: bool
    record: dict[str, Any]

    def encoded(self) -> bytes:
        """The record as one JSON line, without its newline (floats exactly as served)."""
        return orjson.dumps(self.record)


# Splits a big line off the event loop's process, blocking the calling thread (not the loop).
BigSplit = Callable[[bytes], Parts]


def envelope(
    raw: bytes, big: BigSplit | None = None, max_bytes: int | None = None
) -> tuple[Any, Any]:
    """A line's custom_id and model (None where absent or unreadable); blocking. A line over
    INLINE_BYTES is split by `big` (a worker process), since parsing holds the GIL; one over
    `max_bytes` is not read at all (it is refused unread)."""
    if max_bytes is not None and line_size(raw) > max_bytes:
        return None, None
    parts = big(raw) if big is not None and len(raw) > INLINE_BYTES else split_line(raw, False)
    return (parts[1], parts[5]) if parts[0] == "ok" else (None, None)


def scan(
    path: Path,
    limit: int,
    served: frozenset[str] | None = None,
    big: BigSplit | None = None,
    max_bytes: int | None = None,
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
            custom_id, model = envelope(raw, big, max_bytes)
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


def too_large_record(number: int | None, size: int, limit: int) -> LineResult:
    """The record of a line over max_body_bytes, refused unread (as a live request's 413)."""
    where = f"Line {number}" if number is not None else "The line"
    return _error(
        None,
        "request_too_large",
        f"{where} has {size} bytes, more than the {limit} a request may have "
        "(max_body_bytes); it was not read.",
        number,
    )


async def run_line(
    raw: bytes,
    endpoint: str,
    duplicate: bool,
    dispatch: Dispatch,
    number: int | None = None,
    *,
    max_bytes: int | None = None,
    off_loop: OffLoop | None = None,
) -> LineResult:
    """One input line (line `number` of the file, 1-based) -> its output or error record
    (OpenAI's batch line format). Whatever the line holds, it fails alone: it never raises
    but Retry (the server is busy) or cancellation. A line over `max_bytes` is refused
    unread; one over INLINE_BYTES is split, and its answer checked, by `off_loop` (the app's
    body workers), so no big line is parsed on the event loop."""
    where = f"Line {number}" if number is not None else "The line"
    size = line_size(raw)
    if max_bytes is not None and size > max_bytes:
        return too_large_record(number, size, max_bytes)
    run = off_loop if off_loop is not None and len(raw) > INLINE_BYTES else _inline
    parts = await run(split_line, raw)
    if parts[0] == "invalid":
        return _error(None, parts[1], f"{where} {parts[2]}.", number)
    _, custom_id, method, url, body, _model = parts
    if not isinstance(custom_id, str) or not custom_id:
        return _error(None, "missing_custom_id", f"{where} needs a string 'custom_id'.", number)
    if duplicate:
        return duplicate_record(custom_id, number)
    if method != "POST":
        return _error(custom_id, "invalid_method", "'method' must be 'POST'.", number)
    if url != endpoint:
        return _error(
            custom_id,
            "invalid_url",
            f"'url' must be the batch's endpoint {endpoint!r}, got {url!r}.",
            number,
        )
    if body is None:
        return _error(custom_id, "invalid_body", "'body' must be a JSON object.", number)
    if isinstance(body, str):
        return _error(custom_id, "invalid_body", body, number)
    try:
        status, content, request_id = await dispatch(endpoint, body)
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
    # The answer goes into the record as the bytes served (a Fragment: never parsed again
    # here, floats exactly as served) once it is known to be one JSON document.
    check = off_loop if off_loop is not None and len(content) > INLINE_BYTES else _inline
    answer: Any = (
        orjson.Fragment(content)
        if b"\n" not in content and await check(is_json, content)
        else content.decode(errors="replace")
    )
    record = {
        "id": new_id("batch_req_"),
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": answer},
        "error": None,
    }
    result = LineResult(200 <= status < 300, record)
    if status in RETRY_STATUSES and not _final(content):
        raise Retry(status, result)
    return result


def _final(content: bytes) -> bool:
    """A 429 that waiting cannot cure (larger than the owner's whole tokens per minute,
    OpenAI's "Request too large"): the line fails with it instead of being tried again
    until the batch expires."""
    if TOO_LARGE.encode() not in content[:4096]:
        return False
    try:
        error = orjson.loads(content).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return False
    return (
        isinstance(error, dict)
        and error.get("type") == "tokens"
        and str(error.get("message", "")).startswith(TOO_LARGE)
    )


def _inputs(raw: bytes) -> int:
    """How many inputs a line asks for (its body's input / documents list), at least 1."""
    if len(raw) > INLINE_BYTES:
        return BIG  # not parsed here: such a line goes in a wave of its own
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
    offset after the last one read, and its line number. Blocking (file reads): run it in a
    thread. A line over INLINE_BYTES is not parsed to count its inputs: it goes alone."""
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


def expire_rest(
    inp: BinaryIO,
    err: BinaryIO,
    physical: int,
    first: int = 0,
    skip: frozenset[int] = frozenset(),
    big: BigSplit | None = None,
    max_bytes: int | None = None,
) -> tuple[int, int]:
    """Blocking: an error record for every line from inp's position on (line `first` on,
    after the file's line `physical`), as OpenAI writes for a batch that expired (code
    batch_expired), but for the line numbers in `skip` (run already); the records written,
    and the non-blank lines passed."""
    written = passed = 0
    for raw in inp:
        physical += 1
        if not raw.strip():
            continue
        passed += 1
        if first + passed - 1 in skip:
            continue
        custom_id, _ = envelope(raw, big, max_bytes)
        record = expired_record(custom_id, physical)
        err.write(record.encoded() + b"\n")
        written += 1
    err.flush()
    return written, passed
