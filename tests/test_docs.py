"""The README and docs/: every relative link reaches a file, and every #anchor a heading there."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, fence = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"^#{1,6} (.+)", line)):
            found.add(slug(m.group(1)))
    return found


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor})")
    assert broken == [], f"{page.name}: {broken}"


def test_the_readme_fits_on_a_few_screens() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < 250


def test_slug_follows_github() -> None:
    assert (
        slug("Cohere embed (v1, v2) and compact vectors")
        == "cohere-embed-v1-v2-and-compact-vectors"
    )
    assert slug("The tutorial's routes") == "the-tutorials-routes"
    assert slug("How requests reach the engine (wave batching)") == (
        "how-requests-reach-the-engine-wave-batching"
    )


def test_the_configuration_page_names_every_option() -> None:
    """docs/configuration.md says it lists every option: each of serve's flags and its
    environment variable is there (15 were missing, the admin key among them)."""
    from openai_compat.frame.config import cli_fields, env_name

    page = (ROOT / "docs" / "configuration.md").read_text()
    missing = [
        name
        for name in cli_fields()
        if f"`--{name.replace('_', '-')}" not in page or env_name(name) not in page
    ]
    assert missing == []
    # and serve's own flags beside the settings (the Ray ones were missed)
    from openai_compat.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve = commands.choices["serve"]
    flags = {o for a in serve._actions for o in a.option_strings if o.startswith("--")}
    assert "--ray-proxy-location" in flags
    assert sorted(f for f in flags - {"--help"} if f not in page) == []


def test_download_and_batch_list_only_the_options_they_read() -> None:
    """`download --help` and `batch --help` listed ~45 server flags that do nothing there."""
    from openai_compat.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))

    def flags(command: str) -> set[str]:
        actions = commands.choices[command]._actions
        return {o for a in actions for o in a.option_strings if o.startswith("--")}

    assert flags("download") == {"--help", "--model", "--alias", "--config", "--log-level",
                                 "--export-dir"}  # fmt: skip
    batch = flags("batch")
    assert {"--model", "--config", "--ray-actors", "--max-inputs-per-request"} <= batch
    assert not batch & {"--host", "--port", "--keys-file", "--api-key", "--data-dir"}


# A Python example's client -> what to install for it (the first hour: "No module named
# 'openai'" on the README's own example).
_CLIENTS = {"openai": "pip install openai", "cohere": "pip install cohere"}


def test_every_page_says_how_to_install_the_clients_its_examples_import() -> None:
    pages = [
        ROOT / "README.md",
        ROOT / "docs" / "embeddings.md",
        ROOT / "docs" / "rerank-classify.md",
    ]
    for page in pages:
        text = page.read_text()
        blocks = re.findall(r"```python\n(.*?)```", text, re.S)
        imported = {
            name
            for block in blocks
            for name in _CLIENTS
            if re.search(rf"^(from {name} import|import {name}\b)", block, re.M)
        }
        assert imported, page  # the pages do show client code
        for name in imported:
            assert _CLIENTS[name] in text, (page.name, name)


def test_the_readmes_test_command_makes_a_venv_of_its_own() -> None:
    """`pip install -e '.[test]'` in the serving venv changed what the user had installed."""
    text = (ROOT / "README.md").read_text()
    (command,) = [line for line in text.splitlines() if "'.[test]'" in line]
    assert "python3 -m venv .venv-test" in command and ". .venv-test/bin/activate" in command
    serve = next(line for line in text.splitlines() if line.endswith("openai-compat serve"))
    assert ".venv-test" not in serve
