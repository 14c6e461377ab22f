"""The README and docs/: every relative link reaches a file, and every #anchor a heading there."""

from __future__ import annotations

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
    from openai_compat.config import cli_fields, env_name

    page = (ROOT / "docs" / "configuration.md").read_text()
    missing = [
        name
        for name in cli_fields()
        if f"`--{name.replace('_', '-')}" not in page or env_name(name) not in page
    ]
    assert missing == []
