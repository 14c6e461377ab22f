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
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import orjson

from openai_compat.encoding import EncodingFormat, as_matrix, encode_rows, truncate_dimensions
from openai_compat.engine.usage import TokenIds
from openai_compat.errors import BadRequest
from openai_compat.inference import EmbedResult, embed_texts
from openai_compat.registry import ModelEntry
from openai_compat.settings import Settings
from openai_compat.tokens import Names, TokenCounter

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
    contract has no per-request choice (TEI's /embed, Cohere's embed)."""
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


async def embed_by_setting(
    entry: ModelEntry, texts: list[str], settings: Settings, names: Names, *, prompt: str
) -> EmbedResult | None:
    """On routes whose contract has no per-request choice (TEI's /embed, Cohere's embed): the
    model's `long_input = "mean"` as an EmbedResult, or None where the setting does not apply
    (the route embeds as usual)."""
    if not mean_by_setting(entry, texts):
        return None
    result = await embed_long(entry, texts, settings, names, prompt=prompt)
    return EmbedResult(list(result.vectors), result.tokens)


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
        if mode == "chunks":
            rows = truncate_dimensions(
                np.stack([c.vector for c in result.chunks[i]]).astype("<f4"), dimensions
            )
            item["chunks"] = [
                {"embedding": e, "start": c.start, "end": c.end, "tokens": c.tokens}
                for e, c in zip(encode_rows(rows, fmt), result.chunks[i], strict=True)
            ]
        data.append(item)
    usage = {"prompt_tokens": result.tokens, "total_tokens": result.tokens}
    body = {"object": "list", "data": data, "model": model, "usage": usage}
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


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
    runs of `chunk_tokens` tokens. The document must fit the model's window."""
    from openai_compat.engine import adapter, late

    limit = _check_model(entry)
    counter = entry.counter
    assert counter is not None
    # A model a Ray Serve deployment runs answers these itself (ray_serve/remote.py).
    remote = getattr(entry.engine, "token_vectors", None)
    replica = None if remote is not None else adapter.replica_of(entry.engine)
    mode = entry.engine.pooling_mode if remote is not None else late.pooling_mode(replica)
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
    if spans is not None and len(spans) != len(texts):
        raise BadRequest(
            f"chunk_spans has {len(spans)} lists for {len(texts)} inputs.", param="chunk_spans"
        )
    shift = len(prompt)
    full = [prompt + t for t in texts]
    room = limit - counter.specials
    for i, (text, cut) in enumerate(
        zip(full, await counter.truncate_texts(full, room), strict=True)
    ):
        if len(cut) < len(text):  # refused from a prefix: no whole tokenization of a huge text
            param, label = names(i)
            raise BadRequest(
                f"{label}: more than {limit} tokens; late chunking needs the whole document in "
                f"one window of {limit} (use long_input 'mean' or 'chunks').",
                param=param,
                code="input_too_long",
            )
    encodings = await asyncio.to_thread(lambda: [counter.encode(t) for t in full])
    all_spans: list[list[tuple[int, int]]] = []
    for i, (text, enc) in enumerate(zip(texts, encodings, strict=True)):
        content = [k for k, special in enumerate(enc.special_tokens_mask) if not special]
        if spans is not None:
            chosen = [(int(a), int(b)) for a, b in spans[i]]
            if any(not 0 <= a < b <= len(text) for a, b in chosen) or not chosen:
                raise BadRequest(
                    f"chunk_spans[{i}] must be [start, end) character offsets within "
                    f"{names(i)[1]} ({len(text)} characters).",
                    param="chunk_spans",
                )
        else:
            size = max(1, chunk_tokens or 1)
            runs = [content[k : k + size] for k in range(0, len(content), size)]
            chosen = [(enc.offsets[r[0]][0] - shift, enc.offsets[r[-1]][1] - shift) for r in runs]
        all_spans.append(chosen)
    with entry.admit(len(texts), settings.max_queued_inputs):
        full = [prompt + t for t in texts]
        outputs = await (remote(full) if remote is not None else late.token_vectors(replica, full))
    vectors, chunks = [], []
    for text_spans, enc, (tokens, sentence) in zip(all_spans, encodings, outputs, strict=True):
        vectors.append((sentence / max(float(np.linalg.norm(sentence)), 1e-12)).astype(np.float32))
        row = []
        for a, b in text_spans:
            inside = [
                k
                for k, ((s, e), special) in enumerate(
                    zip(enc.offsets, enc.special_tokens_mask, strict=True)
                )
                if not special and e > s and s >= a + shift and e <= b + shift
            ]
            if not inside:
                raise BadRequest(
                    f"chunk span [{a}, {b}) holds no whole token.", param="chunk_spans"
                )
            mean = tokens[inside].astype(np.float64).mean(axis=0)
            mean /= max(float(np.linalg.norm(mean)), 1e-12)
            row.append(Chunk(a, b, len(inside), mean.astype(np.float32)))
        chunks.append(row)
    return LongResult(vectors, chunks, sum(len(e.ids) for e in encodings))
