"""glibc's heap: handing freed memory back to the system (models unloaded, large images
decoded). glibc keeps freed blocks under its mmap threshold in its arenas, resident, until
malloc_trim; elsewhere (musl, macOS) these are no-ops."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from functools import cache


@cache
def libc() -> ctypes.CDLL | None:
    """glibc, where this process runs on it; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        lib = ctypes.CDLL(name)
        lib.malloc_trim  # noqa: B018 (glibc only: musl has none)
    except (OSError, AttributeError):
        return None
    return lib


def trim() -> None:
    """Give glibc's freed arenas back to the system."""
    lib = libc()
    if lib is not None:
        lib.malloc_trim(0)
