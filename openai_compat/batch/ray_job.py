"""`openai-compat batch INPUT -o OUTPUT --ray [ADDRESS]`: the same job on a Ray cluster.

Ray Data reads the input (a local path or any URI pyarrow understands: s3://, gs://, ...),
an actor pool of model replicas runs the lines (each actor builds this server's app in
process, models and all, and sends every line through its route, exactly as the server
and the local CLI do), and the driver writes the results in input order to OUTPUT (and
failed lines to OUTPUT.errors.jsonl), through pyarrow's filesystems too. The output equals the
local run's line for line (the random `id` / `request_id` fields aside).

Ray is an optional extra: `pip install 'openai-compat[ray]'`. Model sources must be reachable
from every node (hub ids are downloaded there; local folders must exist there). A Ray job is
not resumable: rerun it whole (use the local CLI for resumable runs on one machine).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from openai_compat.frame.settings import Settings

LINES_PER_CALL = 32  # rows one actor call takes
CONCURRENT_LINES = 4  # lines an actor has in its engine at once


class LineWorker:
    """A Ray actor: one replica of the app (models loaded once), running lines through it."""

    def __init__(self, settings_json: str, endpoint: str) -> None:
        import httpx

        from openai_compat.ground import logs
        from openai_compat.web.app import create_app

        settings = Settings.model_validate_json(settings_json)
        # the app's own Batch API store is unused here: keep it out of the real data dir
        # (model_copy does not validate: the value must already be a Path)
        # No API key: the lines reach the app in process, never over a network.
        settings = settings.model_copy(
            update={
                "data_dir": Path(tempfile.mkdtemp(prefix="oc-ray-")),
                "api_key": (),
                "keys_file": None,
            }
        )
        logs.configure("warning", settings.log_format)
        self.endpoint = endpoint
        self.line_timeout = settings.batch_line_timeout
        self.loop = asyncio.new_event_loop()
        self.app = create_app(settings)
        self.lifespan = self.app.router.lifespan_context(self.app)
        self.loop.run_until_complete(self._start())
        # The hook concurrent.futures itself uses to stop its workers at exit (private API
        # since 3.9; checked at run time). Hooks run newest first: registered after the
        # engine made its thread pools (and concurrent.futures.thread registered its join),
        # ours runs before that join.
        import concurrent.futures.thread  # noqa: F401 (its exit hook exists before ours)

        register = getattr(threading, "_register_atexit", None)
        if register is not None:
            register(self.close)
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app, raise_app_exceptions=False),
            base_url="http://batch.internal",
            timeout=self.line_timeout,
        )

    async def _start(self) -> None:
        await self.lifespan.__aenter__()
        lifecycle = self.app.state.lifecycle
        while lifecycle.phase == "loading":  # noqa: ASYNC110 (a phase, not an event)
            await asyncio.sleep(0.1)
        if lifecycle.phase != "ready":
            raise RuntimeError(f"models failed to load: {lifecycle.error}")

    def close(self) -> None:
        """Stop the app (models, engine threads); idempotent. Runs when the actor process
        exits: the engine's worker threads are not daemon threads, so without this the
        interpreter's exit waits on them forever and the process outlives the job (and
        ray.shutdown()), holding its models. Registered with threading's exit hooks, which
        run before non-daemon threads are joined (Python's own atexit runs after that)."""
        loop = getattr(self, "loop", None)
        if loop is None or loop.is_closed():
            return
        try:
            loop.run_until_complete(self._stop())
        except Exception:  # the process is going away either way: say so, do not raise
            logging.getLogger(__name__).warning("stopping the replica failed", exc_info=True)
        finally:
            loop.close()

    __del__ = close  # Ray Data's graceful actor shutdown drops the UDF

    async def _stop(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            await client.aclose()
        await self.lifespan.__aexit__(None, None, None)

    async def _dispatch(self, url: str, body: bytes) -> tuple[int, bytes, str]:
        async with asyncio.timeout(self.line_timeout):  # httpx's never fires over ASGI
            resp = await self.client.post(
                url, content=body, headers={"Content-Type": "application/json"}
            )
        return resp.status_code, resp.content, resp.headers.get("x-request-id", "")

    async def _line(self, raw: bytes, number: int, gate: asyncio.Semaphore) -> tuple[bool, str]:
        from openai_compat.batch.lines import Retry, run_line

        async with gate:
            while True:
                try:
                    result = await run_line(raw, self.endpoint, False, self._dispatch, number)
                    return result.ok, result.encoded().decode()
                except Retry:  # the replica's admission limit: wait for room
                    await asyncio.sleep(0.2)

    async def _all(self, lines: list[bytes], numbers: list[int]) -> list[tuple[bool, str]]:
        gate = asyncio.Semaphore(CONCURRENT_LINES)
        return list(
            await asyncio.gather(
                *(self._line(raw, n, gate) for raw, n in zip(lines, numbers, strict=True))
            )
        )

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        lines = [bytes(raw) for raw in batch["line"]]
        numbers = [int(n) for n in batch["number"]]
        results = self.loop.run_until_complete(self._all(lines, numbers))
        return {
            "ok": [ok for ok, _ in results],
            "record": [rec for _, rec in results],
            "number": numbers,
        }


def split_lines(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole input file (read as bytes: an invalid UTF-8 byte fails its own line, not the
    job) -> its non-blank lines, each with its 1-based line number, as the local run reads."""
    out = []
    # split as a file object splits (on b"\n" only), as the local run reads its input
    for number, raw in enumerate(io.BytesIO(bytes(row["bytes"])), start=1):
        if raw.strip():
            out.append({"line": raw, "number": number})
    return out


def job_problem(endpoint: str, requests: int, settings: Settings) -> str | None:
    """Why the job cannot run, by the rules a local or server batch has: the endpoint, and
    the most request lines one input may hold."""
    from openai_compat.batch.lines import ENDPOINTS

    if endpoint not in ENDPOINTS:
        return f"endpoint must be one of {', '.join(ENDPOINTS)}"
    if requests > settings.batch_max_requests:
        return (
            f"the input file has more than {settings.batch_max_requests} requests "
            "(batch_max_requests)"
        )
    return None


def run(
    settings: Settings,
    source: str,
    output: str,
    endpoint: str,
    address: str | None,
    actors: int,
    cpus_per_actor: float,
    gpus_per_actor: float,
) -> int:
    try:
        import ray
        import ray.data
        from pyarrow import fs
    except ImportError:
        print(
            "openai-compat batch --ray needs Ray: pip install 'openai-compat[ray]'", file=sys.stderr
        )
        return 2
    from tqdm import tqdm

    from openai_compat.batch.cli import errors_path
    from openai_compat.batch.lines import duplicate_record

    ray.init(address=address or None, include_dashboard=False, log_to_driver=False)
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True  # results come back in input order
        ctx.enable_progress_bars = False  # ours counts rows
        if (problem := job_problem(endpoint, 0, settings)) is not None:
            print(f"openai-compat batch: {problem}", file=sys.stderr)
            return 2
        # reading is light: it must not wait for CPUs the actors hold
        ds = ray.data.read_binary_files(source, num_cpus=0.1)
        ds = ds.flat_map(split_lines, num_cpus=0.1).materialize()
        if (problem := job_problem(endpoint, ds.count(), settings)) is not None:
            print(f"openai-compat batch: the job failed: {problem}", file=sys.stderr)
            return 1
        results = ds.map_batches(
            LineWorker,
            # the actors need no API key (lines reach their app in process): none is shipped
            fn_constructor_args=(_actor_settings(settings), endpoint),
            batch_size=LINES_PER_CALL,
            concurrency=actors,
            num_cpus=cpus_per_actor,
            num_gpus=gpus_per_actor,
            batch_format="numpy",
        )
        out_fs, out_path = fs.FileSystem.from_uri(_uri(output))
        err_uri = errors_path(output)
        err_fs, err_path = fs.FileSystem.from_uri(_uri(err_uri))
        seen: set[str] = set()
        counts = {"completed": 0, "failed": 0}
        bar = tqdm(unit="rows", desc="batch (ray)", dynamic_ncols=True, file=sys.stderr)
        with out_fs.open_output_stream(out_path) as out, err_fs.open_output_stream(err_path) as err:
            for row in results.iter_rows():
                ok, record = bool(row["ok"]), str(row["record"])
                parsed = json.loads(record)
                custom_id = parsed.get("custom_id")
                if isinstance(custom_id, str) and custom_id and custom_id in seen:
                    # as the local run: a custom_id used before fails that line
                    ok = False
                    record = duplicate_record(custom_id, int(row["number"])).encoded().decode()
                if isinstance(custom_id, str) and custom_id:
                    seen.add(custom_id)
                (out if ok else err).write(record.encode() + b"\n")
                counts["completed" if ok else "failed"] += 1
                bar.update(1)
        bar.close()
        if counts["failed"] == 0:
            err_fs.delete_file(err_path)
        print(
            f"{counts['completed']} lines -> {output}"
            + (f"; {counts['failed']} failed -> {err_uri}" if counts["failed"] else ""),
            file=sys.stderr,
        )
        return 0
    finally:
        ray.shutdown()


def _uri(path: str) -> str:
    """pyarrow wants absolute local paths or URIs."""
    if "://" in path:
        return path
    return str(Path(path).resolve())


def _actor_settings(settings: Settings) -> str:
    """The settings an actor is built from, as JSON, without the server's API keys."""
    return settings.model_copy(update={"api_key": (), "keys_file": None}).model_dump_json()
