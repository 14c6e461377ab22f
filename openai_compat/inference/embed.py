"""What the routes share: turning requests into engine calls, and engine errors into API errors.

The /v1 routes and the tutorial's routes both call these functions: one implementation each.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from openai_compat.engine.priority import counted_by_engine
from openai_compat.engine.refusals import EngineStopped, InputRefused, OutputTooLarge
from openai_compat.engine.usage import TokenIds, engine_token_count, raw_vectors
from openai_compat.formats.encoding import as_matrix
from openai_compat.formats.prompts import mode_of
from openai_compat.formats.sparse import check_finite as check_sparse_finite
from openai_compat.formats.tokens import Names, input_names
from openai_compat.frame.settings import Settings
from openai_compat.ground.errors import BadRequest, InputTooLong, ServiceUnavailable
from openai_compat.models.registry import ModelEntry
from openai_compat.tenants.limits import counts_first, reserve_tokens

# Token ids beyond this many per request are decoded in a worker thread, off the event loop.
_INLINE_IDS = 8192
# What one id weighs when deciding whether decoding it is long work (as characters of text).
_CHARS_PER_ID = 4


@contextmanager
def engine_errors() -> Iterator[None]:
    """An engine's refusals as API errors: an engine stopped under a request (its model
    unloaded, the server stopping) -> 503; a multi-vector answer over its bound -> 400;
    inputs the model's own preparation refused -> 400; anything else stays a 500."""
    try:
        yield
    except EngineStopped as exc:
        raise ServiceUnavailable(str(exc), headers={"Retry-After": "1"}) from exc
    except OutputTooLarge as exc:
        raise BadRequest(str(exc), param="input", code="output_too_large") from exc
    except InputRefused as exc:
        raise BadRequest(str(exc), param="input", code="invalid_input") from exc


def check_count(n: int, limit: int, param: str, what: str = "inputs") -> None:
    if n == 0:
        raise BadRequest(f"'{param}' must not be empty.", param=param, code="empty_input")
    if n > limit:
        raise BadRequest(
            f"Too many {what}: at most {limit} per request, got {n}.",
            param=param,
            code="too_many_inputs",
        )


async def texts_from_input(
    raw: str | Sequence[Any], entry: ModelEntry, settings: Settings, param: str = "input"
) -> list[str]:
    """OpenAI's four input forms -> texts, token ids decoded as the model is configured.

    One array of token ids is ONE input (as OpenAI reads it), however many ids it holds.
    """
    if isinstance(raw, str):
        return [raw]
    if len(raw) == 0:
        check_count(0, settings.max_inputs_per_request, param)
    first = raw[0]
    if isinstance(first, str):
        check_count(len(raw), settings.max_inputs_per_request, param)
        return list(raw)
    single = isinstance(raw, np.ndarray) or isinstance(first, int | np.integer)
    batches: Sequence[Any] = [raw] if single else raw
    check_count(len(batches), settings.max_inputs_per_request, param)
    for i, ids in enumerate(batches):  # OpenAI's schema: each token array has minItems 1
        if len(ids) == 0:
            raise BadRequest(
                f"'{param}[{i}]' is an empty array of token ids; send at least one id.",
                param=param,
                code="empty_input",
            )
    decoder = entry.token_decoder
    if decoder is None:
        raise BadRequest(
            f"Model {entry.name!r} does not accept token ids; send text.",
            param="input",
            code="token_ids_not_supported",
        )
    if sum(len(b) for b in batches) <= _INLINE_IDS and getattr(decoder, "ready", True):
        texts = list(decoder.decode(batches))
    else:
        texts = list(await asyncio.to_thread(decoder.decode, batches))
    if entry.exact_token_ids:  # the model's own ids: embedded as sent, not re-tokenized
        return [TokenIds(text, ids) for text, ids in zip(texts, batches, strict=True)]
    return texts


def truncate_for(entry: ModelEntry, settings: Settings, default: bool = True) -> bool:
    """The model's truncate setting, else the server's, else the route's API default."""
    if entry.config.truncate is not None:
        return entry.config.truncate
    return default if settings.truncate is None else settings.truncate


@dataclass
class EmbedResult:
    vectors: list[Any]
    tokens: int
    media: list[dict[str, Any]] | None = None  # for images: size, format, bit depth


async def embed_texts(
    entry: ModelEntry,
    texts: Sequence[str],
    settings: Settings,
    names: Names = input_names,
    *,
    prompt: str = "",
    truncate: bool | None = None,
    mode: str | None = None,
    outputs: frozenset[str] | None = None,
) -> EmbedResult:
    """Embed texts, each after `prompt`; usage counts the model's own tokens (prompt
    included) after truncation. `truncate` overrides the model's setting. `mode`: the side
    of a model with query and document modes (else the chosen prompt's, prompts.Prompt).
    `outputs`: what a BGE-M3 model is asked for (a bge_m3.M3Output per input).

    Where the engine reports each embedding's tokens (entry.engine_counts) that count is
    used; otherwise the model's tokenizer counts beside the engine. A sparse model's vectors
    are SparseVectors.
    """
    mode = mode or mode_of(prompt)
    result = await _embed(entry, texts, settings, names, prompt, truncate, mode, outputs)
    if entry.sparse:  # SparseVectors: a NaN weight must not reach a client as a number
        check_sparse_finite(result.vectors)
    elif outputs and "sparse" in outputs:
        check_sparse_finite([v.sparse for v in result.vectors])
    return result


async def _embed(
    entry: ModelEntry,
    texts: Sequence[str],
    settings: Settings,
    names: Names,
    prompt: str,
    truncate: bool | None,
    mode: str | None,
    outputs: frozenset[str] | None,
) -> EmbedResult:
    truncate = truncate_for(entry, settings) if truncate is None else truncate
    if texts and isinstance(texts[0], TokenIds):
        if entry.modes:  # the sides' markers and expansion are the model's preprocessing
            raise BadRequest(
                f"Model {entry.name!r} embeds queries and documents apart, from text: send "
                "text, not token ids.",
                param="input",
                code="unsupported_input",
            )
        return await _embed_ids(entry, texts, settings, names, truncate, outputs)  # as sent
    # a VLM's prompt is a system message beside the text (the library's place for it)
    system = str(prompt) if prompt and entry.messages else None
    if prompt and system is None:
        texts = [prompt + t for t in texts]
    counter = entry.counter
    with entry.admit(len(texts), settings.max_queued_inputs), engine_errors():
        if counter is not None and (not truncate or counts_first() or counter.needs_cutting(texts)):
            # Measure first: over-long input is refused before it costs engine time, huge
            # texts reach the engine cut a few tokens past the model's limit, and a key's
            # tokens-per-minute is charged before the model runs (tenants/limits.py).
            tokens, prepared = await counter.prepare(texts, truncate=truncate, names=names)
            if entry.messages:  # its chat template is counted by the engine as it prepares
                with counted_by_engine():
                    vectors, usage = await entry.embed(prepared, mode, system)
            else:
                await reserve_tokens(tokens)
                vectors, usage = await entry.embed(prepared, mode, system, outputs)
            exact = (settings.count_tokens or not truncate) and not entry.messages
            return EmbedResult(vectors, tokens if exact else int(usage))
        if counter is None or not settings.count_tokens or entry.engine_counts or entry.messages:
            vectors, usage = await entry.embed(list(texts), mode, system, outputs)
            counted = engine_token_count(vectors) if settings.count_tokens else None
            return EmbedResult(vectors, int(usage) if counted is None else counted)
        tokens, (vectors, _) = await asyncio.gather(
            counter.usage(texts, truncate=True), entry.embed(list(texts), mode, None, outputs)
        )
        return EmbedResult(vectors, tokens)


async def _embed_ids(
    entry: ModelEntry,
    texts: Sequence[str],
    settings: Settings,
    names: Names,
    truncate: bool,
    outputs: frozenset[str] | None = None,
) -> EmbedResult:
    """Inputs given as the model's own ids: usage is their count (after truncation to the
    model's limit, or a 400 without truncation), the vectors those ids' exactly."""
    inputs = [t for t in texts if isinstance(t, TokenIds)]
    limit = entry.max_length
    if limit is not None:
        for i, t in enumerate(inputs):
            if len(t.ids) > limit:
                if not truncate:
                    raise InputTooLong(names(i), len(t.ids), limit)
                inputs[i] = TokenIds(t, t.ids[:limit])
    with entry.admit(len(inputs), settings.max_queued_inputs), engine_errors():
        await reserve_tokens(sum(len(t.ids) for t in inputs))  # once the queue took them
        vectors, _ = await entry.embed(list(inputs), None, None, outputs)
    return EmbedResult(vectors, sum(len(t.ids) for t in inputs))


def check_raw_output(entry: ModelEntry, param: str = "normalize") -> None:
    """Un-normalised vectors (TEI's normalize=false) need the norms the engine keeps."""
    if not entry.raw_output:
        raise BadRequest(
            f"Model {entry.name!r} returns only L2-normalised vectors on this backend; "
            f"leave '{param}' true.",
            param=param,
            code="unsupported_parameter",
        )


def raw_matrix(vectors: Sequence[Any]) -> np.ndarray:
    """The model's own output (what sentence-transformers' encode(normalize_embeddings=False)
    gives) for vectors of a model with raw_output."""
    raw = raw_vectors(vectors)
    if raw is None:  # check_raw_output ran first; a replica without norms is a server bug
        raise RuntimeError("the engine returned vectors without their norms")
    return as_matrix(raw)


async def fit_texts(
    entry: ModelEntry,
    texts: Sequence[str],
    *,
    prompt: str,
    keep: Literal["start", "end"] | None,
    max_tokens: int | None,
    names: Names,
) -> list[str] | None:
    """Texts already fitted to `max_tokens` (and the model's limit) the way Cohere's
    `truncate` asks: keep="start" cuts the end, "end" the beginning, None refuses (400).
    None when the model's own truncation does exactly what was asked (the fast path)."""
    counter = entry.counter
    if counter is None or counter.max_length is None:
        if max_tokens is not None:
            raise BadRequest(
                f"Model {entry.name!r} has no tokenizer to count max_tokens with.",
                param="max_tokens",
                code="unsupported_parameter",
            )
        return None
    if max_tokens is not None and max_tokens < 1:
        raise BadRequest("'max_tokens' must be at least 1.", param="max_tokens")
    limit = min(max_tokens or counter.max_length, counter.max_length)
    if keep == "start" and limit == counter.max_length:
        return None
    return await counter.fit(texts, prompt=prompt, limit=limit, keep=keep, names=names)


async def embed_fitted(
    entry: ModelEntry,
    texts: Sequence[str],
    settings: Settings,
    names: Names,
    *,
    prompt: str,
    keep: Literal["start", "end"] | None,
    max_tokens: int | None = None,
    outputs: frozenset[str] | None = None,
) -> EmbedResult:
    """embed_texts with the truncation a client chose: which part of an over-long text
    survives (keep="start": the model's own truncation; "end"; None: refuse it), and an
    optional per-input token cap. The prompt is never cut."""
    fitted = await fit_texts(
        entry, texts, prompt=prompt, keep=keep, max_tokens=max_tokens, names=names
    )
    if fitted is not None:  # the prompt is inside the fitted texts; its side is not
        return await embed_texts(
            entry, fitted, settings, names, truncate=True, mode=mode_of(prompt), outputs=outputs
        )
    return await embed_texts(
        entry, texts, settings, names, prompt=prompt, truncate=keep is not None, outputs=outputs
    )


def check_dimensions(dimensions: int | None, entry: ModelEntry, param: str = "dimensions") -> None:
    """A size the model can be cut to: 1 to its own, and where the configuration declares
    its Matryoshka sizes, one of those (or the full size)."""
    if dimensions is None:
        return
    size = entry.dimensions
    if dimensions < 1 or (size is not None and dimensions > size):
        raise BadRequest(
            f"'{param}' must be between 1 and {size} for model {entry.name!r}, got {dimensions}.",
            param=param,
            code="invalid_dimensions",
        )
    declared = entry.config.matryoshka_dimensions
    if declared and dimensions != size and dimensions not in declared:
        sizes = ", ".join(map(str, sorted({*declared, *([size] if size else [])}, reverse=True)))
        raise BadRequest(
            f"Model {entry.name!r} was trained for '{param}' of {sizes} only; got {dimensions}.",
            param=param,
            code="invalid_dimensions",
        )


async def tokenize_texts(
    entry: ModelEntry,
    texts: Sequence[str],
    settings: Settings,
    *,
    add_special_tokens: bool,
    param: str,
) -> list[list[tuple[int, str, bool, tuple[int, int]]]]:
    """The tokenize routes (TEI's, vLLM's): at most max_tokenize_chars, counted in the
    model's admission like any other work, split off the event loop when long."""
    chars = sum(len(t) for t in texts)
    if chars > settings.max_tokenize_chars:
        raise BadRequest(
            f"'{param}' holds {chars} characters; /tokenize takes at most "
            f"{settings.max_tokenize_chars} (max_tokenize_chars).",
            param=param,
            code="input_too_long",
        )
    counter = entry.tokenizer(param)
    split = functools.partial(counter.tokens, add_special_tokens=add_special_tokens)
    with entry.admit(len(texts), settings.max_queued_inputs):
        return await counter.offload(chars, split, texts)


async def detokenize_ids(
    entry: ModelEntry,
    batches: Sequence[Sequence[int]],
    settings: Settings,
    *,
    skip_special_tokens: bool,
    param: str,
) -> list[str]:
    """The decode routes (TEI's /decode, vLLM's /detokenize), admitted and off the loop."""
    counter = entry.tokenizer(param)
    decode = functools.partial(counter.decode, skip_special_tokens=skip_special_tokens, param=param)
    ids = sum(len(b) for b in batches)
    with entry.admit(len(batches), settings.max_queued_inputs):
        return await counter.offload(ids * _CHARS_PER_ID, decode, batches)
