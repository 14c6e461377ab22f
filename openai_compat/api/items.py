"""Content items, as Jina's embeddings and rerankers and Cohere's Embed v4 send them: a text, an
image, or an image with a text, each at its place in the request. One translation into the
plan's fields for every dialect (texts and media apart, each with its client index), with the
refusals a model's inputs call for, naming the item (`input[1]`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from openai_compat.ground.errors import BadRequest
from openai_compat.inference.page_rerank import Document
from openai_compat.models.registry import ModelEntry

# Bare base64 (Jina's `image` takes it besides URLs and data: URIs) becomes a data: URI.
_URL_SCHEMES = ("http://", "https://", "data:")


def media_url(image: str) -> str:
    """An item's image as the media fetcher takes it: a URL or data: URI as given, bare
    base64 wrapped in a data: URI (its bytes are checked when decoded)."""
    if image.startswith(_URL_SCHEMES) or "://" in image[:16]:
        return image
    return "data:application/octet-stream;base64," + image


def check_image(entry: ModelEntry, label: str, param: str, paired: bool = False) -> None:
    """An image (or an image with a text) is something this model can take, or a 400."""
    if "image" not in entry.modalities:
        raise BadRequest(
            f"{label}: model {entry.name!r} takes text only; it cannot embed images.",
            param=param,
            code="unsupported_input",
        )
    if paired and not entry.messages:
        raise BadRequest(
            f"{label}: model {entry.name!r} embeds an image or a text, not the two as one "
            "input (a vision-language model does).",
            param=param,
            code="unsupported_input",
        )


def item_plan(
    entry: ModelEntry,
    items: Sequence[Any],
    param: str,
) -> dict[str, Any]:
    """The plan's inputs for items with `.text` and `.image` (either or both): texts and
    media with their client indices, and names for errors (`param[i]`)."""
    texts: list[str] = []
    text_at: list[int] = []
    media: list[str | tuple[str, str]] = []
    media_at: list[int] = []
    for i, item in enumerate(items):
        label = f"{param}[{i}]"
        if item.image is None and item.text is None:
            raise BadRequest(f"{label} has neither 'text' nor 'image'.", param=param)
        if item.image is None:
            texts.append(item.text)
            text_at.append(i)
            continue
        check_image(entry, label, param, paired=item.text is not None)
        url = media_url(item.image)
        media.append(url if item.text is None else (url, item.text))
        media_at.append(i)
    return {
        "texts": texts or None,
        "text_at": text_at,
        "media": media or None,
        "media_at": media_at,
        "modality": "image",
        "param": param,
        "names": lambda k: (param, f"{param}[{text_at[k]}]"),
        "media_names": lambda k: (param, f"{param}[{media_at[k]}]"),
    }


def image_documents(
    entry: ModelEntry, documents: Sequence[Any], rank_fields: Sequence[str] | None
) -> list[Document] | None:
    """Rerank documents with images among them ({"image": ...} or {"image": ..., "text":
    ...} objects beside strings: jina-reranker-m0's shape), checked against the model; None
    when there is no image (the text path ranks them)."""
    if rank_fields or not any(isinstance(d, dict) and "image" in d for d in documents):
        return None
    docs = []
    for i, doc in enumerate(documents):
        if isinstance(doc, str):
            docs.append(Document(text=doc))
            continue
        label = f"documents[{i}]"
        image, text = doc.get("image"), doc.get("text")
        if (image is not None and not isinstance(image, str)) or (
            text is not None and not isinstance(text, str)
        ):
            raise BadRequest(f"{label}: 'image' and 'text' must be strings.", param=label)
        if image is None and text is None:
            raise BadRequest(f"{label} has neither 'text' nor 'image'.", param=label)
        if image is not None:
            check_image(entry, label, label, paired=text is not None)
        docs.append(Document(text=text, image=None if image is None else media_url(image)))
    return docs
