"""A key's tokens per minute are taken before the model runs on every path (#52): images,
text pairs and classify (after the queue took the request, so a queue's 429 costs nothing),
on fake engines that record whether they ran."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from openai_compat.formats.tokens import TokenCounter
from openai_compat.frame.settings import ModelConfig, Settings
from openai_compat.ground.errors import RateLimited
from openai_compat.inference import media, scoring
from openai_compat.models.registry import ModelEntry
from openai_compat.tenants.keys import Key
from openai_compat.tenants.limits import Caller, Limiter, current

SETTINGS = Settings(max_inputs_per_request=8, max_queued_inputs=4)


class Recorder:
    """An engine that records its calls: images -> one vector each, pairs -> one logit."""

    is_running = True

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def image_embed(self, *, images: list[Any]) -> tuple[list[np.ndarray], int]:
        self.calls.append("image_embed")
        return [np.ones(4, dtype=np.float32) for _ in images], 0

    async def logits(self, inputs: list[Any]) -> list[list[dict[str, Any]]]:
        self.calls.append("logits")
        return [[{"label": "a", "score": 1.0}, {"label": "b", "score": 0.0}] for _ in inputs]

    async def classify(self, *, sentences: list[str]) -> tuple[list[Any], int]:
        self.calls.append("classify")
        return [[{"label": "a", "score": 1.0}] for _ in sentences], 0


class Fetcher:
    async def fetch_all(
        self, items: list[str], modality: str, rate: int | None, side: int | None = None
    ) -> list[Any]:
        return [SimpleNamespace(info={}) for _ in items]


@pytest.fixture
def caller() -> Iterator[Caller]:
    key = Key(name="k", digest=b"x" * 32, tpm=100)
    who = Caller(key, Limiter())
    token = current.set(who)
    yield who
    current.reset(token)


@pytest.fixture(scope="module")
def counter(minilm_path: str) -> TokenCounter:
    from tokenizers import Tokenizer

    return TokenCounter(Tokenizer.from_file(f"{minilm_path}/tokenizer.json"), 256)


def _entry(engine: Recorder, caps: set[str], **kw: Any) -> ModelEntry:
    config = ModelConfig(model="org/m", name="m")
    return ModelEntry(config=config, engine=engine, capabilities=frozenset(caps), **kw)  # type: ignore[arg-type]


async def test_images_are_charged_before_the_model_runs(caller: Caller) -> None:
    engine = Recorder()
    entry = _entry(engine, {"image"}, image_tokens=50)
    done = await media.embed_media(entry, ["a", "b"], "image", SETTINGS, Fetcher())  # type: ignore[arg-type]
    assert done.tokens == 100 and caller.reserved_tokens == 100
    with pytest.raises(RateLimited, match="Request too large"):  # 150 > the whole tpm of 100
        await media.embed_media(entry, ["a", "b", "c"], "image", SETTINGS, Fetcher())  # type: ignore[arg-type]
    assert engine.calls == ["image_embed"]  # the refused request never reached the model


async def test_text_pairs_are_charged_before_the_model_runs(
    caller: Caller, counter: TokenCounter
) -> None:
    engine = Recorder()
    entry = _entry(engine, {"classify"}, counter=counter, logits=engine)
    long = "word " * 60  # 61 tokens a side with the specials: 122 > 100
    with pytest.raises(RateLimited, match="Request too large"):
        await scoring.classify_pairs(entry, [(long, long)], SETTINGS, raw_scores=False)
    assert engine.calls == [] and caller.reserved_tokens == 0
    labels, tokens = await scoring.classify_pairs(entry, [("a", "b")], SETTINGS, raw_scores=False)
    assert labels == [
        [("a", pytest.approx(0.7311, abs=1e-4)), ("b", pytest.approx(0.2689, abs=1e-4))]
    ]
    assert tokens == 5 and caller.reserved_tokens == 5 and engine.calls == ["logits"]


async def test_a_classify_request_the_queue_refuses_costs_no_tokens(
    caller: Caller, counter: TokenCounter
) -> None:
    engine = Recorder()
    entry = _entry(engine, {"classify"}, counter=counter)
    entry.shares.queued[False]["k"] = 4  # this key's share of the queue is taken (of 4)
    with pytest.raises(RateLimited, match="inputs queued"):
        await scoring.classify_texts(entry, ["hello there"] * 2, SETTINGS)
    assert caller.reserved_tokens == 0 and engine.calls == []
    entry.shares.queued[False].clear()
    result = await scoring.classify_texts(entry, ["hello there"] * 2, SETTINGS)
    assert result.tokens == caller.reserved_tokens == 8
