"""One way down, one way up: an embedding request of any dialect as one plan.

A route parses its dialect's body, resolves the model by its dialect's naming rules, and
says in an `EmbedPlan` what to embed (texts in any of OpenAI's forms, media URLs, both in the
client's order), with which prompt, what happens to a text past the model's window, and the
size of the vectors it will answer with. `run` carries the plan to the engine and back:
checks first (before any work), the prompt, token ids decoded, windows or truncation, the
engine calls (through embed.py, which admits, counts and caches), and the vectors in the
client's order. The route then only writes its dialect's answer from the `Embedded`.

Which of a model's settings apply is the plan's, so every dialect reads them alike:
- long inputs: a dialect that lets a request choose (OpenAI's and infinity's `long_input`,
  `choose_long`) gets the request's mode, else the model's `long_input` in full; the others
  (Cohere, TEI, the tutorial) get the model's `long_input = "mean"` wherever the request
  made no truncation choice of its own (`own_truncation`);
- truncation: the request's (`truncate`, or a fit: Cohere's END/START/NONE and max_tokens,
  TEI's Left), else the chosen long mode's ("truncate" cuts, "error" refuses), else the
  model's or the server's `truncate`, else the route's default.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from openai_compat.engine.refusals import OutputTooLarge
from openai_compat.engine.usage import TokenIds
from openai_compat.formats.media import MediaFetcher, Modality
from openai_compat.formats.prompts import with_title
from openai_compat.formats.tokens import Names, input_names
from openai_compat.frame.settings import Settings
from openai_compat.ground.errors import BadRequest
from openai_compat.inference.embed import (
    EmbedResult,
    check_dimensions,
    embed_fitted,
    embed_texts,
    texts_from_input,
    truncate_for,
)
from openai_compat.inference.long_inputs import LongResult, embed_late, embed_long, mean_by_setting
from openai_compat.inference.media import embed_media
from openai_compat.models.registry import ModelEntry

LongInput = Literal["error", "truncate", "mean", "chunks", "late"]
WINDOWED = ("mean", "chunks", "late")


@dataclass(frozen=True)
class EmbedPlan:
    """What one request asks of an embedding model, in no dialect's words."""

    # what to embed: texts (a string, strings, token ids, arrays of them), media URLs or
    # data: URIs, each at its client index where the two are mixed (Cohere's inputs)
    texts: str | Sequence[Any] | None = None
    media: Sequence[str | tuple[str, str]] | None = None  # (image, text): a VLM's pair
    modality: Modality = "image"
    text_at: Sequence[int] | None = None
    media_at: Sequence[int] | None = None
    param: str = "input"  # the field the texts came in
    names: Names = input_names  # (param, label) of text i, for errors
    media_names: Names = input_names
    # the prompt: the model's by input_type, prompt_name or task, else its default
    input_type: str | None = None
    prompt_name: str | None = None
    task: str | None = None
    title: str | None = None  # a document's title, where the prompt has a place for one
    # past the window
    choose_long: bool = False
    long_input: LongInput | None = None
    own_truncation: bool = False
    truncate: bool | None = None
    truncate_default: bool = True
    fit: bool = False  # cut as `keep` says (and to max_tokens), the prompt never cut
    keep: Literal["start", "end"] | None = "start"
    max_tokens: int | None = None
    chunk_spans: list[list[tuple[int, int]]] | None = None  # late chunking's
    chunk_tokens: int | None = None
    # what comes back
    dimensions: int | None = None
    dimensions_param: str = "dimensions"
    sparse_only: str | None = None  # a sparse-only option the request set (top_k, ...)
    # what a model with several outputs (BGE-M3) is asked for; None: its one dense vector
    outputs: frozenset[str] | None = None
    outputs_param: str = "output_types"


@dataclass
class Embedded:
    """The plan's answer: a vector per input in the client's order (dense rows, a
    multi-vector model's token matrices, or SparseVectors), pooled where windows ran."""

    vectors: list[Any]
    tokens: int
    count: int  # inputs the client sent
    long: LongResult | None = None  # where windows ran: their chunks
    mode: LongInput | None = None  # the long-input mode that ran
    media: list[dict[str, Any]] | None = None  # images' size, format, bit depth


def check(entry: ModelEntry, plan: EmbedPlan) -> None:
    """The plan's refusals that need no work (run makes them first too; a route that must
    refuse in its dialect's order calls this early)."""
    asked = plan.outputs or frozenset()
    if plan.outputs is not None and not entry.outputs:
        raise BadRequest(
            f"'{plan.outputs_param}' applies to models with several outputs (BGE-M3); "
            f"{entry.name!r} gives one.",
            param=plan.outputs_param,
            code="unsupported_parameter",
        )
    if plan.sparse_only is not None and not entry.sparse and "sparse" not in asked:
        what = f"'{plan.outputs_param}' with 'sparse'" if entry.outputs else "sparse models"
        raise BadRequest(
            f"'{plan.sparse_only}' applies to {what} only; {entry.name!r} is not one.",
            param=plan.sparse_only,
            code="unsupported_parameter",
        )
    if plan.dimensions is not None and plan.outputs is not None and "dense" not in asked:
        raise BadRequest(
            f"'{plan.dimensions_param}' cuts dense vectors; this request asks for "
            f"{', '.join(sorted(asked))} only.",
            param=plan.dimensions_param,
            code="unsupported_parameter",
        )
    if entry.sparse and plan.dimensions is not None:
        raise BadRequest(
            f"'{plan.dimensions_param}' does not apply to sparse model {entry.name!r}; use "
            "top_k to keep fewer weights.",
            param=plan.dimensions_param,
            code="unsupported_parameter",
        )
    check_dimensions(plan.dimensions, entry, plan.dimensions_param)


async def run(
    entry: ModelEntry, plan: EmbedPlan, settings: Settings, fetcher: MediaFetcher | None = None
) -> Embedded:
    """The plan through the engine and back."""
    check(entry, plan)
    parts: list[tuple[Sequence[int] | None, EmbedResult]] = []
    done = Embedded([], 0, 0)
    if plan.texts is not None:
        prompt = entry.prompts.choose(
            entry.name, input_type=plan.input_type, prompt_name=plan.prompt_name, task=plan.task
        )
        prompt = with_title(prompt, plan.title)
        texts = await texts_from_input(plan.texts, entry, settings, plan.param)
        mode = _long_mode(entry, plan, texts)
        if mode in WINDOWED and (entry.sparse or plan.outputs is not None):
            what = f"{entry.name!r} is sparse" if entry.sparse else f"'{plan.outputs_param}' is set"
            raise BadRequest(
                f"long_input {mode!r} applies to dense vectors alone; {what} (use "
                "'truncate' or 'error').",
                param="long_input",
                code="unsupported_parameter",
            )
        if mode in WINDOWED and not isinstance(texts[0], TokenIds):
            if mode == "late":
                long = await embed_late(
                    entry,
                    texts,
                    settings,
                    plan.names,
                    prompt=prompt,
                    spans=plan.chunk_spans,
                    chunk_tokens=plan.chunk_tokens,
                )
            else:
                long = await embed_long(entry, texts, settings, plan.names, prompt=prompt)
            done.long, done.mode = long, mode
            parts.append((plan.text_at, EmbedResult(list(long.vectors), long.tokens)))
        elif plan.fit:
            fitted = await embed_fitted(
                entry,
                texts,
                settings,
                plan.names,
                prompt=prompt,
                keep=plan.keep,
                max_tokens=plan.max_tokens,
                outputs=plan.outputs,
            )
            parts.append((plan.text_at, fitted))
        else:
            truncate = plan.truncate
            if truncate is None and plan.choose_long and mode is not None:
                truncate = mode == "truncate"  # "error" refuses; a window mode on token ids too
            if truncate is None:
                truncate = truncate_for(entry, settings, plan.truncate_default)
            result = await embed_texts(
                entry,
                texts,
                settings,
                plan.names,
                prompt=prompt,
                truncate=truncate,
                outputs=plan.outputs,
            )
            parts.append((plan.text_at, result))
    if plan.media is not None:
        if plan.outputs is not None:
            raise BadRequest(
                f"'{plan.outputs_param}' applies to text inputs.",
                param=plan.outputs_param,
                code="unsupported_parameter",
            )
        if fetcher is None:
            raise RuntimeError("a plan with media needs the app's media fetcher")
        paired = [(k, m[1]) for k, m in enumerate(plan.media) if isinstance(m, tuple)]
        if plan.truncate is False and paired and entry.counter is not None:
            # an image's text past the window is refused as a text alone would be, not cut
            await entry.counter.usage(
                [t for _, t in paired],
                truncate=False,
                names=lambda j: plan.media_names(paired[j][0]),
            )
        system = None
        if entry.messages:  # a VLM: its system prompt, the document side unless asked
            system = entry.prompts.for_media(
                entry.name, input_type=plan.input_type, prompt_name=plan.prompt_name, task=plan.task
            )
        result = await embed_media(
            entry, plan.media, plan.modality, settings, fetcher, plan.media_names, system
        )
        done.media = result.media
        parts.append((plan.media_at, result))
    done.tokens = sum(r.tokens for _, r in parts)
    if len(parts) == 1:
        done.vectors = parts[0][1].vectors
    else:  # texts and media mixed: back in the client's order
        done.vectors = [None] * sum(len(r.vectors) for _, r in parts)
        for at, result in parts:
            assert at is not None, "mixed inputs need their client indices"
            for i, vector in zip(at, result.vectors, strict=True):
                done.vectors[i] = vector
    done.count = len(done.vectors)
    if entry.multivector or "multivector" in (plan.outputs or ()):  # cache hits too: the
        # engine bounds only what it computes
        values = sum(int(np.size(getattr(v, "multivector", v))) for v in done.vectors)
        if values > settings.max_multivector_values:
            too_large = OutputTooLarge(values, settings.max_multivector_values)
            raise BadRequest(str(too_large), param="input", code="output_too_large")
    return done


def _long_mode(entry: ModelEntry, plan: EmbedPlan, texts: list[Any]) -> LongInput | None:
    """The long-input mode that applies (the module's docstring says which)."""
    if plan.long_input is not None:
        return plan.long_input
    if plan.own_truncation:
        return None
    if plan.choose_long:
        return entry.config.long_input
    return "mean" if mean_by_setting(entry, texts) else None
