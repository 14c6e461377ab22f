"""TEI's API on the bare paths: /embed, /rerank, /predict, /tokenize, /decode, /info and POST /.

TEI serves one model and its requests name none: here they go to the default model for the
capability (--default-model, else the first served model that can). Errors use TEI's body
({"error", "error_type"}) and status codes (422 invalid, 413 too long / too many, 424 backend).
The shared paths (/embed, /rerank, /tokenize) reach these handlers through api/shared.py.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_compat import __version__
from openai_compat.api.request import body_openapi, note, read_body, ready_registry, settings_of
from openai_compat.api.tei.protocol import (
    TEI_ERROR_RESPONSES,
    TeiDecodeRequest,
    TeiEmbedRequest,
    TeiEmbedSparseRequest,
    TeiPredictRequest,
    TeiRerankRequest,
    TeiTokenizeRequest,
)
from openai_compat.formats.encoding import as_matrix, orjson_response, truncate_dimensions
from openai_compat.formats.tokens import field_names
from openai_compat.ground.errors import BadRequest
from openai_compat.ground.families import set_family
from openai_compat.inference.embed import (
    check_count,
    check_raw_output,
    detokenize_ids,
    fit_texts,
    raw_matrix,
    tokenize_texts,
    truncate_for,
)
from openai_compat.inference.plan import Embedded, EmbedPlan, run
from openai_compat.inference.scoring import classify_pairs, classify_texts, raw_score, rerank_texts
from openai_compat.models.registry import Capability, ModelEntry

router = APIRouter(tags=["tei"])
_INPUTS = field_names("inputs")


async def _model(request: Request, capability: Capability, *, or_first: bool = False) -> ModelEntry:
    """TEI's requests name no model: the default for the capability (TEI's errors from here)."""
    set_family(request, "tei")
    return await ready_registry(request).default(capability, or_first=or_first)


async def _embed(
    request: Request,
    entry: ModelEntry,
    body: TeiEmbedRequest | TeiEmbedSparseRequest,
    dimensions: int | None = None,
    outputs: frozenset[str] | None = None,
) -> Embedded:
    """TEI's inputs, prompt and truncation (Left keeps the end) through the engine, noted."""
    plan = EmbedPlan(
        texts=body.inputs,
        param="inputs",
        names=_INPUTS,
        prompt_name=body.prompt_name,
        own_truncation=body.truncate is not None,
        truncate=body.truncate,
        fit=body.truncation_direction.lower() == "left" and body.truncate is not False,
        keep="end",
        dimensions=dimensions,
        outputs=outputs,
    )
    done = await run(entry, plan, settings_of(request))
    note(request, entry.name, done.count, done.tokens)
    return done


async def tei_embed(
    request: Request, body: TeiEmbedRequest, entry: ModelEntry | None = None
) -> Response:
    """TEI's /embed on the default embedder, or on `entry` (POST / serves its model)."""
    entry = entry or await _model(request, "embed")
    if not body.normalize:
        check_raw_output(entry)
    result = await _embed(request, entry, body, body.dimensions)
    if not body.normalize:  # the model's own output, cut to `dimensions` and left as it is
        return orjson_response(list(raw_matrix(result.vectors)[:, : body.dimensions]))
    return orjson_response(list(truncate_dimensions(as_matrix(result.vectors), body.dimensions)))


@router.post(
    "/embed_sparse",
    responses=TEI_ERROR_RESPONSES,
    openapi_extra=body_openapi(TeiEmbedSparseRequest),
)
async def embed_sparse(request: Request) -> Response:
    """TEI: SPLADE sparse vectors (or BGE-M3's lexical weights), each as [{"index",
    "value"}] (non-zero weights, ascending index), from the default sparse model."""
    entry = await _model(request, "sparse")
    return await _embed_sparse(request, entry, await read_body(request, TeiEmbedSparseRequest))


async def _embed_sparse(
    request: Request, entry: ModelEntry, body: TeiEmbedSparseRequest
) -> Response:
    lexical = frozenset({"sparse"}) if entry.outputs else None  # BGE-M3's
    result = await _embed(request, entry, body, outputs=lexical)  # checked finite there
    vectors = [v.sparse for v in result.vectors] if lexical else result.vectors
    return orjson_response(
        [
            [
                {"index": i, "value": v}
                for i, v in zip(vec.indices.tolist(), vec.values.tolist(), strict=True)
            ]
            for vec in vectors
        ]
    )


async def tei_rerank(
    request: Request, body: TeiRerankRequest, entry: ModelEntry | None = None
) -> Response:
    """TEI's /rerank on the default reranker, or on `entry` (POST / serves its model)."""
    entry = entry or await _model(request, "rerank")
    settings = settings_of(request)
    docs = body.texts
    if body.truncation_direction.lower() == "left" and entry.counter is not None:
        check_count(len(docs), settings.max_rerank_documents, "texts", "documents")
        cut = await fit_texts(
            entry, docs, prompt="", keep="end", max_tokens=None, names=field_names("texts")
        )
        docs = cut if cut is not None else docs
    result = await rerank_texts(
        entry, body.query, docs, settings, docs_param="texts", score_mode=body.score_mode
    )
    note(request, entry.name, len(docs), result.tokens)
    out: list[dict[str, Any]] = []
    for r in result.ranked:
        item: dict[str, Any] = {
            "index": r.index,
            "score": raw_score(entry, r.score) if body.raw_scores else r.score,
        }
        if body.return_text:
            item["text"] = body.texts[r.index]
        out.append(item)
    return orjson_response(out)


async def tei_tokenize(request: Request, body: TeiTokenizeRequest) -> Response:
    entry = await _model(request, "embed", or_first=True)
    single = isinstance(body.inputs, str)
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    settings = settings_of(request)
    check_count(len(texts), settings.max_inputs_per_request, "inputs")
    prompt = entry.prompts.choose(entry.name, prompt_name=body.prompt_name)
    prompted = [prompt + t for t in texts]
    rows = await tokenize_texts(
        entry, prompted, settings, add_special_tokens=body.add_special_tokens, param="inputs"
    )
    out = [_tei_tokens(row, text) for row, text in zip(rows, prompted, strict=True)]
    return orjson_response(out[:1] if single else out)


def _tei_tokens(row: list[Any], text: str) -> list[dict[str, Any]]:
    """TEI's tokens (core/src/tokenization.rs `into_tokens`): a special token is its token
    string with no offsets; any other token's `text` is the input's slice and `start`/`stop`
    are UTF-8 byte offsets into it (the tokenizer's offsets here are characters)."""
    encoded = text.encode()
    byte_at: Any = None
    if not text.isascii():  # character -> byte offset, one pass over the text
        byte_at = [0, *itertools.accumulate(len(c.encode()) for c in text)]
    tokens = []
    for token_id, token, special, (start, stop) in row:
        if special or start is None:
            tokens.append(
                {"id": token_id, "text": token, "special": True, "start": None, "stop": None}
            )
            continue
        if byte_at is not None:
            start, stop = byte_at[start], byte_at[stop]
        piece = encoded[start:stop].decode(errors="replace")
        tokens.append(
            {"id": token_id, "text": piece, "special": False, "start": start, "stop": stop}
        )
    return tokens


@router.post(
    "/predict", responses=TEI_ERROR_RESPONSES, openapi_extra=body_openapi(TeiPredictRequest)
)
async def predict(request: Request) -> Response:
    """TEI: classify a text, a [text, text] pair, or a list of texts and pairs."""
    return await _predict(request, await _model(request, "classify"))


async def _predict(request: Request, entry: ModelEntry) -> Response:
    settings = settings_of(request)
    body = await read_body(request, TeiPredictRequest)
    raw = body.inputs
    # As TEI reads it: a string, or a list of exactly two strings, is one input (a pair).
    single = isinstance(raw, str) or (len(raw) == 2 and all(isinstance(x, str) for x in raw))
    items: list[Any] = [raw] if single else list(raw)
    check_count(len(items), settings.max_inputs_per_request, "inputs")
    inputs: list[str | tuple[str, str]] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            inputs.append(item)
        elif len(item) == 1:
            inputs.append(item[0])
        elif len(item) == 2:
            inputs.append((item[0], item[1]))
        else:
            raise BadRequest(
                f"inputs[{i}] has {len(item)} texts; an input is one text or a pair.",
                param="inputs",
            )
    if all(isinstance(x, str) for x in inputs):
        texts = [x for x in inputs if isinstance(x, str)]
        result = await classify_texts(
            entry, texts, settings, raw_scores=body.raw_scores, param="inputs"
        )
        labels, tokens = result.labels, result.tokens
    else:
        labels, tokens = await classify_pairs(entry, inputs, settings, raw_scores=body.raw_scores)
    note(request, entry.name, len(inputs), tokens)
    out = [[{"score": s, "label": label} for label, s in row] for row in labels]
    return orjson_response(out[0] if single else out)


@router.post("/decode", responses=TEI_ERROR_RESPONSES, openapi_extra=body_openapi(TeiDecodeRequest))
async def decode(request: Request) -> Response:
    """TEI: token ids back to text with the model's own tokenizer."""
    entry = await _model(request, "embed", or_first=True)
    body = await read_body(request, TeiDecodeRequest)
    # ids may come as numpy arrays (bodies over 1 MiB are parsed in a worker: bodies.py)
    single = len(body.ids) == 0 or isinstance(body.ids[0], int | np.integer)
    batches: Any = [body.ids] if single else body.ids
    texts = await detokenize_ids(
        entry,
        batches,
        settings_of(request),
        skip_special_tokens=body.skip_special_tokens,
        param="ids",
    )
    return orjson_response(texts)


@router.get("/info", responses=TEI_ERROR_RESPONSES)
async def info(request: Request) -> Response:
    """TEI: what the default model is and the limits requests meet."""
    set_family(request, "tei")
    registry, settings = ready_registry(request), settings_of(request)
    # the first model the caller may see, resolved (scope, lease, lazy load), never read off
    # the registry's listing
    entry = await registry.first()
    if "embed" in entry.capabilities and not entry.multivector:
        entry = await registry.default("embed")
        model_type: dict[str, Any] = {"embedding": {"pooling": "mean"}}
    else:
        kind = "reranker" if "rerank" in entry.capabilities else "classifier"
        id2label = entry.engine.labels()
        label2id = {label: int(i) for i, label in id2label.items() if i.isdigit()}
        model_type = {kind: {"id2label": id2label, "label2id": label2id}}
    return orjson_response(
        {
            "model_id": entry.config.model,
            "model_sha": entry.config.revision,
            "model_dtype": entry.config.dtype,
            "model_type": model_type,
            "max_concurrent_requests": settings.max_queued_inputs or 512,
            "max_input_length": entry.max_length or 512,
            "max_batch_tokens": (entry.max_length or 512) * entry.config.batch_size,
            "max_batch_requests": None,
            "max_client_batch_size": settings.max_inputs_per_request,
            "auto_truncate": truncate_for(entry, settings),
            "tokenization_workers": 1,
            "version": __version__,
            "served_model_name": entry.name,
            "prompts": dict(entry.prompts.prompts) or None,
            "default_prompt": entry.prompts.default,
        }
    )


@router.post(
    "/",
    responses=TEI_ERROR_RESPONSES,
    openapi_extra=body_openapi(TeiEmbedRequest, TeiRerankRequest),
)
async def root(request: Request) -> Response:
    """TEI: POST / does what the (default) model does: embed, rerank or predict."""
    set_family(request, "tei")
    # resolved like every route's model (scope, lease, lazy load): the first the caller sees
    first = await ready_registry(request).first()
    if first.sparse:
        return await _embed_sparse(request, first, await read_body(request, TeiEmbedSparseRequest))
    if "embed" in first.capabilities and not first.multivector:
        return await tei_embed(request, await read_body(request, TeiEmbedRequest), first)
    if "rerank" in first.capabilities:
        return await tei_rerank(request, await read_body(request, TeiRerankRequest), first)
    return await _predict(request, ready_registry(request).check(first, first.name, "classify"))
