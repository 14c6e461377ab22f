"""The package's shape: no import circle, settings on the ground floor, modules of readable size."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "openai_compat"
MAX_LINES = 400


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(modules: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Module -> the package modules it imports (anywhere in the file, lazy imports too)."""
    modules = _modules() if modules is None else modules
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle() -> None:
    assert _cycle(_imports()) is None


def test_no_import_circle_in_the_benchmarks() -> None:
    """scripts/ imports its kit as `benchkit` (scripts/ on sys.path)."""
    scripts = PACKAGE.parent / "scripts"
    modules = _modules(scripts / "benchkit")
    modules |= {p.stem: p for p in scripts.glob("*.py")}
    graph = _imports(modules)
    assert graph["benchkit.repeats"]  # the graph is read (it imports the kit)
    assert _cycle(graph) is None


def test_the_cycle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_settings_is_the_ground_floor() -> None:
    graph = _imports()
    assert graph["openai_compat.frame.model_config"] == set()
    assert graph["openai_compat.frame.settings"] == {"openai_compat.frame.model_config"}


def test_the_package_root_holds_few_modules() -> None:
    """The root keeps the entry points; everything else lives in a folder that says what it
    is (frame, ground, web and the floors)."""
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert root == ["__init__.py", "__main__.py", "cli.py"]


def test_only_engine_infinity_names_infinity_emb() -> None:
    """infinity-emb is optional and lives behind engine/contract.py's Engine: no module
    outside engine/infinity/ imports it, names it, or asks which engine it holds."""
    texts = {name: path.read_text(encoding="utf-8") for name, path in _modules().items()}
    found = {
        name
        for name, text in texts.items()
        if ("infinity_emb" in text and not name.startswith("openai_compat.engine.infinity"))
        or ("InfinityEngine" in text and not name.startswith("openai_compat.engine"))
    }
    assert found == set()
    asking = {  # isinstance(x, NativeEngine) and the like
        name
        for name, text in texts.items()
        if not name.startswith("openai_compat.engine") and "NativeEngine)" in text
    }
    assert asking == set()


def test_no_module_is_too_long_to_read() -> None:
    long = {
        name: n
        for name, path in _modules().items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}


# The floors of ARCHITECTURE.md, lowest first: a module imports only from its own floor or
# those below. The ground is frame/ (settings) and ground/ (errors, logs, CPUs, lifecycle,
# bodies); web/ (the HTTP shell) is the top; tenants/, batch/ and ray_serve/ stand beside.
FLOORS = [
    {"frame", "ground"},
    {"formats"},
    {"engine"},
    {"models"},
    {"inference"},
    {"api"},
    {"web"},
]


def _floor(module: str) -> int | None:
    part = module.split(".")[1] if "." in module else ""
    return next((i for i, floor in enumerate(FLOORS) if part in floor), None)


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        for b in targets
        if (fa := _floor(a)) is not None and (fb := _floor(b)) is not None and fb > fa
    )


def test_each_floor_imports_only_the_floors_below() -> None:
    assert _upward(_imports()) == []


def test_an_upward_import_is_found() -> None:
    graph = {"openai_compat.engine.text": {"openai_compat.inference.embed"}}
    assert _upward(graph) == ["openai_compat.engine.text -> openai_compat.inference.embed"]


# The embedding steps a route must reach through inference.plan.run, never by itself.
PLAN_STEPS = {"embed_texts", "embed_fitted", "embed_media", "embed_long", "embed_late"}


def _steps_called(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} & PLAN_STEPS | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names
    } & PLAN_STEPS


def test_every_route_embeds_through_the_plan() -> None:
    found = {
        name: steps
        for name, path in _modules().items()
        if name.startswith("openai_compat.api.") and (steps := _steps_called(path))
    }
    assert found == {}


def test_a_route_calling_a_step_is_found(tmp_path: Path) -> None:
    route = tmp_path / "route.py"
    route.write_text("from x import embed_texts\nasync def f():\n    await embed_texts()\n")
    assert _steps_called(route) == {"embed_texts"}


def _listing_reads(path: Path) -> list[int]:
    """Lines where a module reads the registry's listing of loaded models (`.entries()`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in ("entries", "_entries")
    ]


def test_no_route_serves_a_model_read_off_the_registry_listing() -> None:
    """A route's model is resolved by name (scope, lease, lazy load: Registry.resolve and
    friends); the listing of loaded entries bypasses all three (TEI's POST / did)."""
    found = {
        name: lines
        for name, path in _modules().items()
        if name.startswith("openai_compat.api.") and (lines := _listing_reads(path))
    }
    assert found == {}


def test_a_route_reading_the_listing_is_found(tmp_path: Path) -> None:
    route = tmp_path / "route.py"
    route.write_text("async def f(registry):\n    return registry.entries()[0]\n")
    assert _listing_reads(route) == [2]
