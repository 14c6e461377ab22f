"""Request bodies -> validated request models, without stalling the event loop on big ones.

Parsing and validating JSON holds the GIL for the whole call (pydantic-core and orjson never
release it), so a worker thread would stall the event loop just the same: 64 MiB of token ids
take seconds. Bodies up to `INLINE_BYTES` are validated in place (a few milliseconds); larger
ones go to a small pool of worker processes, which send back the validated fields in compact
form (token-id arrays as numpy arrays, whose unpickling is a memory copy), and the model is
rebuilt here without validating again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import orjson
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
# Picks the request model from the decoded body (one route, two request shapes).
Chooser = Callable[[Any], type[BaseModel]]

INLINE_BYTES = 1024 * 1024  # validated on the event loop up to this size (~10 ms worst case)
WORKERS = 2


def validate(raw: bytes, model: type[M] | Chooser) -> M:
    """Validate in this thread; ValidationError propagates."""
    if isinstance(model, type) and issubclass(model, BaseModel):
        return model.model_validate_json(raw or b"null")
    choose: Chooser = model  # type: ignore[assignment]
    try:
        data = orjson.loads(raw or b"null")
    except orjson.JSONDecodeError:
        data = None
    chosen: Any = choose(data)
    if data is None:  # let the model report the invalid JSON in its usual words
        return chosen.model_validate_json(raw or b"null")
    return chosen.model_validate(data)


def as_request_error(errors: Sequence[Any]) -> RequestValidationError:
    """pydantic errors of a body as FastAPI's, so the one handler renders them (400)."""
    return RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in errors])


def _ints(values: list[int]) -> Any:
    """Ints as the smallest of int32/int64 arrays that holds them (the transfer back is half
    the size for token ids); ints past int64 stay a list, for the route to refuse by name."""
    try:
        array = np.asarray(values, dtype=np.int64)
    except OverflowError:
        return values
    if len(array) and array.min() >= -(2**31) and array.max() < 2**31:
        return array.astype(np.int32)
    return array


def _compact(value: Any) -> Any:
    """Token-id lists as int arrays (cheap to send back); everything else as it is."""
    if isinstance(value, list) and value:
        first = value[0]
        if isinstance(first, int) and not isinstance(first, bool):
            return _ints(value)
        if isinstance(first, list) and first and isinstance(first[0], int):
            return [_ints(v) for v in value]
    return value


def _parse_in_worker(raw: bytes, model: type[BaseModel] | Chooser) -> tuple[Any, ...]:
    try:
        parsed = validate(raw, model)
    except ValidationError as exc:
        # Without the offending input: it can be most of the body.
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        return ("invalid", errors)
    fields = {name: _compact(value) for name, value in parsed.__dict__.items()}
    return ("ok", type(parsed), fields, parsed.model_fields_set)


class BodyParser:
    """One per app; its worker processes start on the first big body."""

    def __init__(self, workers: int = WORKERS) -> None:
        self._workers = workers
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()  # the loop and the batch runner's threads start it

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        with self._lock:
            return self._start()

    def _start(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            # spawn, not fork: forking a process that runs torch threads is unsafe.
            context = multiprocessing.get_context("spawn")
            self._pool = concurrent.futures.ProcessPoolExecutor(self._workers, context)
        return self._pool

    async def parse(self, raw: bytes, model: type[M] | Chooser) -> M:
        """The body as a validated model; invalid bodies raise RequestValidationError."""
        if len(raw) <= INLINE_BYTES:
            try:
                return validate(raw, model)
            except ValidationError as exc:
                raise as_request_error(exc.errors(include_url=False)) from None
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._executor(), _parse_in_worker, raw, model)
        if result[0] == "invalid":
            raise as_request_error(result[1])
        _, cls, fields, fields_set = result
        built: M = cls.model_construct(_fields_set=fields_set, **fields)
        return built

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) in a worker process (fn and args picklable): GIL-bound work off the loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor(), fn, *args)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """fn(*args, **kwargs) in a worker process, from a thread that may block (never the
        loop)."""
        return self._executor().submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
