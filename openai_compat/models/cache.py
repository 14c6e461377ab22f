"""An exact embedding cache in front of the engines, and in-request deduplication.

Real corpora repeat themselves (RAG ingestion re-embeds unchanged chunks; popular queries
recur): a repeat costs a hash lookup instead of a forward pass. The key is the model and a
128-bit BLAKE2b digest of exactly what the engine would be given (the text after the prompt
and any cut; or the token ids of a TokenIds input): truncation, prompts and the model's own
settings are all inside it, and dimensions, encodings and compact types are applied after
the cache. The value is the engine's own vector object, so a hit answers bit for bit what the
first computation did, with its token count (usage counts every input, hits included, as
OpenAI bills them). A text that another request is computing right now is not computed
again: the later request waits for that answer (single flight). One LRU shared by all
models under a byte budget (--cache-bytes; 0 = off), per model opt-out (`cache = false`);
sparse models and media inputs are never cached.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from openai_compat.engine.usage import TokenIds, engine_token_count, length_estimate
from openai_compat.tenants.limits import current as current_caller

_ENTRY_OVERHEAD = 200  # bytes an entry costs beyond its vector (key, dict slot, object)


def _owned(vector: Any) -> Any:
    """A vector that owns its memory: the engine's rows are views of its whole batch's array,
    which a cached row would keep alive (and its size would not count). The copy keeps the
    values bit for bit and the row's attributes (its token count, its norm)."""
    if not isinstance(vector, np.ndarray) or vector.base is None:
        return vector
    copy = np.array(vector, copy=True, subok=True)
    attributes = getattr(vector, "__dict__", None)  # a subclass's (TokenCountedArray's)
    if attributes:
        copy.__dict__.update(attributes)
    return copy


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0


@dataclass
class EmbeddingCache:
    max_bytes: int
    # each key its own entries (tenants: a hit would tell key B that key A embedded a text)
    per_key: bool = True
    held: int = 0  # bytes held, all models
    stats: dict[str, CacheStats] = field(default_factory=dict)
    _items: OrderedDict[tuple[str, bytes], tuple[Any, int]] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # (model, key) -> the answer a request is computing now (single flight, one event loop)
    _flights: dict[tuple[str, bytes], asyncio.Future[Any]] = field(default_factory=dict)

    @staticmethod
    def key(text: str, mode: str | None = None, tenant: str | None = None) -> bytes:
        """A digest of what the engine is given: the text (or ids), and the mode (query or
        document) of a model that embeds them apart; with `tenant`, that key's own entry."""
        if isinstance(text, TokenIds):  # the ids, not their decoded text
            raw = b"ids:" + ",".join(map(str, text.ids)).encode()
        else:
            raw = b"text:" + text.encode("utf-8", "surrogatepass")
        if mode is not None:
            raw = b"mode:" + mode.encode() + b":" + raw
        if tenant is not None:
            raw = b"key:" + tenant.encode() + b"\x00" + raw
        return hashlib.blake2b(raw, digest_size=16).digest()

    def _stats(self, model: str) -> CacheStats:
        return self.stats.setdefault(model, CacheStats())

    def get(self, model: str, key: bytes) -> Any | None:
        with self._lock:
            found = self._items.get((model, key))
            if found is None:
                self._stats(model).misses += 1
                return None
            self._items.move_to_end((model, key))
            self._stats(model).hits += 1
            return found[0]

    def put(self, model: str, key: bytes, vector: Any) -> None:
        vector = _owned(vector)
        size = int(getattr(vector, "nbytes", 0)) + _ENTRY_OVERHEAD
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop((model, key), None)
            if old is not None:
                self.held -= old[1]
            self._items[(model, key)] = (vector, size)
            self.held += size
            while self.held > self.max_bytes:
                (owner, _), (_, freed) = self._items.popitem(last=False)
                self.held -= freed
                self._stats(owner).evictions += 1

    def per_model_bytes(self) -> dict[str, int]:
        with self._lock:
            out: dict[str, int] = {}
            for (model, _), (_, size) in self._items.items():
                out[model] = out.get(model, 0) + size
            return out

    async def embed(
        self,
        model: str,
        texts: Sequence[str],
        compute: Callable[[list[str]], Awaitable[tuple[list[Any], int]]],
        mode: str | None = None,
    ) -> tuple[list[Any], int]:
        """`compute`'s answer for `texts`, computing each distinct text not cached once: a
        repeat inside the request, or a text another request is computing right now (it
        waits for that answer: single flight). The usage returned is the engine's measure
        (tokens where its vectors carry them, else characters) over all the texts."""
        loop = asyncio.get_running_loop()
        caller = current_caller.get() if self.per_key else None
        tenant = caller.key.name if caller is not None else None  # the key's own entries
        out: list[Any] = [None] * len(texts)
        todo: dict[bytes, list[int]] = {}  # key -> the positions this request computes
        borrowed: dict[bytes, tuple[asyncio.Future[Any], list[int]]] = {}  # another's
        for i, text in enumerate(texts):
            key = self.key(text, mode, tenant)
            if key in todo:  # a repeat inside this request: computed once
                todo[key].append(i)
                continue
            if key in borrowed:
                borrowed[key][1].append(i)
                continue
            hit = self.get(model, key)
            if hit is not None:
                out[i] = hit
                continue
            flight = self._flights.get((model, key))
            if flight is not None and flight.get_loop() is loop and not flight.done():
                borrowed[key] = (flight, [i])
            else:
                todo[key] = [i]
        computed: list[int] = []  # the positions the engine answered for this request
        usage = await self._compute(model, texts, todo, out, computed, compute, loop)
        retry: dict[bytes, list[int]] = {}
        for key, (flight, positions) in borrowed.items():
            try:
                vector = await asyncio.shield(flight)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not flight.cancelled() or (task is not None and task.cancelling()):
                    raise  # this request itself was cancelled
                retry[key] = positions  # the one computing it failed or left: our turn
                continue
            for i in positions:
                out[i] = vector
        if retry:
            usage += await self._compute(model, texts, retry, out, computed, compute, loop)
        # the rest in the unit the engine reported in: tokens where its vectors carry them
        # and its usage was their sum, else characters (infinity-emb's own measure)
        answered = [out[i] for i in computed]
        in_tokens = engine_token_count(out) is not None and (
            not computed or usage == engine_token_count(answered)
        )
        done = set(computed)
        rest = [i for i in range(len(texts)) if i not in done]
        if in_tokens:
            usage += sum(int(out[i].tokens) for i in rest)
        else:
            usage += length_estimate([texts[i] for i in rest])
        return out, usage

    async def _compute(
        self,
        model: str,
        texts: Sequence[str],
        todo: dict[bytes, list[int]],
        out: list[Any],
        computed: list[int],
        compute: Callable[[list[str]], Awaitable[tuple[list[Any], int]]],
        loop: asyncio.AbstractEventLoop,
    ) -> int:
        """Compute `todo`'s texts once each, announcing them to concurrent requests."""
        if not todo:
            return 0
        mine: dict[bytes, asyncio.Future[Any]] = {}
        for key in todo:
            if (model, key) not in self._flights:
                mine[key] = self._flights[(model, key)] = loop.create_future()
        try:
            vectors, usage = await compute([texts[positions[0]] for positions in todo.values()])
            for (key, positions), vector in zip(todo.items(), vectors, strict=True):
                self.put(model, key, vector)
                computed.append(positions[0])
                for i in positions:
                    out[i] = vector
                if key in mine:
                    mine[key].set_result(vector)
        finally:
            for key, flight in mine.items():
                if not flight.done():
                    flight.cancel()  # those waiting compute it themselves
                if self._flights.get((model, key)) is flight:
                    del self._flights[(model, key)]
        return usage
