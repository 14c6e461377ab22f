"""The batch store's SQLite schema, as numbered migrations (PRAGMA user_version).

A new version appends a script to MIGRATIONS; store.py applies the missing ones in order, each
in one transaction, and refuses a database newer than it knows. Never edit a published one.
"""

from __future__ import annotations

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
MIGRATIONS: tuple[str, ...] = (_V1, _V2)
SCHEMA_VERSION = len(MIGRATIONS)
