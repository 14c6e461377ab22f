from __future__ import annotations

import pytest

from openai_compat.frame.settings import ConfigError, ModelConfig
from openai_compat.ground.errors import BadRequest, ModelNotFound
from openai_compat.models.registry import ModelEntry, Registry


class _Engine:
    is_running = True


def _entry(config: ModelConfig, *caps: str) -> ModelEntry:
    return ModelEntry(config=config, engine=_Engine(), capabilities=frozenset(caps))  # type: ignore[arg-type]


@pytest.fixture
def registry() -> Registry:
    emb = ModelConfig(model="org/emb", aliases=("text-embedding-3-small",))
    rr = ModelConfig(model="org/rr", name="reranker")
    reg = Registry([emb, rr])
    reg.add(_entry(emb, "embed", "rerank"))
    reg.add(_entry(rr, "rerank"))
    return reg


async def test_names_and_aliases_resolve_to_one_entry(registry: Registry) -> None:
    assert await registry.resolve("emb") is await registry.resolve("text-embedding-3-small")
    assert (await registry.resolve("reranker")).name == "reranker"
    assert registry.served_names() == ["emb", "reranker", "text-embedding-3-small"]
    assert registry.complete


async def test_unknown_name_is_404_never_a_fallback(registry: Registry) -> None:
    with pytest.raises(ModelNotFound) as info:
        await registry.resolve("gpt-4")
    assert info.value.status == 404 and info.value.param == "model"
    with pytest.raises(ModelNotFound):
        await registry.resolve("EMB")  # names are exact


async def test_capability_mismatch_is_400_naming_what_it_can_do(registry: Registry) -> None:
    assert (await registry.require("emb", "embed")).name == "emb"
    with pytest.raises(BadRequest) as info:
        await registry.require("reranker", "embed")
    assert info.value.param == "model" and "rerank" in info.value.message
    with pytest.raises(BadRequest):
        await registry.require("text-embedding-3-small", "classify")


def test_duplicates_are_refused() -> None:
    with pytest.raises(ConfigError, match="duplicate"):
        Registry([ModelConfig(model="a/x"), ModelConfig(model="b/x")])
    with pytest.raises(ConfigError, match="duplicate"):
        Registry([ModelConfig(model="a/x", aliases=("y",)), ModelConfig(model="b/y")])


async def test_by_index_follows_config_order(registry: Registry) -> None:
    assert (await registry.by_index(1, "rerank", 2)).name == "reranker"
    with pytest.raises(BadRequest) as info:
        await registry.by_index(2, "rerank", 2)
    assert info.value.param == "model_index" and "0=emb" in info.value.message
    assert "configs/production.toml" in info.value.message


async def test_by_index_without_index_uses_the_tutorial_position_else_the_default() -> None:
    emb = ModelConfig(model="org/emb")
    rr = ModelConfig(model="org/rr", name="reranker")
    reg = Registry([emb, rr])
    reg.add(_entry(emb, "embed", "rerank"))
    reg.add(_entry(rr, "rerank"))
    reg.choose_defaults({})
    # Position 1 (the tutorial's text model) is the reranker here: it cannot embed, so the
    # server's default embedder answers; position 1 can rerank, so it is used as such.
    assert (await reg.by_index(None, "embed", 1)).name == "emb"
    assert (await reg.by_index(None, "rerank", 1)).name == "reranker"
    # No position 2 here: the default reranker.
    assert (await reg.by_index(None, "rerank", 2)).name == "emb"
    with pytest.raises(BadRequest) as info:
        await reg.by_index(None, "classify", 3)
    assert info.value.code == "model_not_supported" and "0 CLIP" in info.value.message


def test_incomplete_while_loading() -> None:
    reg = Registry([ModelConfig(model="a/x"), ModelConfig(model="a/y")])
    reg.add(_entry(reg.configs[0], "embed"))
    assert not reg.complete
    assert [e.name for e in reg.entries()] == ["x"]


async def test_defaults_are_fixed_at_start_up_real_reranker_first(registry: Registry) -> None:
    registry.entries()[0].cosine_rerank = True  # 'emb' ranks by cosine; 'reranker' is real
    registry.choose_defaults({})
    assert (await registry.default("embed")).name == "emb"
    assert (await registry.default("rerank")).name == "reranker"
    with pytest.raises(BadRequest, match="No served model can classify text"):
        await registry.default("classify")
    assert (await registry.default("classify", or_first=True)).name == "emb"
    registry.choose_defaults({"rerank": "emb"})
    assert (await registry.default("rerank")).name == "emb"


def test_a_default_model_that_is_not_served_or_cannot_stops_start_up(registry: Registry) -> None:
    from openai_compat.models.registry import EngineFailure

    with pytest.raises(EngineFailure, match="--default-model rerank=nope: The model 'nope'"):
        registry.choose_defaults({"rerank": "nope"})
    with pytest.raises(EngineFailure, match="--default-model embed=reranker: Model 'reranker'"):
        registry.choose_defaults({"embed": "reranker"})
