from __future__ import annotations

import os
from pathlib import Path

import pytest

from openai_compat.cli import build_parser
from openai_compat.frame.config import build_settings
from openai_compat.frame.settings import (
    ConfigError,
    ModelConfig,
    Settings,
    parse_model_spec,
)


def test_defaults_serve_the_packaged_model_offline() -> None:
    settings = build_settings({}, environ={})
    (model,) = settings.served_models()
    assert model.served_name == "all-MiniLM-L6-v2"
    assert Path(model.source, "config.json").is_file()
    assert settings.host == "127.0.0.1" and settings.port == 8000


def test_model_spec_name_and_default_name() -> None:
    assert parse_model_spec("org/bge-small").served_name == "bge-small"
    assert parse_model_spec("/models/x/").served_name == "x"
    named = parse_model_spec("small=org/bge-small")
    assert (named.served_name, named.model) == ("small", "org/bge-small")
    with pytest.raises(ConfigError):
        parse_model_spec("name=")


def test_env_variables_are_read_and_typed() -> None:
    env = {
        "OPENAI_COMPAT_PORT": "9001",
        "OPENAI_COMPAT_MODEL": "a=org/a, b=org/b",
        "OPENAI_COMPAT_TRUNCATE": "0",
        "OPENAI_COMPAT_MAX_INPUTS_PER_REQUEST": "16",
    }
    settings = build_settings({}, environ=env)
    assert settings.port == 9001
    assert settings.truncate is False
    assert settings.max_inputs_per_request == 16
    assert [m.served_name for m in settings.served_models()] == ["a", "b"]


def test_command_line_beats_environment_beats_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('port = 7000\nlog_level = "debug"\n[[models]]\nmodel = "org/m"\n')
    env = {"OPENAI_COMPAT_CONFIG": str(cfg), "OPENAI_COMPAT_PORT": "7001"}
    assert build_settings({}, environ=env).port == 7001
    assert build_settings({"port": 7002}, environ=env).port == 7002
    settings = build_settings({}, environ=env)
    assert settings.log_level == "debug"
    assert [m.model for m in settings.served_models()] == ["org/m"]


def test_config_file_carries_full_model_options(tmp_path: Path) -> None:
    (tmp_path / "local").mkdir()
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        """
[[models]]
name = "bge-small"
model = "michaelfeil/bge-small-en-v1.5"
aliases = ["text-embedding-3-small"]
engine = "torch"
device = "cpu"
batch_size = 8
revision = "main"
trust_remote_code = true
dtype = "float32"
pooling_method = "mean"
max_length = 128
truncate = false
token_ids = "model"

[[models]]
model = "./local"
engine = "debugengine"
"""
    )
    first, second = build_settings({"config": str(cfg)}, environ={}).served_models()
    assert first == ModelConfig(
        name="bge-small",
        model="michaelfeil/bge-small-en-v1.5",
        aliases=("text-embedding-3-small",),
        engine="torch",
        device="cpu",
        batch_size=8,
        revision="main",
        trust_remote_code=True,
        dtype="float32",
        pooling_method="mean",
        max_length=128,
        truncate=False,
        token_ids="model",
    )
    # relative paths are relative to the config file, not to the working directory
    assert second.model == str((tmp_path / "local").resolve())
    assert second.served_name == "local"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[[models]]\nmodel = 'a'\nbogus = 1\n", "bogus"),
        ("nonsense_option = 1\n", "nonsense_option"),
        ("[[models]]\nmodel = 'a'\nbatch_size = 0\n", "batch_size"),
        ("this is not toml", "not valid TOML"),
    ],
)
def test_bad_config_files_are_refused_with_the_reason(
    tmp_path: Path, text: str, fragment: str
) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=fragment):
        build_settings({"config": str(cfg)}, environ={})


def test_duplicate_names_and_aliases_stop_start_up() -> None:
    with pytest.raises(ConfigError, match="duplicate model name or alias 'm'"):
        build_settings({"model": ("m=org/a", "m=org/b")}, environ={})
    with pytest.raises(ConfigError, match="duplicate model name or alias 'x'"):
        build_settings({"model": ("a=org/a", "b=org/b"), "alias": ("x=a", "x=b")}, environ={})
    with pytest.raises(ConfigError, match="not served"):
        build_settings({"alias": ("x=nope",)}, environ={})


def test_alias_flags_attach_to_their_model() -> None:
    settings = build_settings(
        {"model": ("a=org/a",), "alias": ("text-embedding-3-small=a",)}, environ={}
    )
    assert settings.served_models()[0].aliases == ("text-embedding-3-small",)


def test_bad_env_boolean_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="OPENAI_COMPAT_TRUNCATE"):
        build_settings({}, environ={"OPENAI_COMPAT_TRUNCATE": "maybe"})


def test_every_cli_option_is_a_flag_with_its_env_variable_in_help() -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["serve", "--port", "1", "--model", "a=b", "--model", "c", "--no-truncate"]
    )
    assert args.port == "1" and args.model == ["a=b", "c"] and args.truncate is False
    serve_help = parser._subparsers._group_actions[0].choices["serve"].format_help()  # type: ignore[union-attr]
    for name, field in Settings.model_fields.items():
        if (field.json_schema_extra or {}).get("cli", True):  # type: ignore[union-attr]
            assert "OPENAI_COMPAT_" + name.upper() in serve_help
            assert "--" + name.replace("_", "-") in serve_help


@pytest.mark.parametrize(
    ("cli", "environ", "toml"),
    [
        ({"api_key": ("",)}, {}, None),
        ({"api_key": ("   ",)}, {}, None),
        ({"api_key": (" padded ",)}, {}, None),
        ({}, {"OPENAI_COMPAT_API_KEY": " "}, None),
        ({}, {"OPENAI_COMPAT_API_KEYS": ""}, None),
        ({}, {"OPENAI_COMPAT_API_KEYS": "good,,other"}, None),
        ({}, {}, 'api_key = [""]\n'),
        ({}, {}, 'api_key = ["ok", " "]\n'),
    ],
)
def test_blank_api_keys_are_refused_wherever_they_come_from(
    tmp_path: Path, cli: dict[str, object], environ: dict[str, str], toml: str | None
) -> None:
    values = dict(cli)
    if toml is not None:
        (tmp_path / "c.toml").write_text(toml)
        values["config"] = str(tmp_path / "c.toml")
    with pytest.raises(ConfigError, match="API key #"):
        build_settings(values, environ=environ)


def test_api_keys_from_the_environment_are_trimmed_and_split() -> None:
    settings = build_settings({}, environ={"OPENAI_COMPAT_API_KEYS": "key-one, key-two"})
    assert settings.api_key == ("key-one", "key-two")


def test_a_blank_api_key_stops_the_cli_with_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    from openai_compat.cli import main

    with pytest.raises(SystemExit) as info:
        main(["serve", "--api-key", ""])
    assert info.value.code == 2
    assert "API key #1 is empty" in capsys.readouterr().err


def test_download_of_a_model_it_cannot_reach_says_so_in_one_line(tmp_path: Path) -> None:
    """Offline (no model hub here), `download` names the model and why in one line, exits 1,
    and still handles the models it can (a local folder)."""
    import os
    import subprocess
    import sys

    from tests.utils import ROOT, SERVER_ENV

    env = {**os.environ, **SERVER_ENV, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "openai_compat",
            "download",
            "--model",
            "missing=org/not-in-any-cache",
            "--model",
            f"local={tmp_path}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("openai-compat download: missing (org/not-in-any-cache): ")
    assert f"local: local folder {tmp_path}, nothing to download" in proc.stdout


def test_download_records_the_revision_it_fetched(tmp_path: Path, minilm_path: str) -> None:
    """A hub model's download names the commit it got, and how to pin it."""
    import os
    import subprocess
    import sys

    from tests.fixtures.hub_cache import seed
    from tests.utils import ROOT, SERVER_ENV

    cache = tmp_path / "hub"
    snapshot = seed(cache, "org/mini", Path(minilm_path))
    env = {**os.environ, **SERVER_ENV, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    proc = subprocess.run(
        [sys.executable, "-m", "openai_compat", "download", "--model", "mini=org/mini"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    commit = snapshot.name
    assert f'mini: revision {commit} (pin it: revision = "{commit}")' in proc.stdout


@pytest.mark.parametrize(
    ("toml", "env", "argv", "says"),
    [
        ('[models]\nname = "m"\nmodel = "debug/m"\n', {}, [], "[models] is one table"),
        ('[[model]]\nname = "m"\n', {}, [], "[[model]] is not a model table"),
        ('[model]\nname = "m"\n', {}, [], "[model] is not a model table"),
        ("prot = 8000\n", {}, [], "'prot' (did you mean 'port'?)"),
        ('port = "abc"\n', {}, [], "port (config file CFG): Input should be a valid integer"),
        ("", {"OPENAI_COMPAT_PORT": "abc"}, [], "port (environment variable OPENAI_COMPAT_PORT)"),
        ("", {}, ["--max-loaded-models", "-3"], "max_loaded_models (--max-loaded-models)"),
        (
            'max_loaded_models = 1\n[[models]]\nmodel = "debug/a"\nname = "a"\n'
            '[[models]]\nmodel = "debug/b"\nname = "b"\n',
            {},
            [],
            "2 models load eagerly but --max-loaded-models is 1",
        ),
        (
            '[[models]]\nmodel = "debug/a"\nkeep_alive = 1e400\n',
            {},
            [],
            "keep_alive (config file CFG, [[models]] #1): keep_alive must be a finite",
        ),
    ],
)
def test_every_configuration_mistake_is_one_line_naming_its_source(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    toml: str,
    env: dict[str, str],
    argv: list[str],
    says: str,
) -> None:
    """No traceback, exit status 2, one `openai-compat: configuration error:` line that says
    where the value came from (two eager models past --max-loaded-models, [models] for
    [[models]] and a top-level type error printed tracebacks or raw pydantic text)."""
    from openai_compat import cli

    cfg = tmp_path / "c.toml"
    cfg.write_text(toml)
    for name in [n for n in os.environ if n.startswith("OPENAI_COMPAT_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", *(["--config", str(cfg)] if toml else []), *argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("openai-compat: configuration error: "), err
    assert says.replace("CFG", str(cfg)) in err[0], err[0]
