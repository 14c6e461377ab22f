"""BGE-M3's three outputs from one forward pass, and its scores, as FlagEmbedding computes them.

A BGE-M3 folder is an XLM-RoBERTa model (sentence-transformers loads its dense path: the `<s>`
position, normalised) with two heads beside the weights that the library ignores:
`sparse_linear.pt` (hidden -> 1) and `colbert_linear.pt` (hidden -> hidden or a ColBERT
width). From the last hidden state h of one forward:
- dense: h[:, 0], L2-normalised;
- sparse ("lexical weights"): relu(sparse_linear(h)), one weight per position; per token id
  the largest over its positions; the ids of `<s>`, `</s>`, `<pad>` and `<unk>` and weights
  <= 0 dropped;
- ColBERT: colbert_linear(h[:, 1:]) over the real tokens (`<s>` dropped, `</s>` kept), each
  vector L2-normalised.
Scores: dense = dot product; sparse = the sum over shared token ids of the two weights'
product; ColBERT = the mean over the query's vectors of the best dot product with the
document's; hybrid = their weighted sum (FlagEmbedding's README: 0.4, 0.2, 0.4).
The heads are stored in float16 in the real folder: they, and every score, run in float32
(FlagEmbedding's BGEM3FlagModel is the reference: tests/test_bge_m3.py).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from openai_compat.engine import precision, probes
from openai_compat.formats.sparse import SparseVector

HEAD_FILES = ("sparse_linear.pt", "colbert_linear.pt")
OUTPUTS = ("dense", "sparse", "multivector")
DENSE = frozenset({"dense"})
SCORE_MODES = ("hybrid", "dense", "sparse", "colbert")  # rerank's score_mode; hybrid: default
HYBRID_WEIGHTS = (0.4, 0.2, 0.4)  # dense, sparse, ColBERT: FlagEmbedding's README
logger = logging.getLogger("openai_compat")


class HeadError(ValueError):
    """A head file that cannot be read as the linear layer it must be (its name in the text)."""


def is_bge_m3(folder: str | Path) -> bool:
    """Whether a local folder holds BGE-M3's two heads beside its weights."""
    path = Path(folder)
    return path.is_dir() and all((path / name).is_file() for name in HEAD_FILES)


def heads_folder(source: str, revision: str | None = None) -> Path | None:
    """Where `source`'s heads are: the folder itself, or a hub model's cached snapshot (the
    files fetched as the library fetches its own; none offline); None: not BGE-M3."""
    if Path(source).is_dir():
        return Path(source) if is_bge_m3(source) else None
    try:
        from huggingface_hub import hf_hub_download

        paths = [Path(hf_hub_download(source, name, revision=revision)) for name in HEAD_FILES]
    except Exception:  # absent, offline, or not a hub id: a dense model as the library reads it
        return None
    return paths[0].parent


def heads_of(model: Any, source: str, revision: str | None) -> M3Heads | None:
    """A BGE-M3 folder's sparse and ColBERT heads for the library's loaded `model`, on its
    device; None for any other model."""
    folder = heads_folder(source, revision)
    if folder is None:
        return None
    heads = M3Heads.load(folder, model.tokenizer, model.get_embedding_dimension())
    logger.info("model %s: BGE-M3, dense, sparse and ColBERT outputs from one pass", source)
    return heads.to(model.device)


def parse_outputs(given: Sequence[str] | None, param: str = "output_types") -> frozenset[str]:
    """A request's output types (SIE's `output_types`): one or more of OUTPUTS, no repeats;
    ValueError naming what is wrong."""
    if given is None:
        return DENSE
    unknown = [g for g in given if g not in OUTPUTS]
    if unknown or not given or len(set(given)) != len(given):
        what = f"unknown {unknown[0]!r}" if unknown else "empty" if not given else "a repeat"
        raise ValueError(f"'{param}' takes one or more of {', '.join(OUTPUTS)} ({what})")
    return frozenset(given)


@dataclass
class M3Output:
    """One input's outputs: what was asked of the one forward pass (None: not asked)."""

    dense: np.ndarray | None
    sparse: SparseVector | None
    multivector: np.ndarray | None
    tokens: int

    @property
    def nbytes(self) -> int:  # what the exact cache counts it as
        parts = (self.dense, self.multivector)
        held = sum(int(p.nbytes) for p in parts if p is not None)
        return held + (self.sparse.nbytes if self.sparse is not None else 0)


class M3Heads:
    """The sparse and ColBERT heads, in float32, and the token ids the sparse output drops."""

    def __init__(self, sparse: Any, colbert: Any, dropped: Sequence[int]) -> None:
        self.sparse, self.colbert = sparse, colbert
        self.dropped = np.asarray(sorted(set(dropped)), dtype=np.int64)

    @classmethod
    def load(cls, folder: str | Path, tokenizer: Any, hidden: int) -> M3Heads:
        """The heads of `folder` (torch.load with weights_only: tensors, never code) for a
        model `hidden` wide; the special ids from its tokenizer (as FlagEmbedding reads them)."""
        path = Path(folder)
        sparse = _linear(path / "sparse_linear.pt", hidden, out=1)
        colbert = _linear(path / "colbert_linear.pt", hidden, out=None)
        specials = (tokenizer.cls_token, tokenizer.eos_token, tokenizer.pad_token)
        dropped = [
            tokenizer.convert_tokens_to_ids(token)
            for token in (*specials, tokenizer.unk_token)
            if token is not None
        ]
        return cls(sparse, colbert, [i for i in dropped if isinstance(i, int)])

    @property
    def width(self) -> int:
        """Values per ColBERT vector."""
        return int(self.colbert.out_features)

    def to(self, device: Any) -> M3Heads:
        """On the device the model's hidden states are (the heads stay float32)."""
        self.sparse, self.colbert = self.sparse.to(device), self.colbert.to(device)
        return self

    def outputs(
        self, hidden: Any, mask: Any, input_ids: Any, asked: Sequence[frozenset[str]]
    ) -> list[M3Output]:
        """Each row's asked outputs from the last hidden state [batch, tokens, hidden] of
        right- or left-padded rows (`mask`: 1 on real tokens)."""
        import torch

        with torch.inference_mode():
            h = hidden.float()
            want_sparse = any("sparse" in a for a in asked)
            want_colbert = any("multivector" in a for a in asked)
            weights = torch.relu(self.sparse(h)).squeeze(-1) if want_sparse else None
            colbert = self.colbert(h) if want_colbert else None
        ids = input_ids.cpu().numpy()
        real = mask.bool().cpu().numpy()
        made = []
        for i, outputs in enumerate(asked):
            positions = np.flatnonzero(real[i])
            first = positions[0]  # <s>, wherever padding put the row
            dense = sparse = vectors = None
            if "dense" in outputs:
                dense = _unit(h[i, first].cpu().numpy()[None])[0]
            if "sparse" in outputs and weights is not None:
                sparse = self._lexical(weights[i, positions].cpu().numpy(), ids[i, positions])
            if "multivector" in outputs and colbert is not None:
                vectors = _unit(colbert[i, positions[1:]].cpu().numpy())
            made.append(M3Output(dense, sparse, vectors, len(positions)))
        return made

    def _lexical(self, weights: np.ndarray, ids: np.ndarray) -> SparseVector:
        """Per token id its largest weight; special ids and weights <= 0 dropped."""
        tokens = len(ids)
        keep = (weights > 0) & ~np.isin(ids, self.dropped)
        ids, weights = ids[keep], weights[keep].astype(np.float32)
        order = np.lexsort((-weights, ids))  # by id, each id's largest first
        ids, weights = ids[order], weights[order]
        first = np.ones(len(ids), dtype=bool)  # each id's first (largest) weight
        first[1:] = ids[1:] != ids[:-1]
        indices = np.ascontiguousarray(ids[first], dtype="<u4")
        return SparseVector(indices, np.ascontiguousarray(weights[first], dtype="<f4"), tokens)


def _linear(path: Path, hidden: int, out: int | None) -> Any:
    """A float32 nn.Linear from a head's state dict; a HeadError naming the file otherwise."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        weight, bias = state["weight"], state.get("bias")
        rows, cols = weight.shape
        if cols != hidden or (out is not None and rows != out):
            want = f"[{out or 'N'}, {hidden}]"
            raise ValueError(f"its weight is {list(weight.shape)}, the model needs {want}")
        layer = torch.nn.Linear(cols, rows, bias=bias is not None)
        layer.load_state_dict({k: v.float() for k, v in state.items()})
    except Exception as exc:
        raise HeadError(f"BGE-M3 head {path.name} cannot be loaded: {exc}") from exc
    return layer.eval()


def _unit(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=-1, keepdims=True)
    return rows / np.maximum(norms, np.finfo(np.float32).tiny)


# ---------------------------------------------------------------- scores


def dense_score(query: np.ndarray, doc: np.ndarray) -> float:
    return float(np.dot(query.astype(np.float32), doc.astype(np.float32)))


def sparse_score(query: SparseVector, doc: SparseVector) -> float:
    """The sum over shared token ids of the two weights' product."""
    shared, qi, di = np.intersect1d(query.indices, doc.indices, return_indices=True)
    if not len(shared):
        return 0.0
    return float(np.dot(query.values[qi].astype(np.float32), doc.values[di].astype(np.float32)))


def colbert_score(query: np.ndarray, doc: np.ndarray) -> float:
    """The mean over the query's vectors of the best dot product with the document's."""
    if not len(query) or not len(doc):
        return 0.0
    return float((query.astype(np.float32) @ doc.astype(np.float32).T).max(axis=1).mean())


def hybrid_score(
    query: M3Output, doc: M3Output, weights: Sequence[float] = HYBRID_WEIGHTS
) -> float:
    """FlagEmbedding's weighted sum of the three scores (compute_score's `sparse+dense` and
    `colbert+sparse+dense`), over a query's and a document's full outputs."""
    assert query.dense is not None and doc.dense is not None
    assert query.sparse is not None and doc.sparse is not None
    assert query.multivector is not None and doc.multivector is not None
    parts = (
        dense_score(query.dense, doc.dense),
        sparse_score(query.sparse, doc.sparse),
        colbert_score(query.multivector, doc.multivector),
    )
    return float(sum(w * s for w, s in zip(weights, parts, strict=True)) / sum(weights))


# ---------------------------------------------------------------- the dtype check's reading


@dataclass(frozen=True)
class CheckReading:
    """How the dtype check (precision.decide) reads and judges a BGE-M3 model."""

    heads: M3Heads
    kind: str = "bge-m3"  # its verdicts' own cache key

    def read(self, model: Any) -> list[M3Output]:
        return probe(model, self.heads)

    def judge(self, want: Sequence[M3Output], got: Sequence[M3Output]) -> dict[str, Any]:
        return judge(want, got)


def probe(model: Any, heads: M3Heads) -> list[M3Output]:
    """The probe set's three outputs (engine/probes.py) through the library's forward and the
    heads: what the dtype check (engine/precision.py) compares between float32 and a lower
    precision for a BGE-M3 model."""
    import torch

    texts = probes.QUERIES + probes.PASSAGES
    made: list[M3Output] = []
    step = precision.PROBE_BATCH
    for start in range(0, len(texts), step):
        chunk = texts[start : start + step]
        features = {
            k: v.to(model.device) if hasattr(v, "to") else v
            for k, v in model.preprocess(chunk).items()
        }
        with torch.inference_mode():
            out = model(dict(features))
        asked = [frozenset(OUTPUTS)] * len(chunk)
        ids, mask = features["input_ids"], features["attention_mask"]
        made += heads.outputs(out["token_embeddings"], mask, ids, asked)
    return made


def judge(want: Sequence[M3Output], got: Sequence[M3Output]) -> dict[str, Any]:
    """Each output judged by its own measure (dense: the queries' top-10 neighbours; sparse:
    each text's top 16 terms; ColBERT: the queries' top 10 by MaxSim, and each text's token
    vectors' least cosine); it passes where all three do, its figures the least of them."""
    n = len(probes.QUERIES)
    parts: dict[str, dict[str, Any]] = {}
    parts["dense"] = precision.judge(_rows(want, "dense"), _rows(got, "dense"), "embedder")
    ids = sorted({int(i) for o in (*want, *got) if o.sparse is not None for i in o.sparse.indices})
    parts["sparse"] = precision.judge(_terms(want, ids), _terms(got, ids), "sparse")

    def maxsim(outs: Sequence[M3Output]) -> np.ndarray:
        vectors = [np.zeros((0, 1)) if o.multivector is None else o.multivector for o in outs]
        return np.array([[colbert_score(q, d) for d in vectors[n:]] for q in vectors[:n]])

    cosines = [
        float(np.min(np.sum(_unit(w.multivector) * _unit(g.multivector), axis=1)))
        for w, g in zip(want, got, strict=True)
        if w.multivector is not None and g.multivector is not None and len(w.multivector)
    ]
    agreement = precision.top_agreement(maxsim(want), maxsim(got))
    parts["multivector"] = {
        "min_cosine": round(min(cosines, default=1.0), 5),
        "agreement": round(agreement, 5),
        "measure": f"top-{precision.TOP} MaxSim neighbour agreement",
        "passed": min(cosines, default=1.0) >= precision.MIN_COSINE
        and agreement >= precision.MIN_AGREEMENT,
    }
    return {
        "min_cosine": min(p["min_cosine"] for p in parts.values()),
        "agreement": min(p["agreement"] for p in parts.values()),
        "measure": "the least of the dense, sparse and ColBERT outputs' agreements",
        "probes": len(want),
        "passed": all(p["passed"] for p in parts.values()),
        "outputs": parts,
    }


def _rows(outs: Sequence[M3Output], part: str) -> np.ndarray:
    return np.stack([np.asarray(getattr(o, part), dtype=np.float64) for o in outs])


def _terms(outs: Sequence[M3Output], ids: list[int]) -> np.ndarray:
    """The lexical weights as rows over the ids either reading gave."""
    column = {i: k for k, i in enumerate(ids)}
    matrix = np.zeros((len(outs), max(1, len(ids))))
    for row, o in enumerate(outs):
        if o.sparse is not None:
            for i, v in zip(o.sparse.indices, o.sparse.values, strict=True):
                matrix[row, column[int(i)]] = v
    return matrix
