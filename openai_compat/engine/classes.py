"""Which of sentence-transformers' classes loads a model folder, read from the folder's own
files (docs/model-families.md), and what kind of model the loaded object is to the engine."""

from __future__ import annotations

from typing import Any

from openai_compat.engine import folders
from openai_compat.engine.text import TextKind

# The library's model classes, by the model_type its config_sentence_transformers.json names.
_CLASSES = ("SentenceTransformer", "SparseEncoder", "CrossEncoder", "MultiVectorEncoder")


def model_class(config: Any, source: str, archs: list[str]) -> str:
    """Which of the library's classes loads the folder, from its own files: the model_type
    it was saved with (PyLate's "ColBERT" and Stanford's HF_ColBERT architecture are
    MultiVectorEncoders, as that class detects them); else its architectures (a
    `*ForSequenceClassification` or a bare `*ForCausalLM` without sentence-transformers
    modules is a CrossEncoder, as CrossEncoder reads them: classifier head / yes-no
    log-odds; a masked LM is a SPLADE SparseEncoder); else a SentenceTransformer.
    `kind = "sparse"` asks for a SparseEncoder."""
    saved = folders.model_type(source, config.revision)
    if config.kind == "sparse":
        return "SparseEncoder"
    if config.kind == "dense" and saved == "SparseEncoder":
        return "SentenceTransformer"
    if saved == "ColBERT" or (saved is None and "HF_ColBERT" in archs):
        return "MultiVectorEncoder"  # PyLate <= 3, Stanford ColBERT: as the library reads them
    if saved is None and any(a.endswith("ForRetrieval") for a in archs):
        return "MultiVectorEncoder"  # ColPali, ColQwen2...: page images in, token vectors out
    if saved in _CLASSES:
        return saved
    if any(a.endswith("ForSequenceClassification") for a in archs):
        return "CrossEncoder"
    modules = folders.has_modules(source, config.revision)
    if not modules and any(a.endswith("ForCausalLM") for a in archs):
        return "CrossEncoder"
    if config.kind == "auto" and any(a.endswith("ForMaskedLM") for a in archs):
        return "SparseEncoder"
    return "SentenceTransformer"


def load_model(
    config: Any, source: str, archs: list[str], options: dict[str, Any]
) -> tuple[Any, TextKind, bool]:
    """The library's model for the folder, its kind, and whether it gives token vectors."""
    import sentence_transformers

    name = model_class(config, source, archs)
    try:
        model = getattr(sentence_transformers, name)(source, **options)
    except Exception as exc:
        saved = folders.model_type(source, config.revision)
        found = f"architectures {archs or 'none'}, model_type {saved or 'none'}"
        raise ValueError(
            f"{source}: sentence-transformers' {name} cannot load it ({found}): "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if name == "CrossEncoder":
        return model, ("crossencoder" if model.num_labels == 1 else "classifier"), False
    if name == "SparseEncoder":
        _check_splade(model)
        return model, "sparse", False
    if name == "MultiVectorEncoder":
        return model, "embedder", True
    modalities = set(getattr(model, "modalities", None) or ["text"])
    kind: TextKind = (
        "clip" if "image" in modalities else "clap" if "audio" in modalities else "embedder"
    )
    # A ColBERT checkpoint read as a SentenceTransformer: its token vectors (mean pooling
    # would give a vector nobody trained)
    multivector = kind == "embedder" and bool(archs) and "colbert" in archs[0].lower()
    return model, kind, multivector


def _check_splade(model: Any) -> None:
    """A SparseEncoder that pools SPLADE-style (max over tokens of log(1 + relu(logits))):
    the library builds one from a masked-LM folder, or reads the folder's own sparse modules.
    Anything else it might build (a sparse auto-encoder over a dense model) is refused."""
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    if not any(isinstance(m, SpladePooling) for m in model):
        found = ", ".join(type(m).__name__ for m in model)
        raise ValueError(
            f"kind = 'sparse' needs a SPLADE model (a masked-LM folder, or sentence-"
            f"transformers sparse modules with SpladePooling); this folder gives {found}"
        )


def architectures(source: str, revision: str | None, trust_remote_code: bool) -> list[str]:
    """The folder's (or hub id's) config architectures."""
    local = folders.architectures(source)
    if local is not None:
        return local
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(
        source, revision=revision, trust_remote_code=trust_remote_code
    )
    return [str(a) for a in getattr(config, "architectures", None) or []]


def check_library() -> None:
    """The native engine's floor: sentence-transformers 6's stages (preprocess, forward)."""
    from importlib.metadata import version

    found = version("sentence-transformers")
    if int(found.split(".")[0]) < 6:
        raise ValueError(
            f"the native engine needs sentence-transformers >= 6 (installed: {found}); this "
            "environment is infinity-emb's (requirements/infinity.txt): use engine = 'torch'"
        )
