#!/usr/bin/env python3
"""Print the model stack's resolved versions and fail if one is below the project's floors
(pyproject.toml's dependencies) or if infinity-emb is installed: CI runs it in the default
environment, the one `pip install -e .` makes."""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

FLOORS = {
    "sentence-transformers": (6, 0),
    "transformers": (5, 3),  # CVE-2026-4372 lies below 5.3.0
    "numpy": (2, 0),
    "huggingface-hub": (1, 0),
    "tokenizers": (0, 22),
    "torch": (2, 13),
    # the 2026 CVE fixes (pyproject.toml says which)
    "pillow": (12, 3),
    "python-multipart": (0, 0, 30),
    "starlette": (1, 0, 1),
}


def release(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def main() -> int:
    broken = []
    for name, floor in FLOORS.items():
        try:
            found = version(name)
        except PackageNotFoundError:
            found = "missing"
        ok = found != "missing" and release(found) >= floor
        least = ".".join(map(str, floor))
        print(f"{name:24s} {found:16s} floor {least}  {'ok' if ok else 'BROKEN'}")
        if not ok:
            broken.append(name)
    try:
        version("infinity-emb")
        print("infinity-emb is installed: this environment must not contain it")
        broken.append("infinity-emb")
    except PackageNotFoundError:
        print("infinity-emb             not installed    ok")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
