"""CPU backends for text-embedding models: ONNX Runtime, optionally int8-quantised.

infinity-emb's own `optimum` engine cannot export (it needs a `.onnx` file already in the
model folder) and breaks with the pinned torch, so exports go through sentence-transformers'
`backend="onnx"` (optimum's exporter), are optimised (fp32, ORT level O3) or dynamically
quantised to int8, and are cached on disk. The served model is infinity-emb's torch
embedder, for its dynamic batching, with its transformer module swapped for the ONNX one
(engine/adapter.py); tokenisation, pooling and normalisation stay sentence-transformers'.

Cache: `<export dir>/<model name>-<key>/`, a complete sentence-transformers folder with
`onnx/<file>.onnx`; the key hashes the source, revision, backend and the model's config, so
a changed model is exported anew. Written to a temporary folder and renamed into place, so
a crash mid-export leaves no half cache.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from openai_compat.settings import ModelConfig

logger = logging.getLogger("openai_compat")

Backend = Literal["onnx"]
BACKENDS: tuple[str, ...] = ("onnx",)
OPTIMIZATION = "O3"  # ORT graph fusions incl. fast GELU; cosine to torch 1.0000 on MiniLM


@dataclass(frozen=True)
class Export:
    folder: Path
    file_name: str  # relative to folder, e.g. "onnx/model_O3.onnx"


def default_export_dir() -> Path:
    """Beside the Hugging Face cache, so images that bake HF_HOME carry the exports too."""
    hf_home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return Path(hf_home) / "openai-compat-exports"


def quantization_target() -> str:
    """The dynamic-quantisation config that suits this CPU (optimum's names)."""
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "arm64"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        flags = ""
    if "avx512_vnni" in flags:
        return "avx512_vnni"
    if "avx512f" in flags:
        return "avx512"
    return "avx2"


def _key(source: str, revision: str | None, backend: str, quantize: str | None) -> str:
    parts = [source, revision or "", backend, quantize or OPTIMIZATION]
    config = Path(source, "config.json")
    if config.is_file():  # a local folder: a changed model gets a new export
        parts.append(hashlib.sha256(config.read_bytes()).hexdigest())
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _find(folder: Path, quantize: str | None) -> str | None:
    onnx = folder / "onnx"
    if not onnx.is_dir():
        return None
    if quantize:
        found = sorted(onnx.glob("model_*int8_*.onnx"))
    else:
        found = sorted(onnx.glob(f"model_{OPTIMIZATION}.onnx"))
    return f"onnx/{found[0].name}" if found else None


def prepare(
    source: str,
    *,
    name: str,
    revision: str | None,
    backend: str,
    quantize: str | None,
    export_dir: Path,
) -> Export:
    """The cached export for this model, made first if missing (blocking: seconds)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    folder = export_dir / f"{slug}-{_key(source, revision, backend, quantize)}"
    found = _find(folder, quantize)
    if found is not None:
        return Export(folder, found)
    from sentence_transformers import (
        SentenceTransformer,
        export_dynamic_quantized_onnx_model,
        export_optimized_onnx_model,
    )

    logger.info(
        "exporting %r to ONNX%s (once; cached in %s)", name, " int8" if quantize else "", folder
    )
    export_dir.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model = SentenceTransformer(source, backend="onnx", device="cpu", revision=revision)
        model.save_pretrained(str(tmp))
        if quantize:
            export_dynamic_quantized_onnx_model(model, quantization_target(), str(tmp))
        else:
            export_optimized_onnx_model(model, OPTIMIZATION, str(tmp))
        try:
            tmp.rename(folder)
        except OSError:  # another process finished the same export first
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    found = _find(folder, quantize)
    if found is None:
        raise RuntimeError(f"the ONNX export of {name!r} produced no model file in {folder}")
    return Export(folder, found)


def prepare_for(config: ModelConfig, export_dir: Path) -> Export:
    """The export a configured model is served from (see prepare)."""
    return prepare(
        config.source,
        name=config.served_name,
        revision=config.revision,
        backend=config.engine,
        quantize=config.quantize,
        export_dir=export_dir,
    )


def load_module(export: Export) -> Any:
    """The sentence-transformers transformer module running the exported graph."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(
        str(export.folder),
        backend="onnx",
        device="cpu",
        model_kwargs={"file_name": export.file_name},
    )
    return model[0]
