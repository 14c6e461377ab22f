"""Texts longer than the model's window (`long_input` "mean" and "chunks").

Each long text is split into windows of the model's length (TokenCounter.windows: cut where a
word starts, consecutive windows sharing `window_overlap` tokens, the request's prompt in
every window); every window goes through the normal embedding path (batching, admission,
truncation, usage); "mean" combines a text's window vectors weighted by their token counts
and renormalises, "chunks" also returns each window's vector with its character offsets.
`usage` counts every token embedded, overlaps included: nothing is dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import orjson

from openai_compat.engine.usage import TokenIds
from openai_compat.formats.encoding import (
    EncodingFormat,
    as_matrix,
    encode_rows,
    response_id,
    truncate_dimensions,
)
from openai_compat.formats.tokens import Names, TokenCounter
from openai_compat.frame.settings import Settings
from openai_compat.ground.errors import BadRequest, WholeTextTooLong
from openai_compat.inference.embed import embed_texts
from openai_compat.models.registry import ModelEntry
from openai_compat.tenants.limits import reserve_tokens

Mode = Literal["mean", "chunks"]


@dataclass
class Chunk:
    start: int  # character offsets of the window in the input
    end: int
    tokens: int  # tokens the model saw for it (prompt and special tokens included)
    vector: np.ndarray


@dataclass
class LongResult:
    vectors: list[np.ndarray]  # one per input: its windows' token-weighted mean, unit length
    chunks: list[list[Chunk]]
    tokens: int


def windows(counter: TokenCounter, text: str, size: int, overlap: int) -> list[tuple[int, int]]:
    """Character spans of `text` holding at most `size` content tokens each, cut only where
    a word starts (re-tokenizing a span gives its tokens again), consecutive spans sharing
    about `overlap` tokens; one span (the whole text) when it fits. Blocking."""
    enc = counter.encode(text, add_special_tokens=False)
    offsets, words = enc.offsets, enc.word_ids
    n = len(offsets)
    if n <= size:
        return [(0, len(text))]
    starts = [i == 0 or words[i] != words[i - 1] for i in range(n)]

    def back_to_word_start(i: int, floor: int) -> int:
        j = i
        while j > floor and not starts[j]:
            j -= 1
        return j if j > floor else i  # a word longer than the window is cut inside

    spans, first = [], 0
    while True:
        end = n if first + size >= n else back_to_word_start(first + size, first)
        spans.append((int(offsets[first][0]), int(offsets[end - 1][1])))
        if end >= n:
            return spans
        after = back_to_word_start(max(end - overlap, first + 1), first)
        first = after if after > first else end


def mean_by_setting(entry: ModelEntry, texts: list[str]) -> bool:
    """Whether a model's `long_input = "mean"` setting applies to these texts on routes whose
    contract has no per-request choice (TEI's /embed, Cohere's embed, the tutorial's /embed)."""
    return (
        entry.config.long_input == "mean"
        and not (entry.sparse or entry.multivector)
        and bool(texts)
        and not isinstance(texts[0], TokenIds)
    )


def _too_many_windows(
    name: tuple[str, str], how_many: str, settings: Settings, size: int
) -> BadRequest:
    param, label = name
    return BadRequest(
        f"{label}: {how_many} {settings.max_windows_per_input} windows of {size} tokens, the "
        "most one input may have (max_windows_per_input).",
        param=param,
        code="too_many_windows",
    )


def _check_model(entry: ModelEntry) -> int:
    counter = entry.counter
    if counter is None or counter.max_length is None or entry.multivector or entry.sparse:
        raise BadRequest(
            f"Model {entry.name!r} cannot split long inputs into windows (it needs one vector "
            "per text and a tokenizer with a length limit); use long_input 'truncate' or "
            "'error'.",
            param="long_input",
            code="unsupported_parameter",
        )
    return counter.max_length


async def embed_long(
    entry: ModelEntry,
    texts: list[str],
    settings: Settings,
    names: Names,
    *,
    prompt: str,
) -> LongResult:
    limit = _check_model(entry)
    counter = entry.counter
    assert counter is not None

    prompt_tokens = len(counter.encode(prompt, add_special_tokens=False).ids) if prompt else 0
    size = limit - counter.specials - prompt_tokens
    if size < 1:
        raise BadRequest(
            f"The prompt leaves no room in model {entry.name!r}'s window of {limit} tokens.",
            param="long_input",
            code="unsupported_parameter",
        )
    # A text with more tokens than its windows can hold is refused after tokenizing only a
    # prefix of it (a body of megabytes costs no full tokenization to refuse).
    most = settings.max_windows_per_input * size
    cuts = await counter.truncate_texts(texts, most)
    for i, (text, cut) in enumerate(zip(texts, cuts, strict=True)):
        if len(cut) < len(text):
            raise _too_many_windows(names(i), "more than", settings, size)
    overlap = min(entry.config.window_overlap, size // 2)
    spans = await asyncio.to_thread(lambda: [windows(counter, t, size, overlap) for t in texts])
    for i, span in enumerate(spans):
        if len(span) > settings.max_windows_per_input:
            raise _too_many_windows(names(i), f"{len(span)}, more than", settings, size)
    total = sum(len(s) for s in spans)
    if total > settings.max_windows_per_request:
        raise BadRequest(
            f"The inputs make {total} windows, more than the {settings.max_windows_per_request} "
            "one request may have (max_windows_per_request).",
            param=names(0)[0],
            code="too_many_windows",
        )
    pieces = [text[a:b] for text, span in zip(texts, spans, strict=True) for a, b in span]
    owner = [i for i, span in enumerate(spans) for _ in span]

    def window_names(k: int) -> tuple[str, str]:
        param, label = names(owner[k])
        return param, f"{label} (window {k})"

    result = await embed_texts(entry, pieces, settings, window_names, prompt=prompt, truncate=True)
    kept = [getattr(v, "tokens", None) for v in result.vectors]  # the engine's own count
    counts: list[int] = [int(n) for n in kept if n is not None]
    if len(counts) < len(kept):  # not kept by this engine: count each window as the model saw it
        counts = await asyncio.to_thread(
            lambda: [min(len(counter.encode(prompt + p).ids), limit) for p in pieces]
        )
    matrix = as_matrix(result.vectors)
    vectors, chunks, k = [], [], 0
    for span in spans:
        rows = matrix[k : k + len(span)]
        weights = np.asarray(counts[k : k + len(span)], dtype=np.float64)[:, None]
        pooled = (rows.astype(np.float64) * weights).sum(axis=0)
        pooled /= max(float(np.linalg.norm(pooled)), 1e-12)
        vectors.append(pooled.astype(np.float32))
        chunks.append([Chunk(a, b, counts[k + j], rows[j]) for j, (a, b) in enumerate(span)])
        k += len(span)
    return LongResult(vectors, chunks, result.tokens)


def long_payload(
    result: LongResult,
    *,
    mode: Mode,
    fmt: EncodingFormat,
    dimensions: int | None,
    model: str,
) -> bytes:
    """OpenAI's embeddings body; with "chunks", each data[i] also has its windows."""
    pooled = encode_rows(truncate_dimensions(as_matrix(result.vectors), dimensions), fmt)
    data: list[dict[str, Any]] = []
    for i, vector in enumerate(pooled):
        item: dict[str, Any] = {"object": "embedding", "index": i, "embedding": vector}
        if mode == "chunks" and not result.chunks[i]:
            item["chunks"] = []  # a late-chunked input with no tokens of its own
        elif mode == "chunks":
            rows = truncate_dimensions(
                np.stack([c.vector for c in result.chunks[i]]).astype("<f4"), dimensions
            )
            item["chunks"] = [
                {"embedding": e, "start": c.start, "end": c.end, "tokens": c.tokens}
                for e, c in zip(encode_rows(rows, fmt), result.chunks[i], strict=True)
            ]
        data.append(item)
    usage = {"prompt_tokens": result.tokens, "total_tokens": result.tokens}
    body = {"id": response_id(), "object": "list", "data": data, "model": model, "usage": usage}
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


@dataclass
class _LatePlan:
    """One document's chunks before the forward pass: their character spans in the input
    and which of its tokens each pools (a chunks x tokens boolean matrix)."""

    spans: np.ndarray  # (chunks, 2) [start, end) in the input's characters
    inside: np.ndarray  # (chunks, tokens)


def _late_plan(
    enc: Any, text: str, shift: int, given: list[tuple[int, int]] | None, size: int | None
) -> _LatePlan | str:
    """A document's chunks: the spans given, or runs of `size` of its tokens. A chunk pools
    the non-special tokens lying wholly inside its span; the prompt's tokens (the first
    `shift` characters) are never part of one. Vectorised and blocking (run in a thread);
    the number of chunks is bounded before this runs. A string: what is wrong with a span."""
    offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
    starts, ends = offsets[:, 0] - shift, offsets[:, 1] - shift
    content = ~np.asarray(enc.special_tokens_mask, dtype=bool) & (ends > starts) & (starts >= 0)
    if given is None:
        idx = np.flatnonzero(content)
        # a run longer than the document is the document (and a size near 2**63 must not
        # overflow numpy's int64 arithmetic below)
        step = max(1, min(size or 1, len(idx)))
        last = np.minimum(np.arange(step - 1, len(idx) + step - 1, step), len(idx) - 1)
        spans = np.stack([starts[idx[::step]], ends[idx[last]]], axis=1).reshape(-1, 2)
    else:
        if any(not 0 <= x <= len(text) for span in given for x in span):
            return (
                f"must be [start, end) character offsets within the input ({len(text)} characters)"
            )
        spans = np.asarray(given, dtype=np.int64).reshape(-1, 2)
        if (
            not len(spans)
            or ((spans[:, 0] < 0) | (spans[:, 0] >= spans[:, 1]) | (spans[:, 1] > len(text))).any()
        ):
            return (
                f"must be [start, end) character offsets within the input ({len(text)} characters)"
            )
    inside = content[None, :] & (starts[None, :] >= spans[:, :1]) & (ends[None, :] <= spans[:, 1:])
    empty = np.flatnonzero(~inside.any(axis=1))
    if len(empty):
        a, b = (int(x) for x in spans[empty[0]])
        return f"has a span [{a}, {b}) that holds no whole token"
    return _LatePlan(spans, inside)


def _late_pool(plan: _LatePlan, tokens: np.ndarray) -> list[Chunk]:
    """Each chunk's token vectors averaged and normalised: one matrix product. Blocking."""
    counts = plan.inside.sum(axis=1)
    means = (plan.inside.astype(np.float64) @ tokens.astype(np.float64)) / counts[:, None]
    means /= np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)
    rows = means.astype(np.float32)
    return [
        Chunk(int(a), int(b), int(n), rows[j])
        for j, ((a, b), n) in enumerate(zip(plan.spans, counts, strict=True))
    ]


async def embed_late(
    entry: ModelEntry,
    texts: list[str],
    settings: Settings,
    names: Names,
    *,
    prompt: str,
    spans: list[list[tuple[int, int]]] | None,
    chunk_tokens: int | None,
) -> LongResult:
    """Late chunking (`long_input: "late"`): each text in one forward pass, then each span's
    token vectors mean-pooled and normalised; `spans` are character offsets per input, else
    runs of `chunk_tokens` tokens. The document must fit the model's window. Chunks count
    against max_windows_per_input and max_windows_per_request, checked before any work per
    chunk; the pooling is one matrix product per document, off the event loop."""
    limit = _check_model(entry)
    counter = entry.counter
    assert counter is not None
    mode = entry.engine.pooling_mode()
    if mode != "mean":
        raise BadRequest(
            f"Late chunking averages token vectors, which matches only a mean-pooling model; "
            f"{entry.name!r} pools with {mode or 'no pooling module'!r}.",
            param="long_input",
            code="unsupported_parameter",
        )
    if spans is None and chunk_tokens is None:
        raise BadRequest(
            "long_input 'late' needs chunk_spans (character offsets per input) or chunk_tokens.",
            param="chunk_spans",
        )
    if spans is not None:
        if len(spans) != len(texts):
            raise BadRequest(
                f"chunk_spans has {len(spans)} lists for {len(texts)} inputs.", param="chunk_spans"
            )
        _check_chunk_counts(
            [len(s) for s in spans], settings, "chunk_spans", lambda i: f"chunk_spans[{i}]"
        )
    shift = len(prompt)
    full = [prompt + t for t in texts]
    room = limit - counter.specials
    for i, (text, cut) in enumerate(
        zip(full, await counter.truncate_texts(full, room), strict=True)
    ):
        if len(cut) < len(text):  # refused from a prefix: no whole tokenization of a huge text
            raise WholeTextTooLong(
                names(i),
                None,
                limit,
                "use long_input 'mean' or 'chunks': late chunking needs the whole document in "
                "one window.",
            )

    def plan() -> tuple[list[Any], list[_LatePlan | str]]:
        encodings = [counter.encode(t) for t in full]
        given = spans if spans is not None else [None] * len(texts)
        return encodings, [
            _late_plan(e, t, shift, g, chunk_tokens)
            for e, t, g in zip(encodings, texts, given, strict=True)
        ]

    encodings, plans = await asyncio.to_thread(plan)
    for i, p in enumerate(plans):
        if isinstance(p, str):
            raise BadRequest(f"chunk_spans[{i}] {p}.", param="chunk_spans")
    made = [len(p.spans) for p in plans if isinstance(p, _LatePlan)]
    if spans is None:
        _check_chunk_counts(
            made, settings, "chunk_tokens", lambda i: f"{names(i)[1]} in chunks of {chunk_tokens}"
        )
    with entry.admit(len(texts), settings.max_queued_inputs):
        await reserve_tokens(sum(len(e.ids) for e in encodings))  # usage, before the model
        if entry.late is None:  # closed with the model (models/loading.py)
            entry.late = entry.engine.late_runner()
        outputs = await entry.late.token_vectors(full)

    def pool() -> LongResult:
        vectors, chunks = [], []
        for p, (tokens, sentence) in zip(plans, outputs, strict=True):
            assert isinstance(p, _LatePlan)
            norm = max(float(np.linalg.norm(sentence)), 1e-12)
            vectors.append((sentence / norm).astype(np.float32))
            chunks.append(_late_pool(p, tokens))
        return LongResult(vectors, chunks, sum(len(e.ids) for e in encodings))

    return await asyncio.to_thread(pool)


def _check_chunk_counts(
    counts: list[int], settings: Settings, param: str, label: Callable[[int], str]
) -> None:
    """Late chunks count as windows: max_windows_per_input each, max_windows_per_request in
    all (a chunk costs a pooled vector and its share of the answer)."""
    for i, n in enumerate(counts):
        if n > settings.max_windows_per_input:
            raise BadRequest(
                f"{label(i)} makes {n} chunks, more than the {settings.max_windows_per_input} "
                "one input may have (max_windows_per_input).",
                param=param,
                code="too_many_windows",
            )
    if sum(counts) > settings.max_windows_per_request:
        raise BadRequest(
            f"The inputs make {sum(counts)} chunks, more than the "
            f"{settings.max_windows_per_request} one request may have (max_windows_per_request).",
            param=param,
            code="too_many_windows",
        )
