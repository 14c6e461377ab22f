"""`openai-compat batch INPUT.jsonl -o OUTPUT.jsonl`: a batch job without a server.

The same job the Batch API runs, in this process: the app is built with its models and its
batch runner but no HTTP listener, and its state lives beside the output
(OUTPUT.jsonl.state/: the same SQLite database and files as --data-dir). Interrupted (Ctrl-C,
kill -9, a crash), the same command continues from the last committed chunk; when the job is
done the output (and OUTPUT.errors.jsonl, if any line failed) is moved into place and the
state folder removed.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from openai_compat.frame.settings import Settings

FINAL = ("completed", "failed", "cancelled", "expired")
INPUT_ID = "file-cli-input"


def errors_path(output: Any) -> Any:
    """OUTPUT.jsonl -> OUTPUT.errors.jsonl (a Path for a Path, a string for a path or URI)."""
    if isinstance(output, Path):
        return output.with_name(output.stem + ".errors" + output.suffix)
    stem, dot, suffix = str(output).rpartition(".")
    return f"{stem}.errors.{suffix}" if dot and "/" not in suffix else f"{output}.errors"


def run(settings: Settings, source: Path, output: Path, endpoint: str, force: bool) -> int:
    if not source.is_file():
        print(f"openai-compat batch: no such input file: {source}", file=sys.stderr)
        return 2
    state = output.with_name(output.name + ".state")
    if output.exists() and not state.exists() and not force:
        print(
            f"openai-compat batch: {output} exists and no job is pending for it; use --force "
            "to run again and replace it",
            file=sys.stderr,
        )
        return 2
    settings = settings.model_copy(update={"data_dir": state})
    try:
        status = asyncio.run(_run(settings, source.resolve(), output, endpoint))
    except KeyboardInterrupt:
        print("\ninterrupted: run the same command again to continue", file=sys.stderr)
        return 130
    return 0 if status == "completed" else 1


async def _run(settings: Settings, source: Path, output: Path, endpoint: str) -> str:
    from openai_compat.batch.lines import ENDPOINTS
    from openai_compat.batch.service import BatchService
    from openai_compat.engine import infinity
    from openai_compat.web.app import create_app

    if endpoint not in ENDPOINTS:
        raise SystemExit(f"openai-compat batch: endpoint must be one of {', '.join(ENDPOINTS)}")
    app = create_app(settings)
    for noisy in (infinity.PACKAGE, "sentence_transformers", "openai_compat.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)  # the progress bar speaks
    service: BatchService = app.state.batches
    lifecycle = app.state.lifecycle
    async with app.router.lifespan_context(app):
        while lifecycle.phase == "loading":  # noqa: ASYNC110 (a phase, not an event)
            await asyncio.sleep(0.1)
        if lifecycle.phase != "ready":
            raise SystemExit(f"openai-compat batch: {lifecycle.error}")
        batch = _job(service, source, endpoint)
        batch = await _follow(service, batch["id"])
        store = service.store
        results = [store.file_path(batch.get(k) or "") for k in ("output_file_id", "error_file_id")]
    # the app has stopped (its runner and database closed): the state folder can go
    if batch["status"] == "completed":
        _deliver(batch, results[0], results[1], output, settings.data())
    else:
        print(f"openai-compat batch: the job ended {batch['status']}: {batch.get('errors')}")
    return str(batch["status"])


def _job(service: Any, source: Path, endpoint: str) -> dict[str, Any]:
    """The pending job of this state folder, or a new one for `source`."""
    from openai_compat.batch.service import batch_object
    from openai_compat.batch.store import OPEN_STATUSES

    store = service.store
    batches, _ = store.batches(after=None, limit=1)
    if batches:
        batch: dict[str, Any] = batches[0]
        path = store.file_path(batch["input_file_id"])
        if path != source or batch["endpoint"] != endpoint:
            raise SystemExit(
                f"openai-compat batch: the pending job here reads {path} for "
                f"{batch['endpoint']}; finish it, or remove {store.root} to start over"
            )
        if batch["expires_at"] is not None and batch["status"] in OPEN_STATUSES:
            batch["expires_at"] = None  # a job from before CLI jobs stopped expiring
            store.save(batch)
        return batch
    store.add_file(source, purpose="batch", filename=source.name, file_id=INPUT_ID, move=False)
    created: dict[str, Any] = service.submit(
        "",  # a local job: no API key, no owner
        batch_object(
            input_file_id=INPUT_ID,
            endpoint=endpoint,
            completion_window="24h",
            metadata=None,
            now=int(time.time()),
            expires=False,  # a local job resumes whenever it is run again
        ),
    )
    return created


async def _follow(service: Any, batch_id: str) -> dict[str, Any]:
    """Wait for the job, with a progress bar: rows done, rows/s, time left."""
    from tqdm import tqdm

    store = service.store
    batch: dict[str, Any] = store.batch(batch_id)
    bar = tqdm(unit="rows", desc="batch", dynamic_ncols=True, file=sys.stderr)
    try:
        while True:
            batch = store.batch(batch_id)
            counts = batch["request_counts"]
            if counts["total"] and bar.total != counts["total"]:
                bar.total = counts["total"]
                bar.refresh()
            done = counts["completed"] + counts["failed"]
            bar.update(done - bar.n)
            bar.set_postfix(failed=counts["failed"], refresh=False)
            if batch["status"] in FINAL:
                return batch
            await asyncio.sleep(0.25)
    finally:
        bar.close()


def _deliver(
    batch: dict[str, Any], out: Path | None, err: Path | None, output: Path, state: Path
) -> None:
    assert out is not None
    shutil.move(str(out), output)
    errors = errors_path(output)
    errors.unlink(missing_ok=True)
    if err is not None:
        shutil.move(str(err), errors)
    shutil.rmtree(state, ignore_errors=True)
    counts = batch["request_counts"]
    print(
        f"{counts['completed']} lines -> {output}"
        + (f"; {counts['failed']} failed -> {errors}" if counts["failed"] else ""),
        file=sys.stderr,
    )
