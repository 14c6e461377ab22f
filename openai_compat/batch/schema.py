"""The batch store's SQLite schema, as numbered migrations (PRAGMA user_version), and what its
rows are as the API shows them.

A new version appends a script to MIGRATIONS; store.py applies the missing ones in order, each
in one transaction, and refuses a database newer than it knows. Never edit a published one.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from dataclasses import dataclass
from typing import Any

# Schema versions, applied in order to a database whose PRAGMA user_version is lower, each in
# its own transaction. Version 1 is the first layout (databases from before versioning have
# user_version 0 and its tables already: IF NOT EXISTS makes it a no-op for them).
_V1 = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    purpose TEXT NOT NULL,
    filename TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    path TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    status TEXT NOT NULL,
    obj TEXT NOT NULL,
    input_offset INTEGER NOT NULL DEFAULT 0,
    lines_read INTEGER NOT NULL DEFAULT 0,
    output_bytes INTEGER NOT NULL DEFAULT 0,
    error_bytes INTEGER NOT NULL DEFAULT 0,
    duplicates TEXT NOT NULL DEFAULT '[]'
);
"""
# Version 2: request counts in columns (each wave updates them and its progress, not the whole
# batch object), and an owner per file and batch (a hash of the API key that made it).
_V2 = """
ALTER TABLE batches ADD COLUMN completed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN failed INTEGER NOT NULL DEFAULT 0;
UPDATE batches SET
    completed = COALESCE(json_extract(obj, '$.request_counts.completed'), 0),
    failed = COALESCE(json_extract(obj, '$.request_counts.failed'), 0);
ALTER TABLE batches ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE files ADD COLUMN owner TEXT NOT NULL DEFAULT '';
"""
# Version 3: which models a batch needs, so that a server started with other models leaves it
# pending rather than failing its lines: `served` holds the names the submitting server served
# (NULL for batches from before), `models` those of them its lines name (set at validation).
_V3 = """
ALTER TABLE batches ADD COLUMN served TEXT;
ALTER TABLE batches ADD COLUMN models TEXT;
"""
# Version 4: lines finished out of order past the committed offset (a wave cut short by a
# cancel, an expiry, a deferral or a stop keeps its finished lines; a resume skips them).
_V4 = """
ALTER TABLE batches ADD COLUMN done_ahead TEXT NOT NULL DEFAULT '[]';
"""
MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3, _V4)
SCHEMA_VERSION = len(MIGRATIONS)


@dataclass
class Progress:
    """How far a batch got, as last committed."""

    input_offset: int = 0  # bytes of the input file done
    lines_read: int = 0  # non-blank lines done
    output_bytes: int = 0
    error_bytes: int = 0
    duplicates: frozenset[int] = frozenset()  # line numbers whose custom_id came before
    # line numbers at or past lines_read already run, their records written (a wave cut short)
    done_ahead: frozenset[int] = frozenset()


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


class StoreBusy(RuntimeError):
    """Another process holds this data dir: two runners would run the same jobs twice."""


def file_from_row(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "id": row["id"],
        "object": "file",
        "bytes": row["bytes"],
        "created_at": row["created_at"],
        "filename": row["filename"],
        "purpose": row["purpose"],
        "status": "processed",
        # `expires_at` and `status_details` are left out, not null: OpenAI's schema types them
        # as non-nullable (our files do not expire; status_details is deprecated there)
    }


def batch_from_row(row: sqlite3.Row) -> dict[str, Any]:
    """The batch as the API shows it: its stored object with the counts of the last wave."""
    obj: dict[str, Any] = json.loads(row["obj"])
    obj["request_counts"]["completed"] = row["completed"]
    obj["request_counts"]["failed"] = row["failed"]
    return obj
