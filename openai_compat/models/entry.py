"""One loaded model and everything the API needs to know about it (ModelEntry): what it can
do, its tokenizer, prompts, cache, and its admission counts. The registry (registry.py) maps
names to entries; the pool (pool.py) loads and unloads them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from openai_compat.engine.priority import in_background
from openai_compat.formats.compact import Quantizer
from openai_compat.formats.prompts import Prompts
from openai_compat.formats.tokens import TokenCounter
from openai_compat.frame.settings import ModelConfig
from openai_compat.ground.errors import BadRequest, RateLimited
from openai_compat.models.cache import EmbeddingCache
from openai_compat.tenants.limits import current as current_caller
from openai_compat.tenants.shares import QueueShares

Capability = Literal["embed", "sparse", "rerank", "classify", "image", "audio"]


def owned_by(model: str) -> str:
    """A hub id's organisation; ours for local folders and builtins."""
    if "/" in model and not model.startswith(("/", ".", "builtin:")):
        return model.split("/")[0]
    return "openai-compat"


@dataclass
class ModelEntry:
    """One loaded model and everything the API needs to know about it."""

    config: ModelConfig
    engine: Any  # engine/contract.Engine (None once unloaded)
    capabilities: frozenset[Capability]
    dimensions: int | None = None
    max_length: int | None = None
    counter: TokenCounter | None = None
    token_decoder: Any | None = None  # Cl100kDecoder | ModelTokenIdDecoder | None
    logits: Any | None = None  # raw classification logits: LogitsRunner, NativeEngine
    late: Any | None = None  # engine.late.LateRunner, made on the first late-chunking request
    multivector: bool = False  # one vector per token (ColBERT-style), not one per input
    modes: bool = False  # queries and documents embedded apart (MultiVectorEncoder's task)
    engine_counts: bool = False  # the engine reports each input's tokens (no 2nd pass)
    raw_output: bool = False  # vectors keep their pre-normalisation norm (TEI normalize=false)
    exact_token_ids: bool = False  # token_ids = "model": ids reach the model as given
    sparse: bool = False  # SPLADE: sparse vectors (sparse.SparseVector), dimensions = vocabulary
    # what one forward can give (BGE-M3's "dense", "sparse", "multivector"); (): one vector
    outputs: tuple[str, ...] = ()
    image_tokens: int = 0  # tokens one image is to the model (ViT patches + class token)
    image_side: int | None = None  # the shortest side its processor keeps (decoding shrinks)
    precision: dict[str, Any] | None = None  # dtype, device, why, the check's figures
    sampling_rate: int | None = None  # what audio inputs must be sampled at
    cosine_rerank: bool = False  # reranks by embedding similarity (no cross-encoder)
    # what its inputs may be ("text", "image", "audio": GET /v1/models says), and whether it
    # renders them through its chat template (a VLM: a prompt is a system message, given to
    # the engine apart from the text)
    modalities: frozenset[str] = frozenset({"text"})
    messages: bool = False
    prompts: Prompts = field(default_factory=Prompts)
    quantizer: Quantizer | None = None  # int8/uint8 ranges (see formats/compact.py)
    feeder: Any | None = None  # embed calls in waves (contract.Engine.wave_feeder)
    cache: EmbeddingCache | None = None  # exact vectors of texts seen before (cache.py)
    queued: int = 0  # live inputs admitted and not yet answered
    inflight: int = 0  # live requests in the engine's hands
    background_queued: int = 0  # the same for Batch API lines (their own budget)
    background_inflight: int = 0
    created: int = field(default_factory=lambda: int(time.time()))
    load_seconds: float = 0.0
    shares: QueueShares = field(default_factory=QueueShares, repr=False)  # with keys

    @property
    def name(self) -> str:
        return self.config.served_name

    @property
    def owned_by(self) -> str:
        return owned_by(self.config.model)

    @contextmanager
    def admit(self, inputs: int, limit: int) -> Iterator[None]:
        """Admission control: refuse (429) work that would push the queued inputs past `limit`.

        A request is always admitted onto an idle model, so one larger than the limit can
        still run; the queue never holds more than `limit` plus one request's inputs. Live
        requests and Batch API lines (inside priority.background()) have a budget each: a job
        never uses up live admission, and live traffic never starves a job of its own.
        """
        background = in_background()
        queued = self.background_queued if background else self.queued
        caller = current_caller.get()
        if caller is not None:
            key = caller.key
            self.shares.admit(self.name, key.name, key.weight, inputs, limit, background)
        elif limit and queued and queued + inputs > limit:
            raise RateLimited(
                f"Model {self.name!r} has {queued} inputs queued (limit {limit}); retry shortly.",
                headers={"Retry-After": "1"},
            )
        if background:
            self.background_queued += inputs
            self.background_inflight += 1
        else:
            self.queued += inputs
            self.inflight += 1
        try:
            yield
        finally:
            if background:
                self.background_queued -= inputs
                self.background_inflight -= 1
            else:
                self.queued -= inputs
                self.inflight -= 1
            if caller is not None:
                self.shares.release(caller.key.name, inputs, background)

    @property
    def pending(self) -> int:
        """Inputs admitted and not yet answered, live and background."""
        return self.queued + self.background_queued

    def tokenizer(self, param: str) -> TokenCounter:
        """The model's own tokenizer (tokenize and decode routes); 400 for models without."""
        if self.counter is None:
            raise BadRequest(f"Model {self.name!r} has no tokenizer.", param=param)
        return self.counter

    def engine_queue(self) -> int:
        """Inputs waiting for the model: in the engine's queue, and held by a wave feeder."""
        held = self.feeder.waiting if self.feeder is not None else 0
        return int(self.engine.queue_length()) + held

    async def embed(
        self,
        texts: list[str],
        mode: str | None = None,
        prompt: str | None = None,
        outputs: frozenset[str] | None = None,
    ) -> tuple[list[Any], int]:
        """The engine's embed (vectors, usage), through the exact cache (cache.py) and the
        feeder where there are. `mode` ("query", "document"): a model with modes only;
        `prompt`: a model with messages only (its system prompt, part of the cache's key);
        `outputs`: a model with several (BGE-M3) only, part of the cache's key."""
        if mode is not None and not self.modes:
            raise RuntimeError(f"model {self.name!r} has no query and document modes")
        if prompt and not self.messages:
            raise RuntimeError(f"model {self.name!r} takes its prompt in the text")
        if outputs and not outputs <= set(self.outputs):
            raise RuntimeError(f"model {self.name!r} cannot give {sorted(outputs)}")

        async def compute(todo: list[str]) -> tuple[list[Any], int]:
            return await self._embed(todo, mode, prompt, outputs)

        if self.cache is not None:
            keyed = mode if not prompt else f"{mode}|system:{prompt}"
            if outputs:
                keyed = f"{keyed}|outputs:{','.join(sorted(outputs))}"
            return await self.cache.embed(self.name, texts, compute, mode=keyed)
        return await compute(texts)

    async def _embed(
        self,
        texts: list[str],
        mode: str | None,
        prompt: str | None = None,
        outputs: frozenset[str] | None = None,
    ) -> tuple[list[Any], int]:
        if outputs:  # the native engine (and Ray replicas of it): no feeder
            asked: tuple[list[Any], int] = await self.engine.embed(texts, mode, prompt, outputs)
            return asked
        if prompt:  # the native engine: a VLM's system prompt
            prompted: tuple[list[Any], int] = await self.engine.embed(texts, None, prompt)
            return prompted
        if mode is not None:  # the native engine (and Ray replicas of it): no feeder
            moded: tuple[list[Any], int] = await self.engine.embed(texts, mode)
            return moded
        if self.feeder is not None:
            return await self.feeder.embed(texts)
        result: tuple[list[Any], int] = await self.engine.embed(texts)
        return result

    def alive(self) -> bool:
        """False once the engine's batching machinery has died."""
        return bool(self.engine.is_running)
