"""Images and audio through the engine: fetched and decoded safely (formats/media.py), each
a vector (a VLM's image and (image, text) pairs through its messages; ColPali's page images
on its document side), counted as the model sees them, a key's tokens taken first."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

from openai_compat.engine.priority import counted_by_engine
from openai_compat.formats.media import IMAGE_META, MediaError, MediaFetcher, Modality
from openai_compat.formats.tokens import Names, input_names
from openai_compat.frame.settings import Settings
from openai_compat.inference.embed import EmbedResult, check_count, engine_errors
from openai_compat.models.registry import ModelEntry
from openai_compat.tenants.limits import reserve_tokens


async def embed_media(
    entry: ModelEntry,
    items: Sequence[str | tuple[str, str]],
    modality: Modality,
    settings: Settings,
    fetcher: MediaFetcher,
    names: Names = input_names,
    prompt: str | None = None,
) -> EmbedResult:
    """Embed images or audio given as http(s) URLs or data: URIs (fetched safely first), or
    (image, text) pairs for a model that renders messages (one vector each, the library's
    embedding of {"image", "text"}); errors name item i as `names(i)`. `prompt`: such a
    model's system prompt."""
    param, _ = names(0)
    check_count(len(items), settings.max_media_items, param, "media items")
    rate = entry.sampling_rate if modality == "audio" else None
    urls = [item[0] if isinstance(item, tuple) else item for item in items]
    with entry.admit(len(items), settings.max_queued_inputs):
        try:
            payloads = await fetcher.fetch_all(urls, modality, rate, entry.image_side)
        except MediaError as exc:
            raise exc.renamed(*names(exc.index)) from None
        inputs = [
            {"image": p, "text": item[1]} if isinstance(item, tuple) else p
            for p, item in zip(payloads, items, strict=True)
        ]
        counted = modality == "image" and (entry.messages or entry.multivector)
        if modality == "image" and not counted:  # a ViT's: what usage will count
            await reserve_tokens(entry.image_tokens * len(items))
        # a VLM's or a page retriever's count is its processor's (image tokens, template):
        # the engine takes it once the inputs are prepared, before they queue
        with engine_errors(), counted_by_engine() if counted else nullcontext():
            vectors, used = await _media_engine_call(entry, modality, inputs, prompt)
    # infinity-emb counts characters of an internal repr for media; report what the model
    # sees instead: patches per image for a ViT, the processor's tokens (image tokens and
    # template) for a VLM or ColPali, and no tokens for audio.
    if modality == "image":
        media = [p.info.get(IMAGE_META, {}) for p in payloads]
        return EmbedResult(
            vectors, int(used) if counted else entry.image_tokens * len(items), media
        )
    return EmbedResult(vectors, 0)


async def _media_engine_call(
    entry: ModelEntry, modality: Modality, inputs: list[Any], prompt: str | None
) -> tuple[Any, int]:
    if modality == "image":
        options = {"prompt": prompt} if prompt and entry.messages else {}
        vectors, used = await entry.engine.image_embed(images=inputs, **options)
    else:
        vectors, used = await entry.engine.audio_embed(audios=inputs)
    return vectors, used
