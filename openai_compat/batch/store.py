"""State of the Files and Batch APIs: one SQLite database and a folder of files.

    DATA_DIR/batch.sqlite3          files and batches (WAL, synchronous=FULL)
    DATA_DIR/files/<file id>        uploaded files
    DATA_DIR/batches/<batch id>/    output.jsonl and errors.jsonl, appended as the job runs

A batch's progress (the input offset reached, and the sizes its output and error files had
then) is committed in the same transaction as its request counts, after the lines are on
disk (fsync). A restart truncates both files back to the committed sizes and goes on from the
committed input offset: no output line is lost or written twice, even after `kill -9`.

Back up DATA_DIR with the server stopped (or use `sqlite3 batch.sqlite3 ".backup FILE"` for the
database and copy the folders after it).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from openai_compat.batch import datadir
from openai_compat.batch.schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    Progress,
    StoreBusy,
    batch_from_row,
    file_from_row,
    new_id,
)

__all__ = ["OPEN_STATUSES", "Progress", "Store", "StoreBusy", "new_id"]

OPEN_STATUSES = ("validating", "in_progress", "finalizing", "cancelling")


class Store:
    def __init__(
        self, root: Path, *, max_bytes: int = 0, min_free: int = 0, holder: str = ""
    ) -> None:
        """`max_bytes`: what the data dir may hold (0: no quota); `min_free`: free disk
        always left on its filesystem (see room()); `holder`: who this process is (pid,
        port), written into the data dir's lock for a second process to name."""
        self.root = root
        self.max_bytes, self.min_free = max_bytes, min_free
        self._room = datadir.Room(root)
        (root / "files").mkdir(parents=True, exist_ok=True)
        (root / "batches").mkdir(parents=True, exist_ok=True)
        self._dir_lock = datadir.hold(root, holder)  # one process per data dir
        self._lock = threading.Lock()
        self._db = sqlite3.connect(root / "batch.sqlite3", check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._migrate()

    def _migrate(self) -> None:
        """Bring the database to SCHEMA_VERSION, one version per transaction; a database
        from a newer release is refused rather than misread."""
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise StoreBusy(
                f"the data dir {self.root} was written by a newer openai-compat (schema "
                f"{version}, this one knows {SCHEMA_VERSION})"
            )
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            statements = [s.strip() for s in script.split(";") if s.strip()]
            with self._db:  # one transaction: all of a version, or none of it
                for statement in statements:
                    self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {number}")

    def close(self) -> None:
        with self._lock:
            self._db.close()
        self._dir_lock.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock, self._db:
            yield self._db

    # ------------------------------------------------------------ files

    def add_file(
        self,
        source: Path,
        *,
        purpose: str,
        filename: str,
        file_id: str | None = None,
        move: bool = True,
        owner: str = "",
    ) -> dict[str, Any]:
        """Register a file: an upload (moved into files/) or a batch's own output (left where
        it is). `file_id` makes registering idempotent (INSERT OR IGNORE)."""
        file_id = file_id or new_id("file-")
        path = source
        if move:
            # durable before the database says it exists: its bytes, then its name
            with source.open("rb") as f:
                os.fsync(f.fileno())
            path = self.root / "files" / file_id
            shutil.move(str(source), path)
            fsync_dir(path.parent)
        size = path.stat().st_size
        with self._tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO files (id, purpose, filename, bytes, created_at, path, "
                "owner) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (file_id, purpose, filename, size, int(time.time()), str(path), owner),
            )
        found = self.file(file_id)
        assert found is not None
        return found

    def file(self, file_id: str, owner: str | None = None) -> dict[str, Any] | None:
        """The file; with `owner`, only if that owner made it (others' files do not exist)."""
        with self._lock:
            row = self._db.execute("SELECT * FROM files WHERE id = ?", (file_id,)).fetchone()
        if row is None or (owner is not None and row["owner"] != owner):
            return None
        return file_from_row(row)

    def file_path(self, file_id: str) -> Path | None:
        with self._lock:
            row = self._db.execute("SELECT path FROM files WHERE id = ?", (file_id,)).fetchone()
        return Path(row["path"]) if row else None

    def files(
        self,
        *,
        purpose: str | None,
        after: str | None,
        limit: int,
        order: str,
        owner: str | None = None,
    ) -> tuple[list[dict[str, Any]], bool]:
        where = {"purpose": purpose, "owner": owner}
        return self._page("files", after, limit, order, where, file_from_row)

    def delete_file(self, file_id: str) -> bool:
        path = self.file_path(file_id)
        if path is None:
            return False
        with self._tx() as db:
            db.execute("DELETE FROM files WHERE id = ?", (file_id,))
        if path.is_relative_to(self.root):  # an upload, or a batch's output or error file
            path.unlink(missing_ok=True)
        return True

    def file_in_use(self, file_id: str) -> str | None:
        """The open batch reading this file, if any."""
        marks = ",".join("?" * len(OPEN_STATUSES))
        with self._lock:
            row = self._db.execute(
                f"SELECT id FROM batches WHERE status IN ({marks}) "
                "AND json_extract(obj, '$.input_file_id') = ?",
                (*OPEN_STATUSES, file_id),
            ).fetchone()
        return None if row is None else str(row["id"])

    # ------------------------------------------------------------ disk

    def used_bytes(self) -> int:
        """Bytes the data dir holds: every file (uploads, finished batches' output), and the
        output written so far by batches still open."""
        marks = ",".join("?" * len(OPEN_STATUSES))
        with self._lock:
            (files,) = self._db.execute("SELECT COALESCE(SUM(bytes), 0) FROM files").fetchone()
            (running,) = self._db.execute(
                "SELECT COALESCE(SUM(output_bytes + error_bytes), 0) FROM batches "
                f"WHERE status IN ({marks})",
                OPEN_STATUSES,
            ).fetchone()
        return int(files) + int(running)

    def reserve(self, adding: int) -> tuple[str, str] | None:
        """room() for an upload's next bytes, which then count as the data dir's until
        release(): uploads under way count against the quota with everything else."""
        return self._room.reserve(self.used_bytes(), adding, self.max_bytes, self.min_free)

    def release(self, reserved: int) -> None:
        """An upload's reserved bytes: stored as a file now (counted as such), or dropped."""
        self._room.release(reserved)

    def room(self, adding: int) -> tuple[str, str] | None:
        """Why `adding` more bytes may not be written, as ("quota" | "disk", message); None:
        they may (datadir.Room)."""
        used = self.used_bytes() if self.max_bytes else 0
        return self._room.refusal(used, adding, self.max_bytes, self.min_free)

    # ------------------------------------------------------------ batches

    def batch_dir(self, batch_id: str) -> Path:
        return self.root / "batches" / batch_id

    def add_batch(
        self, obj: dict[str, Any], owner: str = "", served: Iterable[str] | None = None
    ) -> None:
        """`served`: the model names the submitting server serves (a server without one of
        them that its lines name leaves the batch pending: see needs)."""
        self.batch_dir(obj["id"]).mkdir(parents=True, exist_ok=True)
        names = None if served is None else json.dumps(sorted(set(served)))
        with self._tx() as db:
            db.execute(
                "INSERT INTO batches (id, status, obj, owner, served) VALUES (?, ?, ?, ?, ?)",
                (obj["id"], obj["status"], json.dumps(obj), owner, names),
            )

    def served_at_submit(self, batch_id: str) -> frozenset[str] | None:
        """The names the submitting server served (None: a batch from before they were kept)."""
        value = self._column(batch_id, "served")
        return None if value is None else frozenset(json.loads(value))

    def set_needs(self, batch_id: str, models: Iterable[str]) -> None:
        names = json.dumps(sorted(set(models)))
        with self._tx() as db:
            db.execute("UPDATE batches SET models = ? WHERE id = ?", (names, batch_id))

    def needs(self, batch_id: str) -> frozenset[str]:
        """The models a batch's lines name that its submitting server served: a server must
        serve them all to run it (empty: any server may, as for batches from before)."""
        value = self._column(batch_id, "models")
        return frozenset() if value is None else frozenset(json.loads(value))

    def _column(self, batch_id: str, column: str) -> Any:
        with self._lock:
            row = self._db.execute(
                f"SELECT {column} FROM batches WHERE id = ?", (batch_id,)
            ).fetchone()
        return None if row is None else row[column]

    def batch(self, batch_id: str, owner: str | None = None) -> dict[str, Any] | None:
        """The batch; with `owner`, only if that owner made it."""
        with self._lock:
            row = self._db.execute(
                "SELECT obj, completed, failed, owner FROM batches WHERE id = ?", (batch_id,)
            ).fetchone()
        if row is None or (owner is not None and row["owner"] != owner):
            return None
        return batch_from_row(row)

    def batch_owner(self, batch_id: str) -> str:
        return str(self._column(batch_id, "owner") or "")

    def batches(
        self, *, after: str | None, limit: int, owner: str | None = None
    ) -> tuple[list[dict[str, Any]], bool]:
        return self._page("batches", after, limit, "desc", {"owner": owner}, batch_from_row)

    def open_batch_owners(self) -> list[tuple[str, str]]:
        """(batch id, owner) of every open batch, oldest first."""
        marks = ",".join("?" * len(OPEN_STATUSES))
        with self._lock:
            rows = self._db.execute(
                f"SELECT id, owner FROM batches WHERE status IN ({marks}) ORDER BY seq",
                OPEN_STATUSES,
            ).fetchall()
        return [(str(r["id"]), str(r["owner"])) for r in rows]

    def progress(self, batch_id: str) -> Progress:
        with self._lock:
            row = self._db.execute("SELECT * FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return Progress(
            row["input_offset"],
            row["lines_read"],
            row["output_bytes"],
            row["error_bytes"],
            frozenset(json.loads(row["duplicates"])),
            frozenset(json.loads(row["done_ahead"])),
        )

    def save(self, obj: dict[str, Any], progress: Progress | None = None) -> None:
        """Write the runner's copy of a batch (and its progress). A cancel that came in since
        the runner read it wins: the status stays cancelling (obj is updated to match)."""
        with self._tx() as db:
            row = db.execute("SELECT obj FROM batches WHERE id = ?", (obj["id"],)).fetchone()
            stored = json.loads(row["obj"])
            if stored["status"] == "cancelling" and obj["status"] == "in_progress":
                obj["status"], obj["cancelling_at"] = "cancelling", stored["cancelling_at"]
            counts = obj["request_counts"]
            db.execute(
                "UPDATE batches SET status = ?, obj = ?, completed = ?, failed = ? WHERE id = ?",
                (obj["status"], json.dumps(obj), counts["completed"], counts["failed"], obj["id"]),
            )
            if progress is not None:
                db.execute(
                    "UPDATE batches SET input_offset = ?, lines_read = ?, output_bytes = ?, "
                    "error_bytes = ?, duplicates = ?, done_ahead = ? WHERE id = ?",
                    (
                        progress.input_offset,
                        progress.lines_read,
                        progress.output_bytes,
                        progress.error_bytes,
                        json.dumps(sorted(progress.duplicates)),
                        json.dumps(sorted(progress.done_ahead)),
                        obj["id"],
                    ),
                )

    def commit_wave(
        self, batch_id: str, completed: int, failed: int, progress: Progress
    ) -> str | None:
        """A wave's outcome: the request counts and progress, nothing else of the batch (its
        object is rewritten only when its status changes). Returns the status now."""
        with self._tx() as db:
            db.execute(
                "UPDATE batches SET completed = ?, failed = ?, input_offset = ?, lines_read = ?, "
                "output_bytes = ?, error_bytes = ?, done_ahead = ? WHERE id = ?",
                (
                    completed,
                    failed,
                    progress.input_offset,
                    progress.lines_read,
                    progress.output_bytes,
                    progress.error_bytes,
                    json.dumps(sorted(progress.done_ahead)),
                    batch_id,
                ),
            )
            row = db.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return str(row["status"]) if row else None

    def cancel(self, batch_id: str) -> dict[str, Any] | None:
        """Ask an open batch to stop (the runner finishes it as cancelled); atomic against the
        runner's own saves, which keep a cancelling status."""
        with self._tx() as db:
            row = db.execute(
                "SELECT obj, completed, failed FROM batches WHERE id = ?", (batch_id,)
            ).fetchone()
            if row is None:
                return None
            obj = batch_from_row(row)
            if obj["status"] in ("validating", "in_progress"):
                obj["status"] = "cancelling"
                obj["cancelling_at"] = int(time.time())
                db.execute(
                    "UPDATE batches SET status = ?, obj = ? WHERE id = ?",
                    (obj["status"], json.dumps(obj), batch_id),
                )
            return obj

    def status(self, batch_id: str) -> str | None:
        with self._lock:
            row = self._db.execute(
                "SELECT status FROM batches WHERE id = ?", (batch_id,)
            ).fetchone()
        return str(row["status"]) if row else None

    # ------------------------------------------------------------ pagination

    def _page(
        self,
        table: str,
        after: str | None,
        limit: int,
        order: str,
        where: dict[str, str | None],
        convert: Any,
    ) -> tuple[list[dict[str, Any]], bool]:
        """A page of `table` (column = value for each `where` item not None)."""
        clauses: list[str] = []
        args: list[str | int] = []
        for column, value in where.items():
            if value is not None:
                clauses.append(f"{column} = ?")
                args.append(value)
        op, direction = ("<", "DESC") if order == "desc" else (">", "ASC")
        if after is not None:
            clauses.append(f"seq {op} COALESCE((SELECT seq FROM {table} WHERE id = ?), -1)")
            args.append(after)
        sql = f"SELECT * FROM {table}"
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        sql += f" ORDER BY seq {direction} LIMIT ?"
        args.append(limit + 1)
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        return [convert(r) for r in rows[:limit]], len(rows) > limit


def fsync_dir(folder: Path) -> None:
    """Make a folder's entries (files created, renamed, removed in it) durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
