"""Every server option, declared once: type, default, environment variable and help text.

Where the values come from (defaults < TOML config file < `OPENAI_COMPAT_*` environment
variables < command-line flags) is config.py; the command line is generated from `Settings`
(cli.py). This module and model_config.py (one model's settings) are the ground floor:
they import nothing else of the package but each other.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from openai_compat.frame.model_config import (
    BACKENDS,
    BUILTIN_PREFIX,
    DEFAULT_MODEL_NAME,
    NATIVE,
    ConfigError,
    ModelConfig,
    RayOptions,
    builtin_model_path,
    check_unique_names,
    default_served_name,
    parse_model_spec,
    parse_size,
)

__all__ = [
    "BACKENDS",
    "BUILTIN_PREFIX",
    "DEFAULT_MODEL_NAME",
    "NATIVE",
    "ConfigError",
    "ModelConfig",
    "RayOptions",
    "Settings",
    "builtin_model_path",
    "check_unique_names",
    "default_served_name",
    "parse_model_spec",
]

ENV_PREFIX = "OPENAI_COMPAT_"
CAPABILITIES = ("embed", "rerank", "classify", "image", "audio")


def default_export_dir() -> Path:
    """Beside the Hugging Face cache, so images that bake HF_HOME carry the exports too."""
    hf_home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return Path(hf_home) / "openai-compat-exports"


def _opt(
    default: Any,
    help: str,
    *,
    cli: bool = True,
    env: tuple[str, ...] = (),
    secret: bool = False,
    **kw: Any,
) -> Any:
    extra: dict[str, Any] = {"cli": cli, "env": list(env), "secret": secret}
    return Field(default, description=help, json_schema_extra=extra, **kw)


class Settings(BaseModel):
    """Server settings. Every field with `cli` is a flag and an OPENAI_COMPAT_* variable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = _opt("127.0.0.1", "Address to bind.")
    port: int = _opt(8000, "Port to bind.", ge=0, le=65535)
    metrics_port: int | None = _opt(
        None,
        "A second port, on --host, serving GET /metrics alone with no key (for a platform's "
        "scraper and autoscaler; expose it to them only). Unset: /metrics on --port only.",
        ge=1,
        le=65535,
    )
    model: tuple[str, ...] = _opt(
        (),
        "Model to serve as [NAME=]MODEL (hub id, local folder or builtin:all-MiniLM-L6-v2); "
        "repeatable. With no model at all the packaged all-MiniLM-L6-v2 is served.",
    )
    alias: tuple[str, ...] = _opt((), "Extra name for a served model as ALIAS=NAME; repeatable.")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = _opt(
        "auto",
        "The precision of every model whose config leaves dtype = 'auto': auto picks per "
        "device (CUDA: bfloat16, else float16; a CPU with bfloat16 instructions: bfloat16 where "
        "the model passes the quality check at load; else float32, whatever the folder holds).",
    )
    default_model: tuple[str, ...] = _opt(
        (),
        "Model for requests that name none (TEI's API, infinity's without 'model') as "
        "CAPABILITY=NAME (embed, rerank, classify, image, audio); repeatable. Default: the "
        "first served model that can.",
    )
    config: Path | None = _opt(None, "TOML file with server options and [[models]] tables.")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = _opt("info", "Log level.")
    max_inputs_per_request: int = _opt(
        2048, "Most inputs one embeddings or classify request may carry.", ge=1
    )
    max_rerank_documents: int = _opt(10000, "Most documents one rerank request may carry.", ge=1)
    cache_bytes: int = _opt(128 * 2**20, "Exact embedding cache (bytes; 0 = off).", ge=0)
    cache_scope: Literal["key", "shared"] = _opt(
        "key",
        "With keys: 'key' gives each key its own cached vectors (no key can tell from a fast "
        "answer that another embedded a text); 'shared' lets every key reuse every key's "
        "(more hits, but a cross-key oracle).",
    )
    max_loaded_models: int = _opt(
        0, "Most models loaded at once; the least recently used idle one goes (0: no cap).", ge=0
    )
    memory_budget: int = _opt(
        0,
        "Most resident bytes of loaded models ('6GiB', '512MB'); the least recently used idle "
        "model is unloaded to fit another (0: no budget).",
        ge=0,
    )
    admin_key: str | None = _opt(
        None, "Key for the /admin routes (Authorization: Bearer); unset: they are off.", secret=True
    )
    max_load_waiters: int = _opt(256, "Most requests waiting for one model to load.", ge=1)
    load_wait_timeout: float = _opt(
        120.0, "Seconds a request waits for its model to load or fit; then 503.", gt=0
    )
    max_windows_per_input: int = _opt(64, "Most windows one long input becomes.", ge=1)
    max_windows_per_request: int = _opt(512, "Most windows of one request's inputs.", ge=1)
    max_tokenize_chars: int = _opt(
        131_072,
        "Most characters one /tokenize request may carry, its texts together: about 30k "
        "tokens, far past any embedding model's window (the answer lists every token, and "
        "the tokenizer's lists of a long text are built holding the GIL).",
        ge=1,
    )
    truncate: bool | None = _opt(
        None,
        "Truncate inputs past the model's maximum (true) or refuse them, 400 (false). Unset: "
        "each API's default (/v1/embeddings refuses, as OpenAI; the other routes truncate).",
    )
    forwarded_allow_ips: str | None = _opt(
        None,
        "Trust X-Forwarded-For/-Proto from these proxy IPs (comma-separated, or *); off by "
        "default, which also skips per-request proxy-header parsing.",
    )
    otel: bool = _opt(
        False,
        "Enable FastAPI's native OpenTelemetry (traces, metrics, logs) through the globally "
        "configured providers; off by default, which keeps its per-request checks off the hot "
        "path.",
    )
    api_key: tuple[str, ...] = _opt(
        (),
        "API key clients must send as 'Authorization: Bearer KEY'; repeatable. None: no auth.",
        env=("OPENAI_COMPAT_API_KEYS",),
        secret=True,
    )
    keys_file: Path | None = _opt(
        None,
        "TOML file of [[keys]] tables: each caller's name, key (key_sha256), models, rpm, tpm, "
        "max_concurrent, weight, batch, admin, expires (docs/operations.md). Reloaded on SIGHUP "
        "and when it changes; --api-key keys stay valid beside it.",
    )
    protect_docs_and_metrics: bool | None = _opt(
        None,
        "true: require the API key on /metrics, /docs and /openapi.json too; false: all open. "
        "Unset: open, except /metrics with a keys file (an admin's key then: its per-key "
        "series name every key and model).",
    )
    max_queued_inputs: int = _opt(
        8192,
        "Per model, most inputs admitted and unanswered; past it requests get 429 with "
        "Retry-After at once (0: unbounded).",
        ge=0,
    )
    max_body_bytes: int = _opt(
        64 * 1024 * 1024, "Largest request body in bytes; larger ones get 413.", ge=1
    )
    log_format: Literal["text", "json"] = _opt(
        "text", "Log lines as text or as JSON objects (one per line)."
    )
    access_log: bool = _opt(True, "One log line per request (at info level).")
    count_tokens: bool = _opt(
        True,
        "Count usage with each model's own tokenizer (exact, after truncation); off reports "
        "the engine's own count (characters) and skips that extra tokenization.",
    )
    graceful_timeout: float = _opt(
        30.0, "Seconds to let in-flight requests finish after SIGTERM.", ge=0
    )
    allow_private_media_urls: bool = _opt(
        False,
        "Fetch image/audio URLs that resolve to loopback, private or link-local addresses "
        "(trusted networks and tests only).",
    )
    max_media_bytes: int = _opt(
        8 * 1024 * 1024, "Largest image or audio item, fetched or in a data: URI, in bytes.", ge=1
    )
    media_fetch_timeout: float = _opt(10.0, "Seconds one media URL fetch may take.", gt=0)
    max_media_items: int = _opt(64, "Most image or audio inputs in one request.", ge=1)
    max_media_pixels: int = _opt(
        16_777_216,
        "Most pixels (width x height) an image may have; checked from its header before it "
        "is decoded (decompression bombs).",
        ge=9,
    )
    max_request_pixels: int = _opt(
        67_108_864,
        "Most pixels (width x height, summed over its images) one request may have decoded; "
        "checked from the images' headers before any is decoded. Each image is then shrunk "
        "to what the model's processor keeps as it is decoded, one at a time.",
        ge=9,
    )
    max_multivector_values: int = _opt(
        4_194_304,
        "Most vector values (vectors x dimensions) one request may get back from a "
        "multi-vector model (ColBERT, ColPali: one vector per token): 4 Mi values are 16 MiB "
        "of float32, about 22 MB of base64 or 45 MB of JSON floats. Checked from the inputs' "
        "token counts before the model runs.",
        ge=1,
    )
    max_audio_seconds: float = _opt(
        60.0, "Longest audio item in seconds; checked from its header before decoding.", gt=0
    )
    export_dir: Path | None = _opt(
        None,
        "Where ONNX/OpenVINO exports of models are cached (default: "
        "$HF_HOME/openai-compat-exports).",
    )
    batch_api: bool = _opt(
        True,
        "Serve the Files and Batch APIs (their state is this process's data dir). Off: they "
        "answer 404, as on stateless replicas behind an Ingress that sends /v1/files and "
        "/v1/batches to the one batch pod that owns the data dir.",
    )
    data_dir: Path | None = _opt(
        None,
        "Where the Files and Batch APIs keep their state: batch.sqlite3 (jobs, files) and the "
        "files themselves (default: $XDG_DATA_HOME/openai-compat/port-PORT, else "
        "~/.local/share/openai-compat/port-PORT: one per port, so two servers never share "
        "one).",
    )
    batch_max_requests: int = _opt(
        50_000, "Most request lines in one batch input file (OpenAI's limit).", ge=1
    )
    batch_line_timeout: float = _opt(
        600.0,
        "Seconds one batch line may take; past that it fails alone (code 'timeout').",
        gt=0,
    )
    batch_max_data_bytes: int = _opt(
        0,
        "Most bytes the data dir may hold (uploads and batch output together); a batch that "
        "would pass it fails with what it wrote so far, an upload gets 413. 0: no quota.",
        ge=0,
    )
    batch_min_free_bytes: int = _opt(
        512 * 1024 * 1024,
        "Free disk the Files and Batch APIs always leave on the data dir's filesystem: a "
        "batch that would eat into it fails with what it wrote so far, an upload gets 507.",
        ge=0,
    )
    batch_max_file_bytes: int = _opt(
        200 * 1024 * 1024, "Largest file POST /v1/files takes, in bytes (OpenAI's limit).", ge=1
    )
    models: tuple[ModelConfig, ...] = _opt((), "Models from the config file.", cli=False)
    ray_ingress: RayOptions = _opt(
        RayOptions(ray_actor_options={"num_cpus": 0.5}),
        "serve --ray: the ingress deployment (our HTTP app): replicas, autoscaling, resources.",
        cli=False,
    )
    ray_batch: RayOptions = _opt(
        RayOptions(
            ray_actor_options={"num_cpus": 0, "resources": {"node:__internal_head__": 0.001}}
        ),
        "serve --ray: the batch server (the Files and Batch APIs, one replica where the data "
        "dir is; the head node by default, reserving no CPU, as Ray's own proxy): its "
        "resources. Always one replica.",
        cli=False,
    )

    def check_model_pool(self, configs: Sequence[ModelConfig] | None = None) -> None:
        """More eager models than --max-loaded-models may hold can never start."""
        configs = self.served_models() if configs is None else configs
        eager = sum(1 for c in configs if c.load == "eager")
        if self.max_loaded_models and eager > self.max_loaded_models:
            raise ConfigError(
                f"{eager} models load eagerly but --max-loaded-models is "
                f'{self.max_loaded_models}: set load = "lazy" on the others'
            )

    def data(self) -> Path:
        """--data-dir, else one per port under $XDG_DATA_HOME/openai-compat (two servers of
        one user never share the Batch API's state and lock by default); a data dir made
        there before per-port defaults (batch.sqlite3 at the top) is kept."""
        if self.data_dir is not None:
            return self.data_dir
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        shared = Path(base) / "openai-compat"
        if (shared / "batch.sqlite3").exists():
            return shared
        return shared / f"port-{self.port}"

    def exports(self) -> Path:
        return self.export_dir or default_export_dir()

    @field_validator("ray_batch")
    @classmethod
    def _one_batch_server(cls, value: RayOptions) -> RayOptions:
        if value.num_replicas != 1 or value.autoscaling_config:
            raise ValueError(
                "the batch server keeps the Batch API's state in one data dir: it runs one "
                "replica (no num_replicas or autoscaling_config)"
            )
        return value

    @field_validator("memory_budget", mode="before")
    @classmethod
    def _budget_size(cls, value: Any) -> Any:
        return parse_size(value, "memory_budget")

    @field_validator("admin_key")
    @classmethod
    def _admin_key_not_blank(cls, key: str | None) -> str | None:
        if key is not None and (not key.strip() or key != key.strip()):
            raise ValueError("admin key is empty or has surrounding whitespace")
        return key

    @field_validator("api_key")
    @classmethod
    def _keys_not_blank(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        # A blank key would silently mean "no auth" (or a key no client can send).
        for i, key in enumerate(keys):
            if not key.strip():
                raise ValueError(f"API key #{i + 1} is empty or whitespace; remove it or set one")
            if key != key.strip():
                raise ValueError(f"API key #{i + 1} starts or ends with whitespace")
        return keys

    def served_models(self) -> tuple[ModelConfig, ...]:
        """Config-file models, then --model ones, with --alias applied; the default if none."""
        configs = list(self.models) + [parse_model_spec(spec) for spec in self.model]
        if not configs:
            configs = [ModelConfig(model=BUILTIN_PREFIX + DEFAULT_MODEL_NAME)]
        extra: dict[str, list[str]] = {}
        for spec in self.alias:
            alias, sep, target = spec.partition("=")
            if not sep or not alias.strip() or not target.strip():
                raise ConfigError(f"--alias must look like ALIAS=NAME, got {spec!r}")
            extra.setdefault(target.strip(), []).append(alias.strip())
        known = {c.served_name for c in configs}
        for target in extra:
            if target not in known:
                raise ConfigError(
                    f"--alias points at {target!r}, which is not served; served: {sorted(known)}"
                )
        configs = [
            c.model_copy(
                update={
                    "aliases": (*c.aliases, *extra.get(c.served_name, [])),
                    "dtype": self.dtype if c.dtype == "auto" else c.dtype,
                }
            )
            for c in configs
        ]
        check_unique_names(configs)
        return tuple(configs)

    def default_models(self) -> dict[str, str]:
        """--default-model CAPABILITY=NAME -> {capability: name} (names checked at load)."""
        chosen: dict[str, str] = {}
        for spec in self.default_model:
            capability, sep, name = spec.partition("=")
            capability, name = capability.strip(), name.strip()
            if not sep or capability not in CAPABILITIES or not name:
                raise ConfigError(
                    f"--default-model must look like CAPABILITY=NAME with CAPABILITY one of "
                    f"{', '.join(CAPABILITIES)}; got {spec!r}"
                )
            chosen[capability] = name
        return chosen
