"""What is checked before a model's engine is built, so a load that cannot work fails at
once with one line that says why and what to do: a local folder that is not there, a hub
model neither cached nor reachable, a CPU backend without its extra, a device this machine
lacks, a revision of a local folder, BetterTransformer without optimum's. It builds nothing
and imports no model library at module level (loading.py calls it first).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from openai_compat.engine.build import runs_natively
from openai_compat.frame.settings import BUILTIN_PREFIX, ModelConfig
from openai_compat.models.registry import EngineFailure


def _missing_folder(config: ModelConfig) -> str | None:
    """Why a model that names a local folder cannot load, when that folder is not there (the
    hub library would call it a malformed repo id): None for hub ids and folders that exist.
    A path is what starts with /, ./, ../ or ~, or has more than one '/' (hub ids are
    'name' or 'org/name')."""
    if config.engine == "debugengine" or config.model.startswith(BUILTIN_PREFIX):
        return None
    model = config.model
    pathlike = model.startswith(("/", "./", "../", "~")) or model.count("/") > 1
    folder = Path(model).expanduser()
    if not pathlike or folder.is_dir():
        return None
    if folder.exists():
        return f"{model!r} is a file, not a model folder"
    return (
        f"the folder {model!r} does not exist (and it is not a model-hub id either: those "
        "look like 'org/name')"
    )


# backend (engine/exported.py: no optimum) -> (the extra that brings it, the modules it needs)
_BACKEND_EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "onnx": ("onnx", ("onnx", "onnxruntime")),
    "openvino": ("openvino", ("openvino", "onnx")),
}


def _missing_module(modules: tuple[str, ...]) -> str | None:
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # its parent package is missing
            found = False
        if not found:
            return module
    return None


def _unreachable_hub_model(config: ModelConfig) -> str | None:
    """Why a hub model cannot load, said once, before the engine starts: it is not in the
    local cache and the hub cannot be reached (the hub library would retry each of its files
    for ~23 s, logging every try), or the hub does not have it. None: cached, or reachable."""
    model = config.model
    if config.engine == "debugengine" or model.startswith(BUILTIN_PREFIX):
        return None
    if Path(model).expanduser().exists():
        return None
    from huggingface_hub import HfApi, constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        snapshot_download(model, revision=config.revision, local_files_only=True)
        return None  # cached: it loads from there
    except Exception:  # not cached (or not a hub id): ask the hub below
        pass
    where = f"it is not in the local model cache ({constants.HF_HUB_CACHE})"
    fix = "run `openai-compat download` where the hub is reachable, or point model at a folder"
    if constants.HF_HUB_OFFLINE:
        return f"{where} and HF_HUB_OFFLINE is set: {fix}"
    try:
        HfApi(endpoint=constants.ENDPOINT).model_info(model, revision=config.revision, timeout=10)
    except GatedRepoError:
        return f"{model!r} is gated on the model hub: accept its terms and set HF_TOKEN"
    except (RepositoryNotFoundError, RevisionNotFoundError):
        rev = f" at revision {config.revision!r}" if config.revision else ""
        return f"the model hub has no model {model!r}{rev} (or it is private: set HF_TOKEN)"
    except Exception as exc:  # no network, DNS, a proxy: one line, no retries
        return f"{where} and the model hub cannot be reached ({type(exc).__name__}): {fix}"
    return None


def check_options(config: ModelConfig) -> None:
    """Refuse, with a message, model options that would otherwise do nothing or fail deep in
    the engine: a local folder that is not there, a device this machine lacks, a revision of
    a local folder, BetterTransformer where optimum's is not installed, forward lanes for
    infinity-emb's engines."""
    import torch

    name = config.served_name
    missing = _missing_folder(config) or _unreachable_hub_model(config)
    if missing is not None:
        raise EngineFailure(f"model {name!r} ({config.model}) failed to load: {missing}")
    device = config.device.split(":")[0]
    if device == "cuda" and not torch.cuda.is_available():
        raise EngineFailure(
            f"model {name!r}: device = {config.device!r}, but torch sees no CUDA device here"
        )
    if device == "mps" and not torch.backends.mps.is_available():
        raise EngineFailure(f"model {name!r}: device = 'mps', but MPS is not available here")
    if config.revision is not None and Path(config.source).is_dir():
        raise EngineFailure(
            f"model {name!r}: revision = {config.revision!r} applies to model-hub ids; "
            f"{config.model!r} is a local folder (it has no revisions)"
        )
    native = runs_natively(config.engine)
    if native and config.backend != "torch":
        extra, needed = _BACKEND_EXTRAS[config.backend]
        if config.backend == "openvino" and config.quantize:
            needed += ("nncf",)  # static int8 (ONNX's dynamic int8 is onnxruntime's own)
        module = _missing_module(needed)
        if module is not None:
            raise EngineFailure(
                f"model {name!r}: backend = {config.backend!r} needs the {module!r} package, "
                f"which is not installed: pip install 'openai-compat[{extra}]'"
            )
    if not native and config.forward_lanes:
        raise EngineFailure(
            f"model {name!r}: forward_lanes applies to the native engine; infinity-emb's "
            f"engine {config.engine!r} runs its own threads: leave the option out"
        )
    if native and config.bettertransformer:
        raise EngineFailure(
            f"model {name!r}: bettertransformer = true applies to infinity-emb's engines; the "
            "native engine runs transformers' own attention (SDPA): leave the option out"
        )
    if not native and config.backend != "torch":
        raise EngineFailure(
            f"model {name!r}: backend applies to engine = 'native' only; {config.engine!r} "
            f"is infinity-emb's here (or use engine = {config.backend!r})"
        )
