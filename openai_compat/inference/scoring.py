"""Scoring requests -> engine calls: rerank (cross-encoders, embedding cosine, sparse dot
product) and classify (probabilities or raw logits), and a score back on the model's scale.

The Cohere, TEI, infinity and tutorial routes all call these: one implementation each. The
embedding path they share with /v1/embeddings is embed.py.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from openai_compat.formats.tokens import Names, field_names
from openai_compat.frame.settings import Settings
from openai_compat.ground.errors import BadRequest, InputTooLong, ModelOutputError
from openai_compat.inference.embed import (
    EmbedResult,
    check_count,
    embed_texts,
    engine_errors,
    truncate_for,
)
from openai_compat.inference.hybrid import check_score_mode, hybrid_scores
from openai_compat.models.registry import ModelEntry
from openai_compat.tenants.limits import counts_first, reserve_tokens

# ---------------------------------------------------------------- rerank


@dataclass
class RankedDocument:
    index: int
    score: float


@dataclass
class RerankResult:
    ranked: list[RankedDocument]
    tokens: int


def document_texts(
    documents: Sequence[str | dict[str, Any]], rank_fields: Sequence[str] | None
) -> list[str]:
    """Cohere's document forms -> the text each is ranked on."""
    texts = []
    for i, doc in enumerate(documents):
        if isinstance(doc, str):
            texts.append(doc)
            continue
        fields = list(rank_fields) if rank_fields else ["text"]
        missing = [f for f in fields if f not in doc]
        if missing:
            hint = "named in rank_fields" if rank_fields else "(or name fields in rank_fields)"
            raise BadRequest(
                f"documents[{i}] has no field {missing[0]!r} {hint}.",
                param=f"documents[{i}]",
                code="missing_document_field",
            )
        if len(fields) == 1:
            texts.append(_field_text(doc[fields[0]]))
        else:
            # Cohere ranks structured documents as "key: value" lines, in rank_fields order.
            texts.append("\n".join(f"{f}: {_field_text(doc[f])}" for f in fields))
    return texts


def _field_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    import orjson

    return orjson.dumps(value).decode()


def check_top_n(top_n: int | None, param: str = "top_n") -> None:
    if top_n is not None and top_n < 1:
        raise BadRequest(f"'{param}' must be at least 1, got {top_n}.", param=param)


async def rerank_texts(
    entry: ModelEntry,
    query: str,
    docs: list[str],
    settings: Settings,
    *,
    max_tokens_per_doc: int | None = None,
    docs_param: str = "documents",
    score_mode: str | None = None,
) -> RerankResult:
    """Score every document against the query: best first, scores in [0, 1].

    A cross-encoder ranks with its own sigmoid scores. A model that can only embed ranks by the
    cosine similarity of query and document embeddings, mapped to [0, 1] as (cos + 1) / 2.
    A sparse (SPLADE) model ranks by the dot product of the sparse vectors (>= 0, unbounded), a
    multi-vector (ColBERT-style) one by MaxSim over its token vectors (unbounded). BGE-M3 by
    its `score_mode` (hybrid.py).
    """
    score_mode = check_score_mode(entry, score_mode)
    check_count(len(docs), settings.max_rerank_documents, docs_param, "documents")
    if max_tokens_per_doc is not None:
        if max_tokens_per_doc < 1:
            raise BadRequest(
                f"'max_tokens_per_doc' must be at least 1, got {max_tokens_per_doc}.",
                param="max_tokens_per_doc",
            )
        # A cap at or above the model's own maximum changes nothing (and huge values would
        # overflow the tokenizer's limits).
        cap_matters = entry.max_length is None or max_tokens_per_doc < entry.max_length
        if entry.counter is not None and cap_matters and max_tokens_per_doc < 2**31:
            docs = await entry.counter.truncate_texts(docs, max_tokens_per_doc)
    if entry.outputs:
        names = _rerank_names(docs_param)
        scores, tokens = await hybrid_scores(entry, query, docs, settings, names, score_mode)
        return _ranked(entry, scores, tokens)
    if entry.cosine_rerank:
        return await _cosine_rerank(entry, query, docs, settings, docs_param)
    if entry.multivector:
        return await _maxsim_rerank(entry, query, docs, settings, docs_param)
    if entry.sparse:
        return await _sparse_rerank(entry, query, docs, settings, docs_param)
    counter = entry.counter
    with entry.admit(len(docs), settings.max_queued_inputs), engine_errors():
        if counter is None:
            results, usage = await entry.engine.rerank(query=query, docs=docs)
            tokens = int(usage)
        else:
            query = await _fit_query(entry, query, truncate_for(entry, settings))
            pairs = await _cut_documents(entry, query, docs)
            if not truncate_for(entry, settings):
                await _refuse_long_pairs(entry, query, docs, pairs, docs_param)
            if counts_first():  # a key's tpm: the pairs' tokens are taken before they run
                tokens = await counter.pair_usage(query, pairs)
                await reserve_tokens(tokens)
                results, _ = await entry.engine.rerank(query=query, docs=pairs)
            elif entry.engine_counts:  # the engine counts the pairs it tokenizes: no 2nd pass
                results, tokens = await entry.engine.rerank(query=query, docs=pairs)
            else:
                tokens, (results, _) = await asyncio.gather(
                    counter.pair_usage(query, pairs), entry.engine.rerank(query=query, docs=pairs)
                )
    ranked = [RankedDocument(r.index, float(r.relevance_score)) for r in results]
    finite_scores(entry, [r.score for r in ranked])
    ranked.sort(key=lambda r: (-r.score, r.index))
    return RerankResult(ranked, tokens)


def _query_name(i: int) -> tuple[str, str]:
    return ("query", "query")


async def _fit_query(entry: ModelEntry, query: str, truncate: bool) -> str:
    """The query before a cross-encoder pairs it with every document: refused when over the
    model's limit and truncation is off; else cut a few tokens past the limit (the model
    truncates the pair itself, and keeps the same start), so a huge query costs once, not
    once per document."""
    counter = entry.counter
    if counter is None or entry.max_length is None:
        return query
    if truncate and not counter.needs_cutting([query]):
        return query
    _, (fitted,) = await counter.prepare([query], truncate=truncate, names=_query_name)
    return fitted


async def _cut_documents(entry: ModelEntry, query: str, docs: list[str]) -> list[str]:
    """Huge documents cut a few tokens past the limit before the cross-encoder sees them.

    Pairs are truncated longest-first: while the query is within the limit, a document cut
    to more tokens than the limit stays the longer part, so the tokens the model keeps are
    the same as for the whole document.
    """
    counter, limit = entry.counter, entry.max_length
    if counter is None or limit is None or not counter.needs_cutting(docs):
        return docs
    (query_tokens,) = await counter.lengths([query])
    if query_tokens > limit:
        return docs
    _, cut = await counter.prepare_lengths(docs)
    return cut


async def _refuse_long_pairs(
    entry: ModelEntry, query: str, docs: list[str], pairs: list[str], param: str
) -> None:
    counter, limit = entry.counter, entry.max_length
    if counter is None or limit is None:
        return
    lengths = await counter.pair_lengths(query, pairs)
    too_long = np.flatnonzero(lengths > limit)
    if too_long.size:
        i = int(too_long[0])
        full = await asyncio.to_thread(counter.pair_full_length, query, docs[i])
        raise InputTooLong((param, f"{param}[{i}]"), full, limit)


async def _cosine_rerank(
    entry: ModelEntry, query: str, docs: list[str], settings: Settings, docs_param: str
) -> RerankResult:
    result = await embed_texts(entry, [query, *docs], settings, _rerank_names(docs_param))
    matrix = np.stack(result.vectors).astype(np.float32)
    finite_scores(entry, matrix)
    norms = np.linalg.norm(matrix, axis=1).astype(np.float64)
    # a zero vector (an empty text on a test engine) has cosine 0 with anything: the guard
    # is on the product, whose factors' floors would underflow to 0 / 0 (found by fuzzing)
    denominators = np.maximum(norms[1:] * norms[0], np.finfo(np.float64).tiny)
    cos = (matrix[1:] @ matrix[0]).astype(np.float64) / denominators
    scores = np.clip((cos + 1.0) / 2.0, 0.0, 1.0)
    order = np.lexsort((np.arange(len(docs)), -scores))
    ranked = [RankedDocument(int(i), float(scores[i])) for i in order]
    return RerankResult(ranked, result.tokens)


async def _maxsim_rerank(
    entry: ModelEntry, query: str, docs: list[str], settings: Settings, docs_param: str
) -> RerankResult:
    """A multi-vector (ColBERT-style) model: late interaction. A document's score is the sum
    over the query's token vectors of the largest dot product with the document's token
    vectors (MaxSim), on the vectors the model serves; >= 0 is not implied (unbounded). A
    model with query and document modes embeds the query as encode_query does and the
    documents as encode_document does (each side's prompt), as its own `similarity` scores."""
    if entry.modes:
        names = _rerank_names(docs_param)
        side = entry.prompts.choose
        asked, given = await asyncio.gather(
            embed_texts(
                entry, [query], settings, names, prompt=side(entry.name, input_type="query")
            ),
            embed_texts(
                entry,
                docs,
                settings,
                lambda i: names(i + 1),
                prompt=side(entry.name, input_type="document"),
            ),
        )
        result = EmbedResult([*asked.vectors, *given.vectors], asked.tokens + given.tokens)
    else:
        result = await embed_texts(entry, [query, *docs], settings, _rerank_names(docs_param))
    q, *matrices = (np.asarray(v, dtype=np.float32) for v in result.vectors)
    scores = np.asarray([float((q @ d.T).max(axis=1).sum()) for d in matrices])
    return _ranked(entry, scores, result.tokens)


def _ranked(entry: ModelEntry, scores: np.ndarray, tokens: int) -> RerankResult:
    """Documents best first (ties: the earlier first), every score a real number."""
    finite_scores(entry, scores)
    order = np.lexsort((np.arange(len(scores)), -scores))
    return RerankResult([RankedDocument(int(i), float(scores[i])) for i in order], tokens)


def _rerank_names(docs_param: str) -> Names:
    def names(i: int) -> tuple[str, str]:
        return ("query", "query") if i == 0 else (docs_param, f"{docs_param}[{i - 1}]")

    return names


async def _sparse_rerank(
    entry: ModelEntry, query: str, docs: list[str], settings: Settings, docs_param: str
) -> RerankResult:
    result = await embed_texts(entry, [query, *docs], settings, _rerank_names(docs_param))
    q, *vectors = result.vectors
    return _ranked(entry, np.asarray([q.dot(v) for v in vectors]), result.tokens)


def finite_scores(entry: ModelEntry, values: Any) -> None:
    """A broken model (an fp16 overflow, say) gives NaN or inf: never send those as numbers."""
    if not np.isfinite(np.asarray(values, dtype=np.float64)).all():
        raise ModelOutputError(
            f"Model {entry.name!r} produced non-finite numbers (NaN or infinity) for this "
            "request; its weights or dtype may be broken."
        )


# ---------------------------------------------------------------- classify


@dataclass
class ClassifyResult:
    labels: list[list[tuple[str, float]]]  # per input, best first
    tokens: int


async def classify_texts(
    entry: ModelEntry,
    texts: list[str],
    settings: Settings,
    *,
    raw_scores: bool = False,
    param: str = "input",
) -> ClassifyResult:
    """Label distributions, best first; raw_scores gives the model's logits."""
    check_count(len(texts), settings.max_inputs_per_request, param)
    truncate = truncate_for(entry, settings)
    tokens: int | None = None
    counter = entry.counter
    prepared = texts
    with entry.admit(len(texts), settings.max_queued_inputs), engine_errors():
        if counter is not None and (not truncate or counts_first() or counter.needs_cutting(texts)):
            # Refuse over-long input before spending engine time on it; cut huge texts; take
            # a key's tokens per minute before the model runs (once the queue took them).
            names = field_names(param)
            tokens, prepared = await counter.prepare(texts, truncate=truncate, names=names)
            await reserve_tokens(tokens)
        if raw_scores:
            if entry.logits is None:
                raise BadRequest(
                    f"Model {entry.name!r} cannot return raw scores.", param="raw_scores"
                )
            raw = await entry.logits.logits(prepared)
            engine_usage = 0
        else:
            raw, engine_usage = await entry.engine.classify(sentences=prepared)
    if tokens is None:
        counted = entry.engine_counts and not raw_scores  # the engine's own count of them
        if counter is None or counted:
            tokens = int(engine_usage)
        else:
            tokens = await counter.usage(texts, truncate=True)
    labels = [
        sorted(((str(d["label"]), float(d["score"])) for d in item), key=lambda p: -p[1])
        for item in raw
    ]
    finite_scores(entry, [score for item in labels for _, score in item])
    return ClassifyResult(labels, tokens)


async def classify_pairs(
    entry: ModelEntry,
    inputs: Sequence[str | tuple[str, str]],
    settings: Settings,
    *,
    raw_scores: bool,
) -> tuple[list[list[tuple[str, float]]], int]:
    """Label distributions for texts and (text, text) pairs, best first. Pairs run beside the
    batcher (infinity-emb classifies single texts only), through the model's own pipeline."""
    if entry.logits is None:
        raise BadRequest(
            f"Model {entry.name!r} cannot classify text pairs.",
            param="inputs",
            code="unsupported_input",
        )
    counter = entry.counter
    tokens: int | None = None
    with entry.admit(len(inputs), settings.max_queued_inputs), engine_errors():
        if counter is not None and counts_first():  # a key's tpm: taken before they run
            tokens = await counter.pairs_usage(inputs)
            await reserve_tokens(tokens)
        rows = await entry.logits.logits(
            [x if isinstance(x, str) else {"text": x[0], "text_pair": x[1]} for x in inputs]
        )
    labels = []
    for row in rows:
        names = [str(d["label"]) for d in row]
        values = np.asarray([float(d["score"]) for d in row], dtype=np.float64)
        if not raw_scores:
            values = np.exp(values - values.max())
            values /= values.sum()
        labels.append(sorted(zip(names, values.tolist(), strict=True), key=lambda p: -p[1]))
    finite_scores(entry, [score for item in labels for _, score in item])
    if tokens is None:
        tokens = await counter.pairs_usage(inputs) if counter is not None else 0
    return labels, tokens


def raw_score(entry: ModelEntry, score: float) -> float:
    """A rerank score back to the model's own scale: the logit for a cross-encoder (whose
    score is its sigmoid), the cosine for an embedding model (score = (cos + 1) / 2)."""
    if entry.cosine_rerank:
        return 2.0 * score - 1.0
    if entry.sparse or entry.outputs:  # the dot product itself; BGE-M3's compute_score
        return score
    # the scores are float64 sigmoids (engine/native.py): invertible to |logit| ~ 36
    score = min(max(score, math.ulp(0.0)), math.nextafter(1.0, 0.0))
    return math.log(score / (1.0 - score))
