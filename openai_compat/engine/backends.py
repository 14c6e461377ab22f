"""What every exported CPU backend shares (engine/exported.py makes the exports): the
export cache, the runtimes' options, and OpenVINO's telemetry kept off.

Cache: `<export dir>/<model name>-<key>/`; the key hashes the source, revision, backend,
quantisation, the export recipe and (for a local folder) its config and weight files'
contents, so a changed model, weights changed in place included, is exported anew. An export
is written to a temporary folder, measured there (engine/fidelity.py) and renamed into
place, so a crash mid-export leaves no half cache. The int8 recipes (output projections kept
fp32, calibration on fixed texts) are engine/int8.py's.

No library gives these: sentence-transformers' own export helpers go through optimum, which
cannot be installed beside transformers >= 5.3, and cache nothing keyed on the weights.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, TypeVar

logger = logging.getLogger("openai_compat")

Backend = Literal["onnx", "openvino"]
T = TypeVar("T")
# Part of every cache key (the exporter of issue #29's ONNX fp32 exports; kept so keys stay put).
OPTIMIZATION = "O3"
OPENVINO_INT8 = "openvino_model_qint8_quantized.xml"  # sentence-transformers' naming
# Part of every cache key: a changed export recipe makes its exports anew.
RECIPE = "3: int8 output projections fp32, wide calibration, fidelity measured in f32"
# OpenVINO's CPU plugin runs an fp32 model in bf16 where the CPU has bf16 instructions
# (AVX512_BF16, AMX) unless told otherwise: max abs error 1.4e-3 on MiniLM's vectors. Our
# dtype decides: auto/float32 -> f32 (what "fp32" promises), bfloat16 or float16 opt in.
OPENVINO_PRECISION = {"bfloat16": "bf16", "float16": "f16"}


def slug(name: str) -> str:
    """A served name as a file-name part of a cache entry."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


# Files whose contents make the model: a local folder's export is keyed on them.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".onnx", ".xml")
DIGESTS = "weight-digests.json"  # in the export dir: file stat -> sha256, so starts rehash nothing


def _key(
    source: str,
    revision: str | None,
    backend: str,
    quantize: str | None,
    export_dir: Path | None = None,
) -> str:
    """The export's cache key: source, revision, backend, quantisation, recipe and, for a
    local folder, the contents of its config and weight files (weights changed in place
    are exported anew; the fidelity report is the new export's)."""
    parts = [source, revision or "", backend, quantize or OPTIMIZATION, RECIPE]
    folder = Path(source)
    config = folder / "config.json"
    if config.is_file():  # a local folder: a changed model gets a new export
        parts.append(hashlib.sha256(config.read_bytes()).hexdigest())
        parts += _weight_digests(folder, export_dir)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _weight_digests(folder: Path, export_dir: Path | None) -> list[str]:
    """ "relative path:sha256" of each weight file in a model folder. A file is hashed again
    only when its stat changes (size, mtime, ctime, inode: ctime moves with every write and
    cannot be set back), the digests kept in the export dir; a new copy of the same weights
    costs one hash and keeps its export."""
    memo_path = export_dir / DIGESTS if export_dir is not None else None
    try:
        memo: dict[str, Any] = json.loads(memo_path.read_text()) if memo_path else {}
    except (OSError, ValueError):
        memo = {}
    changed = False
    out = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        hidden = rel.parts[0].startswith(".")
        if path.suffix not in _WEIGHT_SUFFIXES or hidden or not path.is_file():
            continue
        st = path.stat()
        stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        known = memo.get(str(path.resolve()))
        if not (isinstance(known, dict) and known.get("stat") == stamp):
            digest = hashlib.sha256()
            with path.open("rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
            known = {"stat": stamp, "sha256": digest.hexdigest()}
            memo[str(path.resolve())] = known
            changed = True
        out.append(f"{rel}:{known['sha256']}")
    if changed and memo_path is not None:
        try:
            memo_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = memo_path.with_name(f".{memo_path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(memo))
            os.replace(tmp, memo_path)
        except OSError:  # a read-only export dir: hash again next time
            logger.debug("could not keep weight digests in %s", memo_path, exc_info=True)
    return out


LABELS = {"onnx": "ONNX", "openvino": "OpenVINO"}


def cache_folder(
    export_dir: Path,
    name: str,
    source: str,
    revision: str | None,
    backend: str,
    quantize: str | None,
) -> Path:
    """Where a served model's export is cached: its name and the export's key (_key)."""
    return export_dir / f"{slug(name)}-{_key(source, revision, backend, quantize, export_dir)}"


def export_once(
    folder: Path,
    *,
    name: str,
    backend: str,
    quantize: str | None,
    find: Callable[[Path], T | None],
    make: Callable[[Path], None],
    measure: Callable[[Path, T], None],
) -> T:
    """What `find` finds of the export in `folder`, made first if missing: `make(tmp)` writes
    it into a temporary folder, `measure(tmp, found)` measures it there, and the folder is
    renamed into place (a crash mid-export leaves no half cache; of two processes exporting
    the same model the first to finish is kept). Blocking: seconds."""
    found = find(folder)
    if found is not None:
        return found
    label = LABELS[backend]
    int8_label = " int8" if quantize else ""
    logger.info("exporting %r to %s%s (once; cached in %s)", name, label, int8_label, folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        make(tmp)
        made = find(tmp)
        if made is not None:
            measure(tmp, made)
        with contextlib.suppress(OSError):  # another process finished the same export first
            tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    found = find(folder)
    if found is None:
        raise RuntimeError(f"the {label} export of {name!r} produced no model file in {folder}")
    return found


@contextmanager
def openvino_telemetry_declined() -> Iterator[None]:
    """OpenVINO's converter and NNCF report usage to Intel unless the user opted out (their
    consent file). Like infinity-emb's reporting (cli.py), it stays off unless the user has
    turned tracking on (DO_NOT_TRACK unset or 0)."""
    if os.environ.get("DO_NOT_TRACK", "0") in ("", "0"):
        yield
        return
    try:
        from openvino_telemetry.utils.opt_in_checker import ConsentCheckResult, OptInChecker
    except ImportError:
        yield
        return
    original = OptInChecker.check

    def declined(self: Any, *args: Any, **kwargs: Any) -> Any:
        return ConsentCheckResult.DECLINED

    OptInChecker.check = declined
    try:
        yield
    finally:
        OptInChecker.check = original


def runtime_options(backend: Backend, threads: int, dtype: str = "auto") -> dict[str, Any]:
    """The runtime's thread pool sized to the CPUs the process may use (cpus.py): ONNX
    Runtime and OpenVINO otherwise count the host's cores. ONNX Runtime's workers also stop
    spinning between runs: a spinning pool takes the core the event loop, the tokenizer and
    the next batch's preparation need (measured: docs/benchmarks.md)."""
    if backend == "openvino":
        return {
            "ov_config": {
                "INFERENCE_NUM_THREADS": str(threads),
                "PERFORMANCE_HINT": "LATENCY",
                "NUM_STREAMS": "1",
                "INFERENCE_PRECISION_HINT": OPENVINO_PRECISION.get(dtype, "f32"),
            }
        }
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return {"session_options": options}
