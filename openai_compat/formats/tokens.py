"""Tokens: counting, cutting and decoding with each model's own tokenizer (token ids sent
by clients are decoded in token_ids.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

import numpy as np

from openai_compat.formats.token_ids import ModelTokenIdDecoder
from openai_compat.ground.errors import InputTooLong

# Below this many characters tokenizing inline is cheaper than a hop to a worker thread; above
# it, tokenizing on the event loop stalls it (the tokenizer releases the GIL and the loop then
# waits to get it back from the engine threads), measured at ~8% of throughput at 16 inputs.
_INLINE_CHARS = 512


T = TypeVar("T")

# Which request field the i-th text came from, as the client named it: (param, label).
Names = Callable[[int], tuple[str, str]]


def field_names(param: str) -> Names:
    """Texts that are the items of one list field: ('documents', 'documents[3]')."""
    return lambda i: (param, f"{param}[{i}]")


input_names = field_names("input")


# Huge texts are never tokenised whole: only a prefix long enough to hold the tokens that
# matter, found by growing a character window from this many characters per token. (Whole
# tokenisations of megabyte texts hold the GIL for 100+ ms when their millions of token
# strings are freed, and the engine would tokenise them whole a second time.)
_CHARS_PER_TOKEN = 16
# A text cut for the engine keeps this many tokens past the model's limit, so the model's own
# truncation still decides where it ends: the tokens it keeps are exactly the full text's.
_GUARD = 8
# Error messages count huge texts in pieces of about this many characters.
_COUNT_PIECE = 65536


def _before_last_word(word_ids: Sequence[int | None]) -> int:
    """Index of the first token of the last word: tokens before it are complete words."""
    end = len(word_ids)
    last = word_ids[-1] if end else None
    while end and word_ids[end - 1] == last:
        end -= 1
    return end


def _after_first_word(word_ids: Sequence[int | None]) -> int:
    """Index of the first token after the first word: tokens from there are complete words."""
    first = word_ids[0] if word_ids else None
    start = 0
    while start < len(word_ids) and word_ids[start] == first:
        start += 1
    return start


class TokenCounter:
    """Counts tokens as the model sees them (special tokens included, after truncation)."""

    def __init__(self, tokenizer: Any, max_length: int | None) -> None:
        from tokenizers import Tokenizer

        self.max_length = max_length
        # A private copy: truncation settings are per-object and the engine uses the original.
        self._tok = Tokenizer.from_str(tokenizer.to_str())
        self._tok.no_padding()
        self._encode_batch = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        # An untruncated twin, built once (not per request): for cutting texts at a token
        # and for the exact length in error messages.
        self._plain = Tokenizer.from_str(self._tok.to_str())
        self._plain.no_truncation()
        self.specials = int(self._plain.num_special_tokens_to_add(False))  # [CLS], [SEP]: 2
        self._pair_specials = self._plain.num_special_tokens_to_add(True)
        self._decoder = ModelTokenIdDecoder(self._plain)
        if max_length:
            # One past the limit: enough to tell "too long".
            self._tok.enable_truncation(max_length + 1)
        else:
            self._tok.no_truncation()
        # Texts longer than this many characters may be cut before the engine sees them.
        self.cut_chars = (max_length + _GUARD) * _CHARS_PER_TOKEN if max_length else None

    # ------------------------------------------------------------ blocking primitives

    def encode(self, text: str, *, add_special_tokens: bool = True) -> Any:
        """One text's encoding, untruncated (blocking). Through encode_batch: the tokenizers binding
        releases the GIL there and not in encode, and a megabyte of text is hundreds of ms
        of Rust that the event loop's thread must not wait out."""
        (encoding,) = self._plain.encode_batch([text], add_special_tokens=add_special_tokens)
        return encoding

    def _cut_after(self, text: str, n: int) -> int | None:
        """Character offset where the text's n-th content token ends, if it has more than n
        tokens (None otherwise); tokenises growing prefixes, never more than needed."""
        window = max(n, 1) * _CHARS_PER_TOKEN
        while True:
            whole = window >= len(text)
            enc = self.encode(text if whole else text[:window], add_special_tokens=False)
            complete = len(enc.ids) if whole else _before_last_word(enc.word_ids)
            if complete > n:
                return int(enc.offsets[n - 1][1]) if n else 0
            if whole:
                return None
            window *= 4

    def _cut_before(self, text: str, n: int) -> int | None:
        """Character offset where the text's last n content tokens start, if it has more than
        n tokens (None otherwise); tokenises growing suffixes, never more than needed."""
        window = max(n, 1) * _CHARS_PER_TOKEN
        while True:
            whole = window >= len(text)
            start = 0 if whole else len(text) - window
            enc = self.encode(text[start:], add_special_tokens=False)
            total = len(enc.ids)
            complete = total - (0 if whole else _after_first_word(enc.word_ids))
            if complete > n:
                return start + int(enc.offsets[total - n][0]) if n else len(text)
            if whole:
                return None
            window *= 4

    def _measure(self, texts: Sequence[str]) -> tuple[np.ndarray, list[str]]:
        """Token counts capped at max_length + 1, and the texts the engine should get: huge
        ones cut a few tokens past the limit (the model truncates the same tokens either way)."""
        out = list(texts)
        lengths = np.zeros(len(out), dtype=np.int64)
        limit, cut_chars = self.max_length, self.cut_chars
        short: list[int] = []  # counted whole below
        for i, text in enumerate(out):
            if limit is not None and cut_chars is not None and len(text) > cut_chars:
                cut = self._cut_after(text, limit + _GUARD)
                if cut is not None:
                    out[i] = text[:cut]
                    lengths[i] = limit + 1
                    continue
                # long in characters, not in tokens (e.g. whitespace runs): count it whole
            short.append(i)
        if short:
            # encode_batch_fast skips character offsets, which counting does not need.
            encodings = self._encode_batch([out[i] for i in short])
            lengths[short] = [len(e.ids) for e in encodings]
        return lengths, out

    def full_length(self, text: str) -> int:
        """Untruncated token count, for error messages (blocking: run it in a thread). Huge
        texts are counted in pieces split at whitespace."""
        if len(text) <= 4 * _COUNT_PIECE:
            return len(self.encode(text).ids)
        total, start = self.specials, 0
        while start < len(text):
            end = min(len(text), start + _COUNT_PIECE)
            while end < len(text) and not text[end].isspace() and end - start < 2 * _COUNT_PIECE:
                end += 1
            total += len(self.encode(text[start:end], add_special_tokens=False).ids)
            start = end
        return total

    def pair_full_length(self, query: str, doc: str) -> int:
        """Untruncated tokens of a (query, document) pair, for error messages (blocking)."""
        texts = self.full_length(query) + self.full_length(doc) - 2 * self.specials
        return texts + self._pair_specials

    # ------------------------------------------------------------ async API

    async def offload(self, chars: int, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) in a worker thread when `chars` of text make it long, else here."""
        if chars <= _INLINE_CHARS:
            return fn(*args)
        # The Rust tokenizer releases the GIL: big batches run beside the event loop.
        return await asyncio.to_thread(fn, *args)

    async def lengths(self, texts: Sequence[str]) -> np.ndarray:
        """Token counts, capped at max_length + 1 (so > max_length means 'too long')."""
        lengths, _ = await self.prepare_lengths(texts)
        return lengths

    async def prepare_lengths(self, texts: Sequence[str]) -> tuple[np.ndarray, list[str]]:
        return await self.offload(sum(len(t) for t in texts), self._measure, texts)

    async def prepare(
        self, texts: Sequence[str], *, truncate: bool, names: Names = input_names
    ) -> tuple[int, list[str]]:
        """(tokens after truncation, texts for the engine); with truncate=False an over-long
        text is a 400 that names the client's own field (`names(i)` -> (param, label))."""
        lengths, cut = await self.prepare_lengths(texts)
        if self.max_length is None:
            return int(lengths.sum()), cut
        too_long = np.flatnonzero(lengths > self.max_length)
        if too_long.size and not truncate:
            i = int(too_long[0])
            full = await asyncio.to_thread(self.full_length, texts[i])
            raise InputTooLong(names(i), full, self.max_length)
        return int(np.minimum(lengths, self.max_length).sum()), cut

    async def usage(
        self, texts: Sequence[str], *, truncate: bool, names: Names = input_names
    ) -> int:
        """Total tokens after truncation (see prepare)."""
        tokens, _ = await self.prepare(texts, truncate=truncate, names=names)
        return tokens

    def needs_cutting(self, texts: Sequence[str]) -> bool:
        """Whether some text is long enough that the engine should get it cut."""
        return self.cut_chars is not None and any(len(t) > self.cut_chars for t in texts)

    async def pair_lengths(self, query: str, docs: Sequence[str]) -> np.ndarray:
        """Tokens of each (query, document) pair, capped at max_length + 1."""

        def count() -> np.ndarray:
            encodings = self._tok.encode_batch([(query, d) for d in docs])
            return np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(docs))

        return await self.offload(len(query) * len(docs) + sum(len(d) for d in docs), count)

    async def pair_usage(self, query: str, docs: Sequence[str]) -> int:
        """Tokens of (query, document) pairs as a cross-encoder sees them, after truncation."""
        lengths = await self.pair_lengths(query, docs)
        if self.max_length:
            lengths = np.minimum(lengths, self.max_length)
        return int(lengths.sum())

    async def fit(
        self,
        texts: Sequence[str],
        *,
        prompt: str,
        limit: int,
        keep: Literal["start", "end"] | None,
        names: Names = input_names,
    ) -> list[str]:
        """prompt + text for each text, with at most `limit` tokens as the model sees them
        (special tokens and prompt included): over-long texts lose their end (keep="start")
        or their beginning (keep="end"), never the prompt; keep=None refuses them (400)."""
        prompted = [prompt + t for t in texts]
        lengths, _ = await self.prepare_lengths(prompted)
        over = np.flatnonzero(lengths > limit)
        if not over.size:
            return prompted
        if keep is None:
            i = int(over[0])
            full = await asyncio.to_thread(self.full_length, prompted[i])
            raise InputTooLong(names(i), full, limit)
        used = len(self.encode(prompt, add_special_tokens=False).ids) if prompt else 0
        budget = max(limit - self.specials - used, 0)

        def cut() -> list[str]:
            for i in over.tolist():
                text = texts[i]
                if keep == "start":
                    end = self._cut_after(text, budget)
                    text = text if end is None else text[:end]
                else:
                    start = self._cut_before(text, budget)
                    text = text if start is None else text[start:]
                prompted[i] = prompt + text
            return prompted

        return await asyncio.to_thread(cut)

    async def pairs_usage(self, inputs: Sequence[str | tuple[str, str]]) -> int:
        """Tokens of texts and (text, text) pairs as a classifier sees them, after truncation."""

        def count() -> int:
            encodings = self._tok.encode_batch(list(inputs))
            lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64)
            if self.max_length:
                lengths = np.minimum(lengths, self.max_length)
            return int(lengths.sum())

        return await asyncio.to_thread(count)

    def tokens(
        self, texts: Sequence[str], *, add_special_tokens: bool
    ) -> list[list[tuple[int, str, bool, tuple[int, int]]]]:
        """Each text's tokens as the model sees them: (id, token, special, (start, stop))."""
        rows = []
        for enc in self._plain.encode_batch(list(texts), add_special_tokens=add_special_tokens):
            specials = enc.special_tokens_mask
            rows.append(
                [
                    (int(i), str(t), bool(sp), (int(a), int(b)))
                    for i, t, sp, (a, b) in zip(
                        enc.ids, enc.tokens, specials, enc.offsets, strict=True
                    )
                ]
            )
        return rows

    def token(self, id: int) -> str:
        """The vocabulary entry for one id (a sparse vector's index), e.g. '##20'."""
        return self._plain.id_to_token(id) or f"[{id}]"

    def decode(
        self, batches: Sequence[Sequence[int]], *, skip_special_tokens: bool, param: str
    ) -> list[str]:
        """The model's own ids back to text (TEI's /decode, vLLM's /detokenize)."""
        return self._decoder.decode(batches, skip_special_tokens=skip_special_tokens, param=param)

    async def truncate_texts(self, texts: Sequence[str], max_tokens: int) -> list[str]:
        """Cut each text after its first `max_tokens` tokens, at the original characters."""

        def cut() -> list[str]:
            out = []
            for text in texts:
                end = self._cut_after(text, max_tokens)
                out.append(text if end is None else text[:end])
            return out

        return await asyncio.to_thread(cut)
