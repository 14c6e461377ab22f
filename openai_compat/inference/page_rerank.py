"""Rerank where documents are page images or image+text items (jina-reranker-m0's shape),
beside plain texts: a text query against them, scored as each kind of model scores.

- a multi-vector model (ColPali, ColQwen2): the query on its query side, each document on its
  document side (page images as `encode_document` takes them), scored by MaxSim as the
  library's `similarity` scores them;
- a vision-language embedder (one vector each): cosine of the query's vector (its query
  prompt) and each document's (its document prompt), mapped to [0, 1] as for text;
- a multimodal cross-encoder (an image-text-to-text model with a yes/no head): each (query,
  document) pair through `CrossEncoder.predict`'s stages, its sigmoid.

Images are fetched and decoded as every media input is (formats/media.py, its limits); the
documents come in as `Document`s from the dialect (api/items.py says which a model takes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from openai_compat.engine.priority import counted_by_engine
from openai_compat.formats.media import MediaError, MediaFetcher
from openai_compat.formats.tokens import field_names
from openai_compat.frame.settings import Settings
from openai_compat.ground.errors import BadRequest, InputTooLong
from openai_compat.inference.embed import check_count, embed_texts, engine_errors, truncate_for
from openai_compat.inference.media import embed_media
from openai_compat.inference.scoring import RankedDocument, RerankResult, finite_scores
from openai_compat.models.registry import ModelEntry


@dataclass(frozen=True)
class Document:
    """A rerank document: a text, an image (URL or data: URI), or both."""

    text: str | None = None
    image: str | None = None


async def rerank_documents(
    entry: ModelEntry,
    query: str,
    docs: Sequence[Document],
    settings: Settings,
    fetcher: MediaFetcher,
    docs_param: str = "documents",
) -> RerankResult:
    """Every document's score against `query`, best first (ties in the client's order)."""
    check_count(len(docs), settings.max_rerank_documents, docs_param, "documents")
    images = sum(d.image is not None for d in docs)
    check_count(images, settings.max_media_items, docs_param, "images")
    if entry.multivector or entry.cosine_rerank:
        scores, tokens = await _by_vectors(entry, query, docs, settings, fetcher, docs_param)
    elif "rerank" in entry.capabilities and "image" in entry.modalities:
        scores, tokens = await _by_pairs(entry, query, docs, settings, fetcher, docs_param)
    else:
        raise BadRequest(
            f"Model {entry.name!r} cannot rank images; it ranks text documents.",
            param=docs_param,
            code="unsupported_input",
        )
    finite_scores(entry, scores)
    order = np.lexsort((np.arange(len(docs)), -scores))
    return RerankResult([RankedDocument(int(i), float(scores[i])) for i in order], tokens)


async def _by_vectors(
    entry: ModelEntry,
    query: str,
    docs: Sequence[Document],
    settings: Settings,
    fetcher: MediaFetcher,
    docs_param: str,
) -> tuple[np.ndarray, int]:
    """Query and documents embedded on their sides; MaxSim or cosine."""
    side = entry.prompts.choose
    names = field_names(docs_param)
    asked = await embed_texts(
        entry,
        [query],
        settings,
        lambda i: ("query", "query"),
        prompt=side(entry.name, input_type="query"),
    )
    texts = [i for i, d in enumerate(docs) if d.image is None]
    pictured = [i for i, d in enumerate(docs) if d.image is not None]
    vectors: list[np.ndarray | None] = [None] * len(docs)
    tokens = asked.tokens
    if texts:
        given = await embed_texts(
            entry,
            [docs[i].text or "" for i in texts],
            settings,
            lambda k: names(texts[k]),
            prompt=side(entry.name, input_type="document"),
        )
        tokens += given.tokens
        for i, v in zip(texts, given.vectors, strict=True):
            vectors[i] = np.asarray(v, dtype=np.float32)
    if pictured:
        items: list[str | tuple[str, str]] = []
        for i in pictured:
            image, text = docs[i].image, docs[i].text
            assert image is not None
            items.append(image if text is None else (image, text))
        system = entry.prompts.for_media(entry.name) if entry.messages else None
        shown = await embed_media(
            entry, items, "image", settings, fetcher, lambda k: names(pictured[k]), system
        )
        tokens += shown.tokens
        for i, v in zip(pictured, shown.vectors, strict=True):
            vectors[i] = np.asarray(v, dtype=np.float32)
    q = np.asarray(asked.vectors[0], dtype=np.float32)
    if entry.multivector:
        scores = [float((q @ np.asarray(d).T).max(axis=1).sum()) for d in vectors]
        return np.asarray(scores, dtype=np.float64), tokens
    matrix = np.stack([np.asarray(d) for d in vectors]).astype(np.float64)
    norms = np.maximum(
        np.linalg.norm(matrix, axis=1) * np.linalg.norm(q), np.finfo(np.float64).tiny
    )
    cos = (matrix @ q.astype(np.float64)) / norms
    return np.clip((cos + 1.0) / 2.0, 0.0, 1.0), tokens


async def _fit_pair_query(entry: ModelEntry, query: str, truncate: bool) -> str:
    """A multimodal rerank's query, fitted once before it is paired with every document: at
    most half the model's window (the document's image tokens, its text and the chat template
    take the rest; a processor that finds its image tokens cut refuses the pair), past it
    refused where truncation is off, else cut there. A huge query is tokenized once, not once
    per document on the model's preparation thread."""
    counter, limit = entry.counter, entry.max_length
    if counter is None or limit is None:
        return query
    room = max(1, limit // 2)
    (tokens,) = await counter.lengths([query])
    if tokens <= room:
        return query
    if not truncate:
        raise InputTooLong(
            ("query", "query"),
            None,
            room,
            "let the server truncate it (beside an image, a query has half the model's window).",
        )
    (cut,) = await counter.truncate_texts([query], room)
    return cut


async def _by_pairs(
    entry: ModelEntry,
    query: str,
    docs: Sequence[Document],
    settings: Settings,
    fetcher: MediaFetcher,
    docs_param: str,
) -> tuple[np.ndarray, int]:
    """(query, document) pairs through a multimodal cross-encoder: its sigmoid scores."""
    pictured = [i for i, d in enumerate(docs) if d.image is not None]
    urls = [docs[i].image or "" for i in pictured]
    query = await _fit_pair_query(entry, query, truncate_for(entry, settings))
    with entry.admit(len(docs), settings.max_queued_inputs):
        try:
            payloads = await fetcher.fetch_all(urls, "image", image_side=entry.image_side)
        except MediaError as exc:
            raise exc.renamed(docs_param, f"{docs_param}[{pictured[exc.index]}]") from None
        given: list[object] = [d.text or "" for d in docs]
        for i, image in zip(pictured, payloads, strict=True):
            text = docs[i].text
            given[i] = image if text is None else {"image": image, "text": text}
        # the pairs' tokens (image tokens, the template) are the processor's: the engine
        # takes them once it has prepared the pairs, before they queue
        with engine_errors(), counted_by_engine():
            results, tokens = await entry.engine.rerank(query=query, docs=given)
    scores = np.zeros(len(docs), dtype=np.float64)
    for r in results:
        scores[r.index] = float(r.relevance_score)
    return scores, int(tokens)
