"""Every model the shipped configs (configs/*.toml) name can load with what a plain install
brings (`pip install .`: what the Dockerfile and cerebrium.toml run). The production config
used to name jina-clip-v1, whose remote modeling code imports einops and timm, which nothing
installed: a deployment's first model could not load.

What a model's code needs is decided by its config: a transformers architecture needs
transformers and torch (and, per modality, the processors' own packages); remote code
(`trust_remote_code`) needs whatever that code imports, which only a table kept here can
say, so a remote-code model must be listed in REMOTE_CODE with its imports."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest

from tests.test_dependencies import _key, _runtime_closure

CONFIGS = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.toml"))
# hub id -> the modules its remote modeling code imports (none ships today)
REMOTE_CODE: dict[str, tuple[str, ...]] = {}
# what each kind of model needs at run time beyond torch and transformers
MODALITY_NEEDS = {"clip": ("PIL",), "clap": ("soundfile", "librosa")}
KINDS = {"openai/clip-vit-base-patch32": "clip"}  # the rest are text models


def _models() -> list[tuple[str, dict[str, object]]]:
    return [
        (path.name, model)
        for path in CONFIGS
        for model in tomllib.loads(path.read_text()).get("models", [])
    ]


def test_the_configs_name_models() -> None:
    assert len(_models()) >= 8 and any(name == "production.toml" for name, _ in _models())


@pytest.mark.parametrize(("config", "model"), _models(), ids=lambda v: str(v))
def test_each_shipped_models_code_has_its_dependencies_installed(
    config: str, model: dict[str, object]
) -> None:
    hub_id = str(model["model"])
    needs = ["torch", "transformers", "sentence_transformers"]
    if model.get("trust_remote_code"):
        assert hub_id in REMOTE_CODE, (
            f"{config}: {hub_id} runs remote code; list the modules it imports in REMOTE_CODE "
            "and make the install bring them"
        )
        needs += REMOTE_CODE[hub_id]
    needs += MODALITY_NEEDS.get(KINDS.get(hub_id, "text"), ())
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    assert missing == [], f"{config}: {hub_id} needs {missing}, which are not installed"


def test_what_the_models_need_comes_with_a_plain_install() -> None:
    """Installed is not enough (the test extra brings a lot): the plain install's closure."""
    closure = _runtime_closure("openai-compat")
    for dist in ("torch", "transformers", "sentence-transformers", "pillow"):
        assert _key(dist) in closure, dist
