"""Tenants: who a request is (its key), what it may reach (models, the Files and Batch APIs,
/admin) and how much (rpm, tpm, max_concurrent, its weight in a model's queue).

- `keys.py`: the keys file and the key ring (constant-time lookup);
- `limits.py`: the per-key buckets and OpenAI's rate-limit answers; `current`, the caller of
  the request being served (a context variable the gateway sets);
- this module: `Tenants`, the keys in force and their reloading (SIGHUP, and the file's
  modification checked every `POLL_S`): a file that does not parse or validate is refused with
  one log line and the keys in force stay; requests in flight keep the key they started with.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from datetime import UTC, datetime
from pathlib import Path

from openai_compat.tenants.keys import (
    API_KEY_NAME,
    Key,
    KeyRing,
    KeysFileError,
    api_keys,
    parse,
)
from openai_compat.tenants.limits import Limiter

logger = logging.getLogger("openai_compat.keys")

POLL_S = 1.0  # how often the keys file's modification is checked
# The header a Batch API line carries (with the process's own secret as its bearer token) to
# run as the batch's owner. Only this process knows the secret; the header alone does nothing.
RUN_AS = b"x-openai-compat-run-as"
# The owner of the batch whose lines the runner is sending (batch/runner.py sets it).
batch_owner: ContextVar[str] = ContextVar("openai_compat_batch_owner", default="")


class Tenants:
    def __init__(
        self,
        api_key: Iterable[str] = (),
        keys_file: Path | None = None,
        served: Callable[[], Iterable[str]] | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.legacy = api_keys(api_key)
        self.path = keys_file
        self.served = served
        self.now = now
        self.limiter = Limiter()
        self.internal = secrets.token_urlsafe(32).encode()  # the batch runner's bearer token
        self._stamp: tuple[int, int, int] | None = None
        self.ring = KeyRing(self.legacy)
        self.reloads = 0  # successful loads of the file, the first included
        if keys_file is not None:
            self.ring = KeyRing([*self._read(), *self.legacy])  # at start a bad file is fatal

    @property
    def enabled(self) -> bool:
        """Whether requests need a key."""
        return bool(self.ring) or self.path is not None

    @property
    def from_file(self) -> bool:
        return self.path is not None

    def _stamp_now(self) -> tuple[int, int, int] | None:
        assert self.path is not None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _read(self) -> list[Key]:
        assert self.path is not None
        stamp = self._stamp_now()
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise KeysFileError(f"{self.path}: cannot read it ({exc})") from None
        served = list(self.served()) if self.served is not None else None
        keys = parse(text, str(self.path), served)
        for key in keys:
            if key.plain:
                logger.warning(
                    "keys file %s: key %r is written in plain text; write its key_sha256 "
                    "instead (printf %%s KEY | sha256sum)",
                    self.path,
                    key.name,
                )
        self._stamp = stamp
        self.reloads += 1
        logger.info("keys file %s: %d keys in force", self.path, len(keys))
        return keys

    def reload(self) -> bool:
        """Read the file again; on any problem log one line and keep the keys in force."""
        if self.path is None:
            return False
        try:
            keys = self._read()
        except KeysFileError as exc:
            self._stamp = self._stamp_now()  # not again until it changes
            logger.error("keys file not reloaded, the keys in force stay: %s", exc)
            return False
        self.ring = KeyRing([*keys, *self.legacy])
        return True

    def changed(self) -> bool:
        return self.path is not None and self._stamp_now() != self._stamp

    async def watch(self) -> None:
        """Reload on SIGHUP and when the file changes; runs until cancelled."""
        if self.path is None:
            return
        loop = asyncio.get_running_loop()
        hup = asyncio.Event()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGHUP, hup.set)
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(hup.wait(), POLL_S)
                if hup.is_set() or self.changed():
                    hup.clear()
                    self.reload()
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signal.SIGHUP)

    def owner(self, key: Key | None) -> str:
        """Who owns the files and batches a key makes: the keys file's name (so a rotated
        key keeps its jobs), or for --api-key keys what it always was (a hash of the key)."""
        if key is None:
            return ""
        if key.name != API_KEY_NAME:
            return "key:" + key.name
        return key.digest.hex()[:32]

    def by_owner(self, owner: str) -> Key | None:
        """The key a batch's owner runs as now (None: gone from the file). A job made
        without a key (a server that had none then, or `openai-compat batch` on this machine)
        runs as an --api-key key would: every model, no limits."""
        if not owner:
            return Key(API_KEY_NAME, bytes(32))
        if owner.startswith("key:"):
            return self.ring.by_name.get(owner[4:])
        for key in self.legacy:
            if key.digest.hex()[:32] == owner:
                return key
        return None
