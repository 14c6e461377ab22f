"""Prompt resolution: config over model folder, the one name mapping, and its 400s."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from openai_compat.formats.prompts import Prompts
from openai_compat.frame.settings import ModelConfig
from openai_compat.ground.errors import BadRequest

E5 = Prompts({"query": "query: ", "passage": "passage: "})
NOMIC = Prompts({"search_query": "search_query: ", "search_document": "search_document: "})
BGE = Prompts({"query": "Represent this sentence: ", "document": ""}, default=None)


@pytest.mark.parametrize(
    ("prompts", "asked", "prefix"),
    [
        (E5, "query", "query: "),
        (E5, "search_query", "query: "),
        (E5, "retrieval.query", "query: "),
        (E5, "search_document", "passage: "),
        (E5, "retrieval.passage", "passage: "),
        (E5, "document", "passage: "),
        (NOMIC, "query", "search_query: "),
        (NOMIC, "retrieval.passage", "search_document: "),
        (BGE, "search_document", ""),
        (BGE, "passage", ""),
        (BGE, "search_query", "Represent this sentence: "),
    ],
)
def test_every_vocabulary_maps_onto_the_models_names(
    prompts: Prompts, asked: str, prefix: str
) -> None:
    assert prompts.select(asked, "input_type", "m") == prefix


def test_an_unknown_name_is_a_400_listing_the_prompts() -> None:
    with pytest.raises(BadRequest) as err:
        E5.select("clustering", "task", "e5")
    assert err.value.param == "task" and err.value.code == "unknown_prompt"
    assert "passage, query" in err.value.message and "'clustering'" in err.value.message


def test_a_model_without_prompts_ignores_input_types() -> None:
    assert Prompts().select("search_query", "input_type", "m") == ""
    assert Prompts().select("anything", "input_type", "m") == ""


def test_the_default_prompt_applies_when_none_is_named() -> None:
    prompts = Prompts({"query": "q: ", "document": "d: "}, default="document")
    assert prompts.choose("m") == "d: "
    assert prompts.choose("m", input_type="query") == "q: "
    assert E5.choose("m") == ""


def test_image_input_type_is_not_a_text_prompt() -> None:
    assert E5.select("image", "input_type", "m") == ""


def test_fields_that_agree_are_one_request_and_fields_that_differ_are_a_400() -> None:
    assert E5.choose("m", input_type="search_query", prompt_name="query") == "query: "
    with pytest.raises(BadRequest) as err:
        E5.choose("m", input_type="search_query", task="retrieval.passage")
    assert err.value.param == "task" and err.value.code == "conflicting_prompts"


def test_config_prompts_replace_the_folders_and_its_default() -> None:
    folder = {"query": "folder q: ", "document": "folder d: "}
    resolved = Prompts.resolve({"query": "cfg: "}, None, folder, "document")
    assert dict(resolved.prompts) == {"query": "cfg: "} and resolved.default is None
    from_folder = Prompts.resolve(None, None, folder, "document")
    assert dict(from_folder.prompts) == folder and from_folder.default == "document"
    # a configured default may name a prompt that comes from the folder
    assert Prompts.resolve(None, "query", folder, None).default == "query"
    with pytest.raises(ValueError, match="'nope' is not one of the model's prompts"):
        Prompts.resolve(None, "nope", folder, None)


def test_config_refuses_a_default_that_is_not_a_prompt() -> None:
    with pytest.raises(ValidationError, match="default_prompt 'doc' is not one of prompts"):
        ModelConfig(model="m", prompts={"query": "q: "}, default_prompt="doc")
    ModelConfig(model="m", prompts={"query": "q: "}, default_prompt="query")


def test_describe_lists_prompts_for_models_that_have_them() -> None:
    assert Prompts().describe() is None
    assert E5.describe() == {"prompts": dict(E5.prompts), "default_prompt": None}
