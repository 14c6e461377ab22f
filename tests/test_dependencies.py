"""Every third-party module the package imports at module level comes with a plain install.

A module-level import is a runtime dependency: `pip install .` (no extras) must bring it. The
`test` extra installs far more than that, so a missing runtime dependency stays invisible to the
rest of the suite (httpx was one). CI also proves the plain install end to end
(scripts/check_install.py).
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement

PACKAGE = Path(__file__).resolve().parent.parent / "openai_compat"


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _runtime_closure(dist: str) -> set[str]:
    """Distributions a plain install of `dist` brings (requirements with extras they name)."""
    seen: set[str] = set()
    todo: list[tuple[str, frozenset[str]]] = [(dist, frozenset())]
    while todo:
        name, extras = todo.pop()
        key = _key(name)
        visit = (key, extras)
        if str(visit) in seen:
            continue
        seen.add(str(visit))
        seen.add(key)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            env = [{"extra": e} for e in extras] or [{"extra": ""}]
            if req.marker is not None and not any(req.marker.evaluate(e) for e in env):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return {s for s in seen if not s.startswith("(")}


def _module_level_imports() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in tree.body:  # imports inside functions are optional by design
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != PACKAGE.name:
                    found.setdefault(top, set()).add(path.name)
    return found


def test_module_level_imports_are_runtime_dependencies() -> None:
    have = _runtime_closure("openai-compat")
    owners = md.packages_distributions()
    missing = {
        top: sorted(files)
        for top, files in _module_level_imports().items()
        if not any(_key(d) in have for d in owners.get(top, []))
    }
    assert missing == {}, f"imported at module level but not a runtime dependency: {missing}"


def test_the_check_sees_a_test_only_package() -> None:
    # pytest is installed (by the test extra) but no runtime dependency brings it
    assert "pytest" not in _runtime_closure("openai-compat")
    assert "httpx" in _runtime_closure("openai-compat")
