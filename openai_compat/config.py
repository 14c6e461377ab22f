"""Where settings come from: defaults < the TOML config file < `OPENAI_COMPAT_*` environment
variables < command-line flags, merged into one validated `Settings` (build_settings).

Read once at start-up and passed in; nothing here runs at import time.
"""

from __future__ import annotations

import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from openai_compat.settings import ENV_PREFIX, ConfigError, ModelConfig, Settings


def cli_fields() -> dict[str, Any]:
    """The fields that are command-line flags and environment variables."""
    return {
        name: f
        for name, f in Settings.model_fields.items()
        if (f.json_schema_extra or {}).get("cli", True)  # type: ignore[union-attr]
    }


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def _is_sequence(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (tuple, list)


def _is_bool(annotation: Any) -> bool:
    if annotation is bool:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return bool in typing.get_args(annotation)
    return False


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """OPENAI_COMPAT_* variables -> raw values (lists comma-separated, booleans 1/0/true/false)."""
    values: dict[str, Any] = {}
    for name, f in cli_fields().items():
        names = [env_name(name), *((f.json_schema_extra or {}).get("env") or [])]
        raw = next((environ[n] for n in names if n in environ), None)
        if raw is None:
            continue
        if _is_sequence(f.annotation):
            parts = tuple(p.strip() for p in raw.split(","))
            # A set secret keeps its empty parts, so a blank key is refused, not dropped.
            secret = (f.json_schema_extra or {}).get("secret")
            values[name] = parts if secret else tuple(p for p in parts if p)
        elif _is_bool(f.annotation):
            low = raw.strip().lower()
            if low not in _TRUE | _FALSE:
                raise ConfigError(f"{env_name(name)} must be 1/0/true/false, got {raw!r}")
            values[name] = low in _TRUE
        else:
            values[name] = raw
    return values


def from_toml(path: Path) -> dict[str, Any]:
    """A config file: top-level server options plus [[models]] tables."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    unknown = set(data) - set(Settings.model_fields) - {"models"}
    if unknown:
        raise ConfigError(f"config file {path}: unknown option(s) {sorted(unknown)}")
    if "config" in data:
        raise ConfigError(f"config file {path}: 'config' cannot be set inside a config file")
    models = []
    for i, table in enumerate(data.pop("models", [])):
        table = dict(table)
        model = table.get("model")
        # Paths written relative to the config file mean relative to it, not to the cwd.
        if isinstance(model, str) and model.startswith(("./", "../")):
            table["model"] = str((path.parent / model).resolve())
        try:
            models.append(ModelConfig(**table))
        except ValidationError as exc:
            raise ConfigError(f"config file {path}: [[models]] #{i + 1}: {exc}") from exc
    data["models"] = tuple(models)
    return data


def build_settings(
    cli: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Merge defaults < config file < environment < command line into one Settings."""
    env_values = from_env(os.environ if environ is None else environ)
    cli_values = {k: v for k, v in (cli or {}).items() if v is not None}
    config_path = cli_values.get("config", env_values.get("config"))
    merged: dict[str, Any] = {}
    if config_path:
        merged.update(from_toml(Path(config_path)))
        merged["config"] = Path(config_path)
    merged.update(env_values)
    merged.update(cli_values)
    try:
        settings = Settings(**merged)
    except ValidationError as exc:
        raise ConfigError(str(exc)) from exc
    settings.served_models()  # surfaces bad specs and duplicate names before anything loads
    return settings
