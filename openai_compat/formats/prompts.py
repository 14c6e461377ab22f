"""Retrieval prompts: a model's named prefixes, and the one mapping from what clients ask for.

A prompt is a prefix the model sees before each text, applied exactly as
sentence-transformers' `encode(prompt=...)` does (plain string concatenation). Clients name
prompts in their own vocabulary: OpenAI-route `input_type`, TEI's `prompt_name`, Jina's
`task`, Cohere's `input_type`. `Prompts.select` maps all of them onto the model's names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from openai_compat.ground.errors import BadRequest

# What clients ask for -> the model prompt names that serve it, in order of preference.
_SYNONYMS: dict[str, tuple[str, ...]] = {
    "search_query": ("query", "search_query", "retrieval.query"),
    "retrieval.query": ("query", "search_query", "retrieval.query"),
    "query": ("query", "search_query", "retrieval.query"),
    "search_document": ("document", "passage", "search_document", "retrieval.passage"),
    "retrieval.passage": ("passage", "document", "search_document", "retrieval.passage"),
    "document": ("document", "passage", "search_document", "retrieval.passage"),
    "passage": ("passage", "document", "search_document", "retrieval.passage"),
    "classification": ("classification",),
    "clustering": ("clustering",),
    "separation": ("separation", "clustering"),
    "text-matching": ("text-matching", "similarity", "sts"),
    "code.query": ("code.query", "code_query"),
    "code.passage": ("code.passage", "code_passage"),
    # Gemini's taskType (its SDKs send one with every request); the capitalised names are
    # the ones EmbeddingGemma's folder declares (MTEB's task names)
    "RETRIEVAL_QUERY": ("query", "Retrieval-query", "search_query", "retrieval.query"),
    "RETRIEVAL_DOCUMENT": ("document", "Retrieval-document", "passage", "search_document"),
    "SEMANTIC_SIMILARITY": ("STS", "sts", "similarity", "text-matching"),
    "CLASSIFICATION": ("Classification", "classification"),
    "CLUSTERING": ("Clustering", "clustering"),
    "QUESTION_ANSWERING": ("QuestionAnswering", "question_answering", "query"),
    "FACT_VERIFICATION": ("FactVerification", "fact_verification", "query"),
    "CODE_RETRIEVAL_QUERY": ("InstructionRetrieval", "code.query", "code_query", "query"),
}

# Cohere's input_type for image inputs: it selects the modality, never a text prompt.
_NOT_A_PROMPT = frozenset({"image"})
# What asks a model with query and document modes for its query side; anything else (or
# nothing) gets the document side, the library's default (encode = encode_document).
_QUERY_SIDE = frozenset(
    {"query", "search_query", "retrieval.query", "code.query"}
    | {"RETRIEVAL_QUERY", "QUESTION_ANSWERING", "FACT_VERIFICATION", "CODE_RETRIEVAL_QUERY"}
)  # the second set: Gemini's query-side task types
# Where a document prompt has a place for a title (EmbeddingGemma's "title: none | text: ")
_NO_TITLE = "title: none"


class Prompt(str):
    """The prefix a request chose, and on a model with query and document modes (a
    MultiVectorEncoder: markers, query expansion, per-side lengths) the side it asked for:
    `mode` is "query" or "document" there, None elsewhere. It is the prefix wherever a
    string is used, so every embedding path carries the side with the prefix."""

    mode: str | None = None

    @classmethod
    def of(cls, prefix: str, mode: str | None) -> Prompt:
        prompt = cls(prefix)
        prompt.mode = mode
        return prompt


def with_title(prompt: str, title: str | None) -> str:
    """The prompt with the document's title in its title slot (EmbeddingGemma's documented
    `title: {title} | text: `); a prompt without one is returned as it is."""
    if not title or _NO_TITLE not in prompt:
        return prompt
    titled = prompt.replace(_NO_TITLE, f"title: {title}", 1)
    return Prompt.of(titled, prompt.mode) if isinstance(prompt, Prompt) else titled


def mode_of(prompt: str) -> str | None:
    """The side a chosen prompt asks for (Prompt.mode); None for a plain prefix."""
    return prompt.mode if isinstance(prompt, Prompt) else None


@dataclass(frozen=True)
class Prompts:
    """One model's prompts (name -> prefix) and the one used when a request names none."""

    prompts: Mapping[str, str] = field(default_factory=dict)
    default: str | None = None
    modes: bool = False  # the model embeds queries and documents apart (Prompt.mode)

    @classmethod
    def resolve(
        cls,
        configured: Mapping[str, str] | None,
        configured_default: str | None,
        folder: Mapping[str, str] | None,
        folder_default: str | None,
    ) -> Prompts:
        """The config's prompts win over the model folder's (sentence-transformers') ones."""
        prompts = dict(configured if configured is not None else (folder or {}))
        default = configured_default
        if default is None and configured is None:
            default = folder_default
        if default is not None and default not in prompts:
            raise ValueError(
                f"default_prompt {default!r} is not one of the model's prompts "
                f"({', '.join(prompts) or 'it has none'})"
            )
        return cls(prompts, default or None)

    def select(self, requested: str | None, param: str, model: str) -> str:
        """The prefix for a request that asked for `requested` (its field: `param`)."""
        if requested is None or not self.prompts or requested in _NOT_A_PROMPT:
            # A model without prompts ignores input types: Cohere clients always send one.
            return self.prompts[self.default] if self.default else ""
        if requested in self.prompts:
            return self.prompts[requested]
        for name in _SYNONYMS.get(requested, ()):
            if name in self.prompts:
                return self.prompts[name]
        raise BadRequest(
            f"Model {model!r} has no prompt for {param} {requested!r}; its prompts are: "
            f"{', '.join(sorted(self.prompts))}.",
            param=param,
            code="unknown_prompt",
        )

    def choose(self, model: str, **fields: str | None) -> str:
        """The prefix a request asks for through any of its prompt fields (`input_type`,
        `prompt_name`, `task`...); fields that ask for different prompts are a 400."""
        given = [(param, value) for param, value in fields.items() if value is not None]
        if self.modes:
            side = "query" if given and given[0][1] in _QUERY_SIDE else "document"
            if not given and side in self.prompts:
                return Prompt.of(self.prompts[side], side)
            return Prompt.of(self._choose(model, given), side)
        return self._choose(model, given)

    def for_media(self, model: str, **fields: str | None) -> str:
        """An image's prompt on a model that renders messages (a system message): what the
        request asks for, else the document side (Cohere's input_type "image"): the model's
        document prompt, or its default."""
        given = [(k, v) for k, v in fields.items() if v is not None and v not in _NOT_A_PROMPT]
        if given:
            return self._choose(model, given)
        for name in _SYNONYMS["document"]:
            if name in self.prompts:
                return self.prompts[name]
        return self.select(None, "input_type", model)

    def _choose(self, model: str, given: list[tuple[str, str]]) -> str:
        if not given:
            return self.select(None, "input_type", model)
        param, value = given[0]
        prefix = self.select(value, param, model)
        for other, other_value in given[1:]:
            if self.select(other_value, other, model) != prefix:
                raise BadRequest(
                    f"'{param}' ({value!r}) and '{other}' ({other_value!r}) ask for different "
                    "prompts; send one.",
                    param=other,
                    code="conflicting_prompts",
                )
        return prefix

    def describe(self) -> dict[str, object] | None:
        """For /v1/models: the prompts and the default, or None for a model without any."""
        if not self.prompts and not self.modes:
            return None
        described: dict[str, object] = {
            "prompts": dict(self.prompts),
            "default_prompt": self.default,
        }
        if self.modes:
            described["modes"] = ["query", "document"]
        return described
