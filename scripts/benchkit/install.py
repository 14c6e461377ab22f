"""Which install of ours a scenario measures, made and described the same way every time.

A user runs the server from a venv made by the README's first command: the runtime
dependencies only, every module's bytecode compiled (pip compiles what it installs; an
editable install's first start writes ours). The test venv is not that: its extras add pandas
and pyarrow (scikit-learn, which sentence-transformers imports, loads pandas when it is
installed: about 35 MiB resident and 0.3 s), and a shell with PYTHONDONTWRITEBYTECODE set
compiles our 131 modules on every start (about 0.8 s of a 5 s cold start, measured on
2 cores). So:

    python scripts/bench.py venv /tmp/user-venv          # the README's install steps
    OURS_PYTHON=/tmp/user-venv/bin/python python scripts/bench.py run one-client

OURS_PYTHON (default: this interpreter) runs our server, the library's encode and the cold
start's floor in one-client and shared-cpu; `prepare` compiles our package's bytecode with it
before the first round and `describe` records what kind of install it is with the results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
OURS_PYTHON = os.environ.get("OURS_PYTHON", sys.executable)

# Run by OURS_PYTHON: the installed distributions beyond openai-compat's runtime closure
# (its requirements without extras, followed through each dependency's own).
_BEYOND = r"""
import importlib.metadata as md, json, sys
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as cn
seen, todo = set(), [("openai-compat", frozenset())]
while todo:
    name, extras = todo.pop()
    if (cn(name), extras) in seen:
        continue
    seen.add((cn(name), extras))
    try:
        requires = md.distribution(name).requires or []
    except md.PackageNotFoundError:
        continue
    for text in requires:
        req = Requirement(text)
        if req.marker is None or any(
            req.marker.evaluate({"extra": e}) for e in (extras or {""})
        ):
            todo.append((req.name, frozenset(req.extras)))
needed = {name for name, _ in seen} | {"pip", "setuptools", "wheel", "packaging"}
installed = {cn(d.metadata["Name"]) for d in md.distributions()}
print(json.dumps(sorted(installed - needed)))
"""


def package_dir(python: str = OURS_PYTHON) -> Path:
    out = subprocess.run(
        [python, "-c", "import openai_compat, os; print(os.path.dirname(openai_compat.__file__))"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def prepare(python: str = OURS_PYTHON) -> None:
    """Our package's bytecode compiled, as pip's install or an editable install's first start
    leaves it (py_compile writes it whatever PYTHONDONTWRITEBYTECODE says)."""
    subprocess.run([python, "-m", "compileall", "-q", str(package_dir(python))], check=True)


def describe(python: str = OURS_PYTHON) -> dict[str, object]:
    """What the results say of the install measured."""
    try:
        beyond = json.loads(
            subprocess.run(
                [python, "-c", _BEYOND], check=True, capture_output=True, text=True
            ).stdout
        )
    except (subprocess.CalledProcessError, json.JSONDecodeError):
        beyond = None  # packaging missing there: not said
    if beyond is None:
        kind = "unknown"
    elif beyond:
        kind = f"runtime dependencies and {len(beyond)} more packages"
    else:
        kind = "runtime dependencies only (a user's install)"
    return {
        "ours_python": python,
        "ours_install": kind,
        "ours_extra_packages": beyond,
        "bytecode": "compiled before the first round (as pip's install leaves it)",
    }


def readme_install_steps() -> list[str]:
    """The `pip install` steps of the README's first command (check_install.py reads the
    command; CI runs all of it on a fresh venv)."""
    from check_install import readme_first_command

    return [step for step in readme_first_command() if step.startswith("pip install")]


def make_venv(folder: Path) -> Path:
    """A venv made as the README's first command makes it; its python."""
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    python = folder / "bin" / "python"
    for step in readme_install_steps():
        args = step.split()[2:]  # after "pip install"
        args = [str(ROOT) if a == "." else a for a in args]
        print("+ pip install", " ".join(args), flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *args], check=True, cwd=ROOT)
    return python
