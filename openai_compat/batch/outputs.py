"""A batch's output and error files on disk: reopened at their committed sizes (what was
written after the last commit is cut; a file shorter than committed is refused, never padded),
and fsynced before each commit."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from openai_compat.batch.store import Progress, fsync_dir


class DataLost(RuntimeError):
    """An output file is shorter than its committed size: the data dir lost what a commit
    said was on disk. The batch fails; nothing is padded or made up."""


def reopen_outputs(folder: Path, paths: tuple[Path, Path], progress: Progress) -> None:
    """The batch's output and error files at their committed sizes: what was written after
    the last commit is cut (done again); a file shorter than committed is DataLost."""
    folder.mkdir(parents=True, exist_ok=True)
    for path, size in zip(paths, (progress.output_bytes, progress.error_bytes), strict=True):
        with path.open("ab") as f:
            have = f.tell()
            if have < size:
                raise DataLost(
                    f"{path.name} holds {have} bytes but {size} were committed: the data dir "
                    "lost data (restored from an old backup, or a disk without fsync?)."
                )
            if have > size:
                f.truncate(size)
                os.fsync(f.fileno())
    fsync_dir(folder)  # the files' names are as durable as their contents


def fsync_both(*files: BinaryIO) -> None:
    for f in files:
        os.fsync(f.fileno())
