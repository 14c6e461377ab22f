"""The dtype a native model runs in: one policy per device for `dtype = "auto"`, a quality check
at load that keeps a lower precision only where it ranks as fp32 does, and the verdict cached.

transformers 5 loads a folder in the dtype it was saved in unless told: a half-precision
folder ran 4.1x slower on CPU (fp16 has no fast CPU kernels) and a full-precision one ran fp32
on a GPU where the seed's engine ran bf16. The policy (docs/configuration.md#dtype):
- an explicit `dtype` (float32, float16, bfloat16) always wins, unchecked;
- CUDA: bfloat16 where the card has it, else float16;
- CPU: bfloat16 where the CPU has bf16 instructions (AVX512_BF16 or AMX on x86, BF16 on Arm:
  about twice fp32's speed there), else float32; never float16, whatever the folder holds;
- MPS: float32 (the library's own choice; not measured on Apple GPUs here).
A lower precision is applied to the transformer only (`model[0]`), whose floating outputs are
cast back to float32 at its boundary: pooling, normalisation, the library's heads after it and
every score run in float32. The candidate is kept only where the check passes: the probe set
(probes.py) run in float32 and in the candidate, minimum cosine >= 0.99 and ranking agreement
>= 0.99 (top-10 neighbours of each query, tie-aware; a cross-encoder's order of each query's
scores; a sparse model's top terms). The verdict (dtype, device, figures, why) is logged,
shown in /v1/models and written beside the exports, keyed by the model's files, the device
and the library versions, so a restart does not pay it again; `dtype_check = false` keeps the
candidate unchecked. Kinds without a probe of their own (images, audio, token vectors) keep
float32 on CPU, and say so.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from openai_compat.engine import probes

logger = logging.getLogger("openai_compat")

EXPLICIT = ("float32", "float16", "bfloat16")
MIN_COSINE = 0.99
MIN_AGREEMENT = 0.99
TOP = 10  # neighbours compared per query
TIE = 1e-3  # a neighbour counts when fp32 scores it within this of fp32's own 10th best
TERMS = 16  # a sparse vector's top terms compared
# a term counts when fp32 weighs it within this share of its own 16th-best weight: weights are
# ~0.5-2, not cosines, and bf16 keeps 8 significant bits; on the SPLADE test model a weight's
# bf16 error is 0.6% at the median, 3.3% at the 90th percentile, 7% at the 99th
TERM_TIE = 0.05
RULES = 2  # the judging rules' version, part of every cached verdict's key
# Small batches: little padding for the probe set's mixed lengths (MiniLM on 2 cores: the
# float32 pass in 0.29 s at 4 a batch, 0.50 s at 16, 0.70 s at 32)
PROBE_BATCH = 4


@dataclass(frozen=True)
class Verdict:
    """What a model runs in and why; `check`: the figures, where the check ran."""

    dtype: str
    device: str
    reason: str
    check: dict[str, Any] | None = field(default=None)

    def card(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


# ---------------------------------------------------------------- the policy


def device_of(model: Any) -> str:
    """The torch device type the library put the model on ("cpu", "cuda", "mps")."""
    return str(getattr(getattr(model, "device", None), "type", "cpu"))


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU has bfloat16 instructions (Linux's /proc/cpuinfo flags)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return False
    for line in cpuinfo.splitlines():
        if line.startswith(("flags", "Features")):
            flags = set(line.split(":", 1)[-1].split())
            return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    return False


def candidate(device: str, has_bf16: bool | None = None) -> tuple[str, str]:
    """The policy: (the dtype to try for dtype = "auto" on `device`, why)."""
    if device == "cuda":
        import torch

        if has_bf16 if has_bf16 is not None else torch.cuda.is_bf16_supported():
            return "bfloat16", "CUDA with bfloat16"
        return "float16", "CUDA without bfloat16"
    if device == "cpu":
        if has_bf16 if has_bf16 is not None else cpu_has_bf16():
            return "bfloat16", "a CPU with bfloat16 instructions"
        return "float32", "a CPU without bfloat16 instructions (float16 is slow on any CPU)"
    return "float32", f"{device}: the library's float32 (no lower precision measured there)"


def checkable(model: Any, kind: str, multivector: bool) -> bool:
    """Kinds the probe set can judge: text embedders, SPLADE, cross-encoders, classifiers."""
    modalities = set(getattr(model, "modalities", None) or ["text"])
    return (
        kind in ("embedder", "sparse", "crossencoder", "classifier")
        and not multivector
        and (modalities <= {"text"})
    )


# ---------------------------------------------------------------- applying a dtype


def _upcast(_module: Any, _args: Any, output: Any) -> Any:
    """The transformer's floating outputs in float32: what runs after it stays float32."""
    if isinstance(output, dict):
        return {k: _f32(v) for k, v in output.items()}
    return _f32(output)


def _f32(value: Any) -> Any:
    return value.float() if getattr(value, "is_floating_point", lambda: False)() else value


def lowered(model: Any, dtype: str) -> Any:
    """A copy of the model's transformer in `dtype`: floating inputs (pixel values, audio
    features) cast to it on the way in, its floating outputs back to float32 on the way out."""
    import copy

    import torch

    low = getattr(torch, dtype)

    def downcast(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        if args and isinstance(args[0], dict):
            cast = {
                k: v.to(low) if getattr(v, "is_floating_point", lambda: False)() else v
                for k, v in args[0].items()
            }
            return (cast, *args[1:])
        return args

    module = copy.deepcopy(model[0]).to(low)
    module.register_forward_pre_hook(downcast)
    module.register_forward_hook(_upcast)
    return module


# ---------------------------------------------------------------- the check


def _unit(x: Any) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    return a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)


def top_agreement(
    want: np.ndarray, got: np.ndarray, top: int = TOP, tie: float = TIE, relative: bool = False
) -> float:
    """Of each row's `top` best columns by `got`, the share that `want` scores within `tie`
    of its own `top`-th best (`relative`: within that share of it) (rows: queries; columns:
    documents or terms)."""
    top = min(top, want.shape[1])
    agreed = 0
    for w, g in zip(want, got, strict=True):
        kth = np.sort(w)[-top]
        slack = tie * abs(kth) if relative else tie
        agreed += int(np.sum(w[np.argsort(-g, kind="stable")[:top]] >= kth - slack))
    return agreed / (top * len(want))


def pair_agreement(want: np.ndarray, got: np.ndarray, tie: float = TIE) -> float:
    """Of each row's pairs of scores that `want` orders (apart by more than `tie`), the share
    that `got` orders the same way."""
    same = total = 0
    for w, g in zip(want, got, strict=True):
        dw, dg = w[:, None] - w[None, :], g[:, None] - g[None, :]
        apart = np.abs(dw) > tie
        total += int(apart.sum())
        same += int((np.sign(dw) == np.sign(dg))[apart].sum())
    return same / total if total else 1.0


def _outputs(model: Any, kind: str) -> np.ndarray:
    """The probe set through the library's own public calls: a row per query (a
    cross-encoder's scores of every passage), per input (a classifier's label
    probabilities), or per text (an embedder's vectors, queries first)."""
    queries, passages = probes.QUERIES, probes.PASSAGES
    if kind == "crossencoder":
        pairs = [(q, p) for q in queries for p in passages]
        scores = model.predict(
            pairs, batch_size=PROBE_BATCH, convert_to_numpy=True, show_progress_bar=False
        )
        return np.asarray(scores, dtype=np.float64).reshape(len(queries), len(passages))
    if kind == "classifier":  # predict takes a list of strings as one input: one at a time
        # probabilities, as classify answers: near-zero logits' directions mean nothing
        probs = [
            model.predict(t, apply_softmax=True, show_progress_bar=False)
            for t in queries + passages
        ]
        return np.asarray(probs, dtype=np.float64).reshape(len(queries) + len(passages), -1)
    if kind == "sparse":
        encoded = model.encode(
            queries + passages,
            batch_size=PROBE_BATCH,
            convert_to_tensor=True,
            show_progress_bar=False,
        )
        return np.asarray(encoded.to_dense().float().cpu().numpy(), dtype=np.float64)
    vectors = model.encode(
        queries + passages, batch_size=PROBE_BATCH, convert_to_numpy=True, show_progress_bar=False
    )
    return np.asarray(vectors, dtype=np.float64)


def judge(want: np.ndarray, got: np.ndarray, kind: str) -> dict[str, Any]:
    """A candidate's figures against float32's outputs (_outputs), and whether it passes:
    the least cosine between matching rows, and the ranking agreement of the kind."""
    w, g = _unit(want), _unit(got)
    live = np.linalg.norm(want, axis=1) > 0  # an empty text's SPLADE vector is all zeros
    cosine = float(np.min(np.sum(w * g, axis=1)[live])) if live.any() else 1.0
    n = len(probes.QUERIES)
    if kind in ("crossencoder", "classifier"):
        agreement, measure = pair_agreement(want, got), "score order agreement"
    elif kind == "sparse":
        agreement = top_agreement(want, got, TERMS, TERM_TIE, relative=True)
        measure = f"top-{TERMS} term agreement"
    else:
        agreement = top_agreement(w[:n] @ w[n:].T, g[:n] @ g[n:].T)
        measure = f"top-{TOP} neighbour agreement"
    return {
        "min_cosine": round(cosine, 5),
        "agreement": round(agreement, 5),
        "measure": measure,
        "probes": len(want),
        "passed": cosine >= MIN_COSINE and agreement >= MIN_AGREEMENT,
    }


# ---------------------------------------------------------------- the verdict, cached


def _fingerprint(source: str, revision: str | None) -> list[Any]:
    """What identifies the weights: a local folder's files (name, size, mtime), else the
    hub id and revision."""
    folder = Path(source)
    if not folder.is_dir():
        return [source, revision]
    return sorted(
        [str(p.relative_to(folder)), p.stat().st_size, int(p.stat().st_mtime)]
        for p in folder.rglob("*")
        if p.is_file() and p.suffix in (".json", ".safetensors", ".bin", ".pt", ".txt", ".model")
    )


def _device_name(device: str) -> str:
    if device == "cuda":
        import torch

        return str(torch.cuda.get_device_name())
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cache_key(config: Any, device: str, dtype: str, kind: str) -> str:
    from importlib.metadata import version

    parts = {
        "weights": _fingerprint(str(config.source), config.revision),
        "device": _device_name(device),
        "dtype": dtype,
        "kind": kind,
        "pooling": config.pooling_method,
        "max_length": config.max_length,
        "probes": probes.VERSION,
        "rules": RULES,
        "libraries": [version(p) for p in ("torch", "transformers", "sentence-transformers")],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _read(path: Path) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = json.loads(path.read_text())
        return found
    except (OSError, ValueError):
        return None


def _reader(kind: str, reading: Any) -> tuple[Any, Any]:
    """How the check reads a model's outputs on the probe set, and judges two readings: the
    model's own `reading` (read, judge: BGE-M3's three outputs, bge_m3.CheckReading), else its
    kind's (_outputs, judge)."""
    if reading is not None:
        return reading.read, reading.judge
    return (lambda model: _outputs(model, kind)), (lambda want, got: judge(want, got, kind))


def decide(
    model: Any, config: Any, kind: str, multivector: bool, cache_dir: Path, reading: Any = None
) -> Verdict:
    """The dtype the model runs in, applied and logged (see _decide). `reading`: how a model
    with outputs of its own is read and judged (`read(model)`, `judge(want, got)`, `kind`:
    bge_m3.CheckReading), else by its kind."""
    verdict = _decide(model, config, kind, multivector, cache_dir, reading)
    logger.info(
        "model %r: %s on %s (%s)", config.served_name, verdict.dtype, verdict.device, verdict.reason
    )
    return verdict


def _decide(
    model: Any, config: Any, kind: str, multivector: bool, cache_dir: Path, reading: Any
) -> Verdict:
    """Run the policy on a model the library loaded in float32 (for dtype = "auto"): keep it,
    or put its transformer in the candidate dtype where the check (or its cached verdict)
    passes. Blocking (the check runs the probe set twice). An export's runtime runs float32."""
    device = device_of(model)
    if config.dtype in EXPLICIT:
        return Verdict(config.dtype, device, "configured")
    if config.backend != "torch":
        return Verdict("float32", device, f"the {config.backend} export runs float32")
    dtype, why = candidate(device)
    if dtype == "float32":
        return Verdict("float32", device, f"{why}")
    if not checkable(model, kind, multivector):
        if device == "cpu":
            return Verdict("float32", device, f"{why}, but no quality probe for this kind yet")
        model[0] = lowered(model, dtype)  # a GPU: what TEI, vLLM and infinity-emb run
        return Verdict(dtype, device, f"{why}; not checked (no quality probe for this kind)")
    if not config.dtype_check:
        model[0] = lowered(model, dtype)
        return Verdict(dtype, device, f"{why}; not checked (dtype_check = false)")
    read, judged = _reader(kind, reading)
    key = cache_key(config, device, dtype, reading.kind if reading is not None else kind)
    path = cache_dir / "dtype-checks" / f"{key}.json"
    check = _read(path)
    full = model[0]
    if check is not None:
        check["cached"] = True
        if check.get("passed"):
            model[0] = lowered(model, dtype)
    else:
        started = time.perf_counter()
        reference = read(model)
        model[0] = lowered(model, dtype)
        check = judged(reference, read(model))
        check["seconds"] = round(time.perf_counter() - started, 2)
        if not check["passed"]:
            model[0] = full
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(check, indent=2))
    del full  # the float32 transformer, where the candidate replaced it
    if check.get("passed"):
        return Verdict(dtype, device, f"{why}; the quality check passed", check)
    logger.warning(
        "model %r: %s ranks unlike float32 on the probe set (min cosine %.4f, %s %.4f): "
        "serving float32",
        config.served_name, dtype, check["min_cosine"], check["measure"], check["agreement"],
    )  # fmt: skip
    return Verdict("float32", device, f"{why}, but {dtype} failed the quality check", check)
