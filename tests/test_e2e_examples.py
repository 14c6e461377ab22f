"""Every shell and Python example of the README and docs/ runs as written, against the server
it says it needs.

Each ```bash / ```python block is preceded by a marker the reader does not see:
    <!-- example: server=default -->              the quick-start server (the packaged MiniLM)
    <!-- example: config=configs/NAME.toml -->     `openai-compat serve --config configs/NAME.toml`
    <!-- example: cli input=FILE -->               a CLI command, run in a folder holding FILE
    <!-- example: skip=REASON (...) -->            REASON one of SKIP_REASONS
A config's hub models are served from an offline hub cache where each hub id holds a local
stand-in of the same kind (HUB_STAND_INS): the config file is loaded unchanged, through the
server's real hub-id path. `localhost:8000` becomes this run's server; curl gets
`--fail-with-body`, so a 4xx fails the example. Every ```toml block must use only real
settings. A new example without a marker, or naming a config that is not in configs/, fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from openai_compat.frame.settings import ModelConfig, Settings
from openai_compat.models import demo as demo_models
from openai_compat.tenants.keys import parse as parse_keys
from tests import families
from tests.fixtures.hub_cache import seed
from tests.utils import ROOT, SERVER_ENV, RemoteServer

pytestmark = pytest.mark.slow

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP_REASONS = ("install", "docker", "ray cluster", "benchmark")
MARKER = re.compile(r"<!-- example: (.+?) -->")
# hub id in configs/*.toml -> the local model that stands in for it (the fixtures' names)
HUB_STAND_INS = {
    "openai/clip-vit-base-patch32": "clip",
    "michaelfeil/bge-small-en-v1.5": "minilm",
    "mixedbread-ai/mxbai-rerank-xsmall-v1": "reranker",
    "philschmid/tiny-bert-sst2-distilled": "classifier",
    "intfloat/e5-small-v2": "minilm",
    "naver/splade-cocondenser-ensembledistil": "splade",
    # configs/families.toml: tiny models of each family's shape (tests/families.py)
    "Qwen/Qwen3-Embedding-0.6B": "qwen3-embed",
    "Qwen/Qwen3-Reranker-0.6B": "qwen3-rerank",
    "lightonai/GTE-ModernColBERT-v1": "colbert",
    "Alibaba-NLP/gte-modernbert-base": "modernbert",
    "google/embeddinggemma-300m": "gemma3",
    # configs/visual.toml: tiny models of each kind (openai_compat/models/demo_vision.py)
    "vidore/colpali-v1.3-hf": "colpali",
    "vidore/colqwen2-v1.0-hf": "colqwen2",
    # configs/bge-m3.toml: a tiny BGE-M3, its two heads beside it (models/demo_m3.py)
    "BAAI/bge-m3": "bge-m3",
}


@dataclass(frozen=True)
class Example:
    path: Path
    line: int  # of the opening fence
    language: str
    code: str
    marker: str | None

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def options(self) -> dict[str, str]:
        marker = self.marker or ""
        if marker.startswith("skip="):  # skip=REASON (why, for the reader)
            return {"skip": marker[len("skip=") :].split(" (")[0]}
        return dict(w.split("=", 1) if "=" in w else (w, "") for w in marker.split())


def examples() -> list[Example]:
    found = []
    for path in DOCS:
        lines = path.read_text().split("\n")
        i = 0
        while i < len(lines):
            fence = re.match(r"^```(\w*)$", lines[i])
            if not fence:
                i += 1
                continue
            end = lines.index("```", i + 1)
            before = lines[i - 1] if i else ""
            marker = MARKER.fullmatch(before.strip())
            found.append(
                Example(
                    path,
                    i + 1,
                    fence.group(1),
                    "\n".join(lines[i + 1 : end]) + "\n",
                    marker.group(1) if marker else None,
                )
            )
            i = end + 1
    return found


RUNNABLE = [e for e in examples() if e.language in ("bash", "python")]


def test_every_example_says_what_it_needs() -> None:
    assert len(RUNNABLE) >= 20  # the parser found the docs' examples
    for ex in RUNNABLE:
        assert ex.marker is not None, f"{ex.id}: no <!-- example: ... --> marker"
        options = ex.options
        if "skip" in options:
            assert options["skip"] in SKIP_REASONS, ex.id
            continue
        assert ("server" in options) + ("config" in options) + ("cli" in options) == 1, ex.id
        if "server" in options:
            assert options["server"] == "default", ex.id
        if options.get("config") == "demo":  # the offline demo: the page says how to make it
            text = ex.path.read_text()
            shown = text[: text.index(ex.code)]
            assert "openai-compat demo-models demo" in shown, f"{ex.id}: the page never says"
            assert "--config demo/demo.toml" in shown, f"{ex.id}: the page never says"
        elif "config" in options:
            config = ROOT / options["config"]
            assert config.parent == ROOT / "configs" and config.is_file(), ex.id
            # ... and the reader is told: the page names the command before the example
            text = ex.path.read_text()
            shown = text[: text.index(ex.code)]
            assert f"--config {options['config']}" in shown, f"{ex.id}: the page never says"


def test_toml_blocks_use_only_real_settings() -> None:
    server_keys = set(Settings.model_fields) | {"models"}
    blocks = [e for e in examples() if e.language == "toml"]
    assert blocks
    for ex in blocks:
        data = tomllib.loads(ex.code)
        if "keys" in data:  # a keys file (docs/operations.md): it must load as one
            assert set(data) == {"keys"} and parse_keys(ex.code, ex.id), ex.id
            continue
        assert set(data) <= server_keys, (ex.id, set(data) - server_keys)
        for model in data.get("models", []):
            assert set(model) <= set(ModelConfig.model_fields), (ex.id, model)


def test_every_hub_model_of_the_shipped_configs_has_a_stand_in() -> None:
    for config in (ROOT / "configs").glob("*.toml"):
        for model in tomllib.loads(config.read_text()).get("models", []):
            source = model["model"]
            if not source.startswith("builtin:"):
                assert source in HUB_STAND_INS, (config.name, source)


# ---------------------------------------------------------------- running them


@pytest.fixture(scope="module")
def hub_cache(
    tmp_path_factory: pytest.TempPathFactory,
    minilm_path: str,
    trained_models: dict[str, Path],
    tiny_media_models: dict[str, Path],
    splade_path: Path,
) -> Path:
    local = {
        "minilm": Path(minilm_path),
        "reranker": trained_models["reranker"],
        "classifier": trained_models["classifier"],
        "clip": tiny_media_models["clip"],
        "splade": splade_path,
    }
    local.update(families.build(tmp_path_factory.mktemp("families"), minilm_path))
    from openai_compat.models import demo_vision as tiny_vision

    vision = tmp_path_factory.mktemp("vision")
    local["colpali"] = tiny_vision.build_colpali(vision / "colpali")
    local["colqwen2"] = tiny_vision.build_colqwen2(vision / "colqwen2")
    from openai_compat.models.demo_m3 import build_bge_m3

    local["bge-m3"] = build_bge_m3(tmp_path_factory.mktemp("m3") / "bge-m3")
    cache = tmp_path_factory.mktemp("hub-cache")
    for repo, stand_in in HUB_STAND_INS.items():
        seed(cache, repo, local[stand_in])
    return cache


@pytest.fixture(scope="module")
def demo_config(tmp_path_factory: pytest.TempPathFactory, trained_models: dict[str, Path]) -> Path:
    """`openai-compat demo-models`'s folder, from the fixtures' models (the same recipe)."""
    from openai_compat.models import demo_vision

    folder = tmp_path_factory.mktemp("demo")
    (folder / "reranker").symlink_to(trained_models["reranker"])
    (folder / "classifier").symlink_to(trained_models["classifier"])
    demo_vision.build(folder)
    return demo_models.write_config(folder)


@pytest.fixture(scope="module")
def servers(
    hub_cache: Path, server: RemoteServer, demo_config: Path
) -> Iterator[dict[str, RemoteServer]]:
    """The default server, and one per config, started on first use (the examples run in
    config order, so each starts once)."""

    class Servers(dict[str, RemoteServer]):
        def __missing__(self, config: str) -> RemoteServer:
            for name, running in list(self.items()):  # one config server at a time
                if name != "default":
                    running.stop()
                    del self[name]
            env = {"HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1"}
            path = str(demo) if config == "demo" else config
            self[config] = RemoteServer(["--config", path], env=env)
            return self[config]

    demo = demo_config
    pool = Servers(default=server)
    yield pool
    for name, srv in pool.items():
        if name != "default":
            srv.stop()


def _env() -> dict[str, str]:
    env = {**os.environ, **SERVER_ENV}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return env


def _localize(code: str, url: str) -> str:
    code = code.replace("http://localhost:8000", url).replace("localhost:8000", url)
    return code.replace("curl -s ", "curl -sS --fail-with-body ")


def _run(ex: Example, cwd: Path, url: str | None) -> subprocess.CompletedProcess[str]:
    code = _localize(ex.code, url) if url else ex.code
    if ex.language == "python":
        script = cwd / "example.py"
        script.write_text(code)
        command = [sys.executable, str(script)]
    else:
        command = ["bash", "-euo", "pipefail", "-c", code]
    return subprocess.run(command, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)


def _corpus(folder: Path) -> None:
    lines = [
        {
            "custom_id": f"doc-{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "all-MiniLM-L6-v2", "input": text},
        }
        for i, text in enumerate(["first chunk", "second chunk", "third chunk"])
    ]
    (folder / "corpus.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")


def _order(ex: Example) -> tuple[str, int]:
    return (ex.options.get("config", ""), ex.line)


TO_RUN = sorted((e for e in RUNNABLE if "skip" not in e.options), key=_order)


@pytest.mark.parametrize("ex", TO_RUN, ids=[e.id for e in TO_RUN])
def test_example_runs_as_written(
    ex: Example, servers: dict[str, RemoteServer], tmp_path: Path
) -> None:
    options = ex.options
    url = None
    if "cli" in options:
        (tmp_path / "configs").symlink_to(ROOT / "configs")
        if options.get("input") == "corpus.jsonl":
            _corpus(tmp_path)
    else:
        url = servers[options.get("config", "default")].url
    done = _run(ex, tmp_path, url)
    assert done.returncode == 0, f"{ex.id} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    if "cli" in options:  # the CLI example wrote its output: one vector line per input line
        out = [json.loads(line) for line in (tmp_path / "vectors.jsonl").read_text().splitlines()]
        assert [o["custom_id"] for o in out] == ["doc-0", "doc-1", "doc-2"]
        assert len(out[0]["response"]["body"]["data"][0]["embedding"]) == 384
