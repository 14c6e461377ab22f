"""Where settings come from: defaults < the TOML config file < `OPENAI_COMPAT_*` environment
variables < command-line flags, merged into one validated `Settings` (build_settings).

Read once at start-up and passed in; nothing here runs at import time.
"""

from __future__ import annotations

import difflib
import os
import tomllib
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from openai_compat.frame.settings import ENV_PREFIX, ConfigError, ModelConfig, Settings


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


def _hint(name: str, known: Iterable[str]) -> str:
    """' (did you mean X?)' for a misspelt option, else ''."""
    if name in ("model", "model_table"):
        return " (each model is a [[models]] table: two brackets, plural)"
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def from_toml(path: Path) -> dict[str, Any]:
    """A config file: top-level server options plus [[models]] tables."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    known = [*Settings.model_fields, "models"]
    unknown = sorted(set(data) - set(known))
    if unknown:
        hints = ", ".join(f"{name!r}{_hint(name, known)}" for name in unknown)
        raise ConfigError(f"config file {path}: unknown option(s) {hints}")
    if "config" in data:
        raise ConfigError(f"config file {path}: 'config' cannot be set inside a config file")
    stray = data.get("model")  # --model's specs; a table there is a misspelt [[models]]
    if isinstance(stray, dict) or (
        isinstance(stray, list) and any(isinstance(t, dict) for t in stray)
    ):
        form = "[model]" if isinstance(stray, dict) else "[[model]]"
        raise ConfigError(
            f"config file {path}: {form} is not a model table; write each model as a "
            "[[models]] table (plural, two brackets)"
        )
    tables = data.pop("models", [])
    if isinstance(tables, dict):
        raise ConfigError(
            f"config file {path}: [models] is one table; write each model as its own "
            "[[models]] table (two brackets)"
        )
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(
            f"config file {path}: models must be [[models]] tables (name, model, ...)"
        )
    models = []
    for i, table in enumerate(tables):
        table = dict(table)
        model = table.get("model")
        # Paths written relative to the config file mean relative to it, not to the cwd.
        if isinstance(model, str) and model.startswith(("./", "../")):
            table["model"] = str((path.parent / model).resolve())
        try:
            models.append(ModelConfig(**table))
        except ValidationError as exc:
            where = partial(_same, f"config file {path}, [[models]] #{i + 1}")
            raise ConfigError(describe_errors(exc, where, ModelConfig)) from None
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
    origin: dict[str, str] = {}  # option -> where its value came from, for the error message
    if config_path:
        from_file = from_toml(Path(config_path))
        merged.update(from_file)
        origin.update(dict.fromkeys(from_file, f"config file {config_path}"))
        merged["config"] = Path(config_path)
    merged.update(env_values)
    origin.update({k: f"environment variable {env_name(k)}" for k in env_values})
    merged.update(cli_values)
    origin.update({k: "--" + k.replace("_", "-") for k in cli_values})
    try:
        settings = Settings(**merged)
    except ValidationError as exc:
        raise ConfigError(
            describe_errors(exc, lambda field: origin.get(field, "the defaults"), Settings)
        ) from None
    settings.served_models()  # surfaces bad specs and duplicate names before anything loads
    settings.check_model_pool()
    return settings


def _same(where: str, field: str) -> str:
    return where


def describe_errors(
    exc: ValidationError, origin: Callable[[str], str], model: type[BaseModel]
) -> str:
    """pydantic's errors as one line: each option by name, with where its value came from
    (a config file, an environment variable, a flag) and what is wrong with it."""
    parts = []
    for error in exc.errors(include_url=False):
        loc = [str(p) for p in error["loc"]]
        field = loc[0] if loc else ""
        name = ".".join(loc) if loc else "the settings"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = f"unknown option{_hint(field, model.model_fields)}"
        given = error.get("input")
        shown = f", got {given!r}" if loc and isinstance(given, str | int | float) else ""
        parts.append(f"{name} ({origin(field)}): {message}{shown}")
    return "; ".join(parts)
