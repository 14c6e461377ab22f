"""Closing a batch job: its output and error files registered as Files API files (cut to
what was committed) and its final status (failed, cancelled, expired, completed). Blocking
(the store): the runner calls these in a thread. Idempotent: the files' ids come from the
batch's, so a crash in here is simply done again.
"""

from __future__ import annotations

import time
from typing import Any

from openai_compat.batch.store import OPEN_STATUSES, Store


def fail(store: Store, batch_id: str, code: str, message: str) -> None:
    """Close a batch as failed; the lines it finished stay reachable (its output and
    error files as last committed). Blocking (the store): run it in a thread."""
    obj = store.batch(batch_id)
    if obj is None or obj["status"] not in OPEN_STATUSES:
        return
    if obj["status"] != "validating":
        progress = store.progress(batch_id)
        register_files(store, obj, progress.output_bytes, progress.error_bytes)
    obj["status"], obj["failed_at"] = "failed", int(time.time())
    obj["errors"] = {"object": "list", "data": [{"code": code, "message": message}]}
    store.save(obj)


def finalize(store: Store, obj: dict[str, Any]) -> None:
    """Register the output and error files and close the batch. Idempotent: the files'
    ids come from the batch's, so a crash in here is simply done again. Blocking (the
    store): run it in a thread."""
    batch_id = obj["id"]
    now = int(time.time())
    cancelled = obj["status"] == "cancelling" or store.status(batch_id) == "cancelling"
    expired = not cancelled and obj["expires_at"] is not None and now > obj["expires_at"]
    obj["finalizing_at"] = obj.get("finalizing_at") or now
    register_files(store, obj)
    if cancelled:
        obj["status"], obj["cancelled_at"] = "cancelled", now
    elif expired:
        obj["status"], obj["expired_at"] = "expired", now
    else:
        obj["status"], obj["completed_at"] = "completed", now
    store.save(obj)


def register_files(
    store: Store,
    obj: dict[str, Any],
    output_bytes: int | None = None,
    error_bytes: int | None = None,
) -> None:
    """Make the batch's output file (and its error file, if any line failed) files of
    the Files API, first cut to the committed sizes when given. Idempotent: the files'
    ids come from the batch's."""
    batch_id = obj["id"]
    folder = store.batch_dir(batch_id)
    folder.mkdir(parents=True, exist_ok=True)
    suffix = batch_id.removeprefix("batch_")
    owner = store.batch_owner(batch_id)  # its output is its owner's
    out, err = folder / "output.jsonl", folder / "errors.jsonl"
    for path, size in ((out, output_bytes), (err, error_bytes)):
        with path.open("ab") as f:
            if size is not None and f.tell() > size:
                f.truncate(size)  # written after the last commit: not part of the job
    for path, kind, key in ((out, "output", "output_file_id"), (err, "error", "error_file_id")):
        if kind == "error" and err.stat().st_size == 0:
            continue  # no line failed: no error file
        obj[key] = store.add_file(
            path,
            purpose="batch_output",
            filename=f"{batch_id}_{kind}.jsonl",
            file_id=f"file-{suffix}{kind[0]}",
            move=False,
            owner=owner,
        )["id"]
