"""The data dir itself, apart from what the store keeps in it: one process holds it at a time
(an flock on DATA_DIR/.lock naming its holder, pid and port), and what may still be written
there (a byte quota, uploads under way included, and free disk always left on its
filesystem). Blocking calls, for the store's threads.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
from pathlib import Path
from typing import IO

from openai_compat.batch.schema import StoreBusy


def hold(root: Path, holder: str) -> IO[str]:
    """DATA_DIR/.lock taken for this process's life (released when it dies), with `holder`
    written in it; StoreBusy naming the other holder if another process has it."""
    lock = (root / ".lock").open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        lock.seek(0)
        held_by = lock.read(200).strip()
        lock.close()
        raise StoreBusy(
            f"the data dir {root} is in use by another openai-compat process"
            f"{f' ({held_by})' if held_by else ''}; give each server its own --data-dir"
        ) from exc
    lock.seek(0)
    lock.truncate()
    lock.write(holder or f"pid {os.getpid()}")
    lock.flush()
    return lock


class Room:
    """What may still be written: `max_bytes` in all (0: no quota), uploads under way
    counted (reserve/release), and `min_free` bytes of disk always left."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._reserved = 0  # uploads under way: on disk, not yet files of the store
        self._lock = threading.Lock()

    def refusal(
        self, used: int, adding: int, max_bytes: int, min_free: int
    ) -> tuple[str, str] | None:
        """Why `adding` more bytes may not be written beside `used`, as ("quota" | "disk",
        message); None: they may. Uploads under way count as held already."""
        if max_bytes:
            total = used + self._reserved + adding
            if total > max_bytes:
                return "quota", (
                    f"the data dir would hold {total} bytes, more than its quota of "
                    f"{max_bytes} (batch_max_data_bytes)"
                )
        free = shutil.disk_usage(self.root).free
        if free - adding < min_free:
            return "disk", (
                f"the data dir's disk would have {max(0, free - adding)} bytes free, less than "
                f"the {min_free} it must keep (batch_min_free_bytes)"
            )
        return None

    def reserve(
        self, used: int, adding: int, max_bytes: int, min_free: int
    ) -> tuple[str, str] | None:
        """refusal() for an upload's next bytes, which then count until release()."""
        with self._lock:
            refused = self.refusal(used, adding, max_bytes, min_free)
            if refused is None:
                self._reserved += adding
            return refused

    def release(self, reserved: int) -> None:
        with self._lock:
            self._reserved = max(self._reserved - reserved, 0)
