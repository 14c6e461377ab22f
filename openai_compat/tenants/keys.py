"""The keys file (`--keys-file`): one `[[keys]]` table per caller, with its name, its key (as a
SHA-256 digest, or plain with a warning), the models it may use, its limits and permissions.

Parsing is strict: an unknown field, a duplicate name or key, a bad digest, a limit below 1 or
an `expires` that is not RFC 3339 refuses the whole file with one line naming the line of the
file and the problem (`KeysFileError`); a server keeps the keys in force when a reload finds
such a file. Keys are compared as digests, each in constant time, all of them every time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

# The label --api-key keys share in metrics, logs and batch ownership (a bounded set of names:
# the keys file's, and this one).
API_KEY_NAME = "api-key"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_FIELDS = {
    "name",
    "key",
    "key_sha256",
    "models",
    "rpm",
    "tpm",
    "max_concurrent",
    "weight",
    "batch",
    "admin",
    "expires",
    "set_keep_alive",
}


class KeysFileError(ValueError):
    """The keys file cannot be used; the message is one line naming where and why."""


@dataclass(frozen=True)
class Key:
    """One caller. `models`: served names (and aliases) it may use, None for all."""

    name: str
    digest: bytes  # SHA-256 of the key
    models: frozenset[str] | None = None
    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int | None = None
    weight: float = 1.0
    batch: bool = True
    admin: bool = False
    # may send keep_alive (Ollama's, our extension): one key's keep_alive would unload a
    # model every key shares, so keys-file keys need it granted; --api-key keys have it
    set_keep_alive: bool = False
    expires: datetime | None = None
    plain: bool = False  # written in the file as `key` (a start-up warning says so)

    @property
    def limited(self) -> bool:
        """Whether answers carry rate-limit headers (it has rpm or tpm)."""
        return self.rpm is not None or self.tpm is not None

    def expired(self, now: datetime) -> bool:
        return self.expires is not None and now >= self.expires

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models


def digest_of(token: bytes | str) -> bytes:
    raw = token.encode() if isinstance(token, str) else token
    return hashlib.sha256(raw).digest()


def api_keys(keys: Iterable[str]) -> list[Key]:
    """--api-key's keys: every model, no limits, one shared name."""
    return [Key(API_KEY_NAME, digest_of(k), set_keep_alive=True) for k in keys]


class KeyRing:
    """The keys in force. `find` hashes the presented token once and compares it with every
    key's digest (hmac.compare_digest), never stopping early: the time does not depend on
    which key matched, or how much of one."""

    def __init__(self, keys: Sequence[Key]) -> None:
        self.keys = tuple(keys)
        self.by_name = {k.name: k for k in self.keys if k.name != API_KEY_NAME}

    def __bool__(self) -> bool:
        return bool(self.keys)

    def find(self, token: bytes) -> Key | None:
        if not token:
            return None
        presented = digest_of(token)
        found: Key | None = None
        for key in self.keys:
            if hmac.compare_digest(presented, key.digest) and found is None:
                found = key
        return found

    def names(self) -> list[str]:
        """The metric labels keys can have (bounded by the file)."""
        names = list(self.by_name)
        if any(k.name == API_KEY_NAME for k in self.keys):
            names.append(API_KEY_NAME)
        return names


def _table_lines(text: str) -> list[int]:
    """The line number (1-based) of each `[[keys]]` header, in order."""
    return [
        i + 1
        for i, line in enumerate(text.splitlines())
        if re.match(r"\s*\[\[\s*keys\s*\]\]", line)
    ]


def _expires(value: Any) -> datetime:
    if isinstance(value, datetime):
        when = value
    elif isinstance(value, date):
        raise ValueError("expires needs a time and an offset (RFC 3339), not a bare date")
    elif isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ValueError(f"expires {value!r} is not an RFC 3339 date-time") from None
    else:
        raise ValueError("expires must be an RFC 3339 date-time (a string or a TOML datetime)")
    if when.tzinfo is None:
        raise ValueError("expires needs an offset (Z or +hh:mm), as RFC 3339 requires")
    return when.astimezone(UTC)


def _limit(table: dict[str, Any], field: str) -> int | None:
    value = table.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field} must be a whole number >= 1 (leave it out for no limit)")
    return value


def _key(table: Any) -> Key:
    if not isinstance(table, dict):
        raise ValueError("each [[keys]] entry must be a table")
    unknown = set(table) - _FIELDS
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(sorted(unknown))}")
    name = table.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            "name is required: 1-64 letters, digits, '.', '_' or '-', starting with a letter "
            "or digit"
        )
    if name == API_KEY_NAME:
        raise ValueError(f"name {API_KEY_NAME!r} is reserved for --api-key keys")
    plain, hashed = table.get("key"), table.get("key_sha256")
    if (plain is None) == (hashed is None):
        raise ValueError("give exactly one of key_sha256 (recommended) or key")
    if hashed is not None:
        if not isinstance(hashed, str) or not _HEX64.fullmatch(hashed.lower()):
            raise ValueError("key_sha256 must be 64 hexadecimal digits (sha256sum of the key)")
        digest = bytes.fromhex(hashed.lower())
    else:
        if not isinstance(plain, str) or not plain.strip() or plain != plain.strip():
            raise ValueError("key must be a non-empty string without surrounding whitespace")
        digest = digest_of(plain)
    models = table.get("models")
    if models is not None:
        if not isinstance(models, list) or not all(isinstance(m, str) and m for m in models):
            raise ValueError("models must be a list of served model names")
        models = frozenset(models)
    weight = table.get("weight", 1)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight <= 1000:
        raise ValueError("weight must be a number in (0, 1000]")
    for flag in ("batch", "admin", "set_keep_alive"):
        if flag in table and not isinstance(table[flag], bool):
            raise ValueError(f"{flag} must be true or false")
    return Key(
        name=name,
        digest=digest,
        models=models,
        rpm=_limit(table, "rpm"),
        tpm=_limit(table, "tpm"),
        max_concurrent=_limit(table, "max_concurrent"),
        weight=float(weight),
        batch=table.get("batch", True),
        admin=table.get("admin", False),
        set_keep_alive=table.get("set_keep_alive", False),
        expires=_expires(table["expires"]) if "expires" in table else None,
        plain=plain is not None,
    )


def parse(text: str, source: str = "keys file", served: Iterable[str] | None = None) -> list[Key]:
    """The keys of a keys file's text. `served`: every name a client may use (served names
    and aliases); a key naming another model is refused (a typo would lock its caller out)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise KeysFileError(f"{source}: {exc}") from None
    unknown = set(data) - {"keys"}
    if unknown:
        raise KeysFileError(f"{source}: unknown top-level key(s) {', '.join(sorted(unknown))}")
    tables = data.get("keys", [])
    if not isinstance(tables, list):
        raise KeysFileError(f"{source}: 'keys' must be [[keys]] tables")
    lines = _table_lines(text)
    known = set(served) if served is not None else None
    keys: list[Key] = []
    for i, table in enumerate(tables):
        where = f"{source}, line {lines[i]}" if i < len(lines) else f"{source}, keys[{i}]"
        try:
            key = _key(table)
            if known is not None and key.models is not None:
                missing = sorted(key.models - known)
                if missing:
                    raise ValueError(f"models {', '.join(map(repr, missing))} are not served")
        except ValueError as exc:
            raise KeysFileError(f"{where}: {exc}") from None
        for other in keys:
            if other.name == key.name:
                raise KeysFileError(f"{where}: name {key.name!r} is used twice")
            if hmac.compare_digest(other.digest, key.digest):
                raise KeysFileError(f"{where}: the same key as {other.name!r}")
        keys.append(key)
    return keys
