"""Fetching user-supplied media safely: http(s) URLs and data: URIs -> decoded images/audio.

User URLs are an attack surface (SSRF). By default a URL whose host resolves to a loopback,
private, link-local, multicast, reserved or unspecified address is refused: the check runs on
the addresses the connection will actually use (a resolver that filters them, so DNS
rebinding cannot slip between check and connect), on IP literals in every spelling the system
resolver accepts (`127.1`, `2130706433`, `0x7f.1`, `0177.0.0.1`, IPv4 inside IPv6), and again
on every redirect, which are followed by hand. Each item has a byte cap, images a pixel cap
checked before decoding and audio a duration cap; one deadline covers a whole fetch with its
redirects. Items of a request are fetched as one task group: when one fails, the others are
cancelled. Every failure is a 400 that names the input's index.

Memory: a few KB of PNG or WEBP can declare a 16-megapixel page, so what decoding costs is
bounded before any decode. A request's images are read from their headers first and their
pixels summed against a per-request budget (`max_request_pixels`); then they are decoded one
at a time on a small pool, each shrunk as it is decoded to twice the shortest side the model's
processor keeps (JPEG's DCT draft mode, then a whole-factor box reduce), so a request holds one
full-size image at most and the processor never copies a page at full size. Heap that decoding
freed is handed back to the system after a large request (glibc keeps it otherwise).

The address rules are in addresses.py; the connection (aiohttp, loaded on the first URL
fetched) in media_client.py.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import functools
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urljoin, urlsplit

from openai_compat.formats.addresses import RefusedAddress, canonical_ip, is_public_address
from openai_compat.ground import heap
from openai_compat.ground.errors import BadRequest

if TYPE_CHECKING:
    import aiohttp

Modality = Literal["image", "audio"]

_REDIRECTS = {301, 302, 303, 307, 308}
_MAX_REDIRECTS = 5
_CHUNK = 64 * 1024
_DNS_TTL = 30  # seconds a resolved (and checked) name is reused


class MediaError(BadRequest):
    """Item `index` of a request's media cannot be used; routes rename it to their field
    (`renamed`)."""

    def __init__(self, index: int, message: str, code: str = "invalid_media") -> None:
        super().__init__(f"input[{index}]: {message}", param="input", code=code)
        self.index = index
        self.detail = message

    def renamed(self, param: str, label: str) -> BadRequest:
        return BadRequest(f"{label}: {self.detail}", param=param, code=self.code)


def _refusal(exc: BaseException) -> RefusedAddress | None:
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, RefusedAddress):
            return e
        stack += [e.__cause__, e.__context__, getattr(e, "os_error", None)]
    return None


@dataclass(frozen=True)
class MediaLimits:
    """What decoding checks from a file's header (byte caps are checked while fetching)."""

    max_pixels: int
    max_audio_seconds: float
    max_request_pixels: int = 67_108_864


# Past this many pixels decoded in one request, the heap it freed is trimmed afterwards
# (a 2-megapixel RGB image is 6 MB; glibc keeps freed blocks under its 32 MiB mmap threshold).
_TRIM_AFTER_PIXELS = 2_000_000


class MediaFetcher:
    """One per app: a pooled HTTP client, a decoding pool, and the fetch rules from settings."""

    def __init__(
        self,
        *,
        allow_private: bool,
        max_bytes: int,
        timeout: float,
        max_pixels: int = 16_777_216,
        max_audio_seconds: float = 60.0,
        max_request_pixels: int = 67_108_864,
        concurrency: int = 16,
        decoders: int = 2,
    ) -> None:
        self.allow_private = allow_private
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.limits = MediaLimits(max_pixels, max_audio_seconds, max_request_pixels)
        self._limit = asyncio.Semaphore(concurrency)
        self._session: aiohttp.ClientSession | None = None
        # Decoding has a pool of its own: big images cannot starve the shared thread pool
        # (DNS lookups, token counting) and the decoders in flight stay bounded.
        self._decoders = concurrent.futures.ThreadPoolExecutor(
            decoders, thread_name_prefix="media-decode"
        )

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            from openai_compat.formats.media_client import new_session  # aiohttp: on first use

            self._session = new_session(
                allow_private=self.allow_private, timeout=self.timeout, dns_ttl=_DNS_TTL
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        self._decoders.shutdown(wait=False, cancel_futures=True)

    async def fetch_all(
        self,
        items: Sequence[str],
        modality: Modality,
        sampling_rate: int | None = None,
        image_side: int | None = None,
    ) -> list[Any]:
        """Every item fetched (concurrently: the first failure is a 400 and cancels the other
        fetches), then checked from its header and decoded one at a time. `image_side`: the
        shortest side the model's processor keeps (images are shrunk towards it as they are
        decoded; None: decoded at full size)."""
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self._raw(i, item)) for i, item in enumerate(items)]
        except BaseExceptionGroup as failed:
            raise _first_error(failed) from None
        raws = [t.result() for t in tasks]
        loop = asyncio.get_running_loop()
        if modality == "audio":
            return [
                await loop.run_in_executor(
                    self._decoders, _decode_audio, i, raw, sampling_rate, self.limits
                )
                for i, raw in enumerate(raws)
            ]
        # Headers first: nothing is decoded for a request over its budget.
        pixels = await loop.run_in_executor(self._decoders, _image_pixels, raws, self.limits)
        images = []
        try:
            for i in range(len(raws)):
                decode = functools.partial(_decode_image, i, raws[i], self.limits, image_side)
                images.append(await loop.run_in_executor(self._decoders, decode))
                raws[i] = b""  # a file's bytes go as soon as its image is made
        finally:
            if pixels >= _TRIM_AFTER_PIXELS:  # full-size decodes freed what glibc would keep
                loop.run_in_executor(self._decoders, heap.trim)
        return images

    async def _raw(self, index: int, item: str) -> bytes:
        if item.startswith("data:"):
            return self._data_uri(index, item)
        async with self._limit:
            return await self._download(index, item)

    def _data_uri(self, index: int, uri: str) -> bytes:
        header, sep, payload = uri[5:].partition(",")
        if not sep or not header.endswith(";base64"):
            raise MediaError(index, "a data: URI must look like data:<type>;base64,<data>")
        if len(payload) * 3 // 4 > self.max_bytes + 3:
            raise MediaError(index, f"media is larger than {self.max_bytes} bytes", "too_large")
        try:
            raw = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise MediaError(index, "the data: URI's base64 content does not decode") from None
        if len(raw) > self.max_bytes:
            raise MediaError(index, f"media is larger than {self.max_bytes} bytes", "too_large")
        return raw

    def _check_url(self, index: int, url: str) -> None:
        try:
            parts = urlsplit(url)
            scheme, host = parts.scheme, parts.hostname
        except ValueError:  # e.g. an invalid IPv6 literal
            scheme, host = "", None
        if scheme not in ("http", "https") or not host:
            raise MediaError(index, "media must be an http(s) URL or a data: URI")
        ip = canonical_ip(host)
        if ip is None:
            return  # a name: the resolver checks what it resolves to
        if not self.allow_private and not is_public_address(str(ip)):
            raise MediaError(
                index,
                f"{host} is {ip}, not a public address; refusing to fetch (a server on a "
                "trusted network may allow it: --allow-private-media-urls)",
                "refused_address",
            )

    async def _download(self, index: int, url: str) -> bytes:
        from openai_compat.formats.media_client import ClientError

        try:
            # One deadline for the whole fetch: every redirect hop shares it.
            async with asyncio.timeout(self.timeout):
                return await self._follow(index, url)
        except MediaError:
            raise
        except TimeoutError:
            raise MediaError(index, f"fetching took longer than {self.timeout:g}s") from None
        except (ClientError, OSError, ValueError) as exc:
            refused = _refusal(exc)
            if refused is not None:
                raise MediaError(
                    index,
                    f"{refused}; refusing to fetch (a server on a trusted network may allow "
                    "it: --allow-private-media-urls)",
                    "refused_address",
                ) from None
            raise MediaError(
                index, f"the URL could not be fetched ({type(exc).__name__})"
            ) from None

    async def _follow(self, index: int, url: str) -> bytes:
        for _ in range(_MAX_REDIRECTS + 1):
            self._check_url(index, url)
            async with self._client().get(url, allow_redirects=False) as resp:
                if resp.status in _REDIRECTS and "Location" in resp.headers:
                    url = urljoin(url, resp.headers["Location"])
                    continue
                if resp.status != 200:
                    raise MediaError(index, f"fetching the URL answered HTTP {resp.status}")
                if resp.content_length is not None and resp.content_length > self.max_bytes:
                    raise MediaError(
                        index, f"media is larger than {self.max_bytes} bytes", "too_large"
                    )
                data = bytearray()
                async for chunk in resp.content.iter_chunked(_CHUNK):
                    data += chunk
                    if len(data) > self.max_bytes:
                        raise MediaError(
                            index, f"media is larger than {self.max_bytes} bytes", "too_large"
                        )
                return bytes(data)
        raise MediaError(index, f"more than {_MAX_REDIRECTS} redirects")


def _first_error(group: BaseExceptionGroup) -> BaseException:
    """The error that failed a task group (the siblings were cancelled because of it)."""
    first = group.exceptions[0]
    return _first_error(first) if isinstance(first, BaseExceptionGroup) else first


def _too_many_pixels(size: tuple[int, int] | None, limits: MediaLimits) -> str:
    dims = f"{size[0]}x{size[1]} pixels" if size else "larger than Pillow's own limit"
    return (
        f"the image is {dims}; at most {limits.max_pixels} pixels are decoded (the server's "
        "--max-media-pixels): scale it down (a page at 150 dpi is plenty)"
    )


# The image formats decoded (Pillow's names): what browsers, SDKs and scanners send.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
# What an image was before decoding (Cohere's embed responses report it), kept in img.info.
IMAGE_META = "openai_compat_meta"
_BIT_DEPTHS = {"1": 1, "I;16": 16, "I;16B": 16, "I;16L": 16, "I": 32, "F": 32}


def _open_image(index: int, raw: bytes, limits: MediaLimits) -> Any:
    """The image's header read (nothing decoded), its size checked against the per-image cap."""
    from PIL import Image

    try:
        # only the formats the server accepts: Pillow's rarer decoders (PSD, FITS, PCF...)
        # were this year's vectors, and no client sends them
        img = Image.open(io.BytesIO(raw), formats=IMAGE_FORMATS)  # reads the header only
    except Image.DecompressionBombError:  # Pillow's own, far higher, limit
        raise MediaError(index, _too_many_pixels(None, limits), "too_large") from None
    except Exception:
        raise MediaError(
            index,
            f"the content is not an image we can decode (accepted: {', '.join(IMAGE_FORMATS)})",
        ) from None
    # A few KiB of PNG can declare gigapixels: check the size before decoding anything.
    if img.width * img.height > limits.max_pixels:
        raise MediaError(index, _too_many_pixels(img.size, limits), "too_large")
    return img


def _image_pixels(raws: Sequence[bytes], limits: MediaLimits) -> int:
    """The pixels a request's images declare, summed from their headers; over the request's
    budget a 400 names the image that crossed it and the option."""
    total = 0
    for i, raw in enumerate(raws):
        img = _open_image(i, raw, limits)
        total += img.width * img.height
        img.close()
        if total > limits.max_request_pixels:
            raise MediaError(
                i,
                f"the request's images come to {total} pixels by this one; at most "
                f"{limits.max_request_pixels} are decoded for one request (the server's "
                "--max-request-pixels): send fewer or smaller images a request",
                "too_large",
            )
    return total


def _decode_image(index: int, raw: bytes, limits: MediaLimits, side: int | None) -> Any:
    """One image decoded, in RGB or L, shrunk as it is decoded towards twice `side` (the
    shortest side the model's processor keeps) and never below: the processor's own
    resampling still does the last step of at least 2x, so what it makes stays within float
    noise of what it makes from the whole image (a box filter all the way down would not)."""
    img = _open_image(index, raw, limits)
    meta = {
        "width": img.width,
        "height": img.height,
        "format": (img.format or "unknown").lower(),
        "bit_depth": _BIT_DEPTHS.get(img.mode, 8),
    }
    keep = 2 * side if side else 0
    if keep and min(img.size) >= 2 * keep:
        # JPEG decodes at 1/2, 1/4 or 1/8 scale in its DCT (never below the size asked)
        scale = keep / min(img.size)
        img.draft(None, (math.ceil(img.width * scale), math.ceil(img.height * scale)))
    try:
        img.load()
    except Exception:
        raise MediaError(index, "the content is not an image we can decode") from None
    if img.width < 3 or img.height < 3:
        raise MediaError(index, f"the image is {img.width}x{img.height}; at least 3x3")
    out = img.convert("RGB") if img.mode not in ("RGB", "L") else img
    factor = min(out.size) // keep if keep else 1
    if factor >= 2:  # a whole-factor box filter: every source pixel counted
        out = out.reduce(factor)
    out.info[IMAGE_META] = meta
    return out


def _decode_audio(
    index: int, raw: bytes, sampling_rate: int | None, limits: MediaLimits
) -> DecodedAudio:
    """Validate an audio file from its header, then decode it."""
    import soundfile

    try:
        info = soundfile.info(io.BytesIO(raw))
    except Exception:
        raise MediaError(index, "the content is not an audio file we can decode") from None
    if info.samplerate <= 0 or info.frames / info.samplerate > limits.max_audio_seconds:
        seconds = info.frames / info.samplerate if info.samplerate > 0 else float("inf")
        raise MediaError(
            index,
            f"the audio is {seconds:.1f} s long; at most {limits.max_audio_seconds:g} s",
            "too_large",
        )
    if sampling_rate and info.samplerate != sampling_rate:
        raise MediaError(
            index, f"audio is sampled at {info.samplerate} Hz; this model needs {sampling_rate} Hz"
        )
    try:  # a header can be sound over a body that is not (it is read only now)
        return DecodedAudio.of(raw)
    except Exception:
        raise MediaError(index, "the content is not an audio file we can decode") from None


class DecodedAudio(bytes):
    """An audio file's bytes (what infinity-emb takes), decoded once when it was validated:
    its mono float32 samples and their rate (what sentence-transformers' preprocess takes)."""

    samples: Any
    rate: int

    @classmethod
    def of(cls, raw: bytes) -> DecodedAudio:
        import soundfile

        samples, rate = soundfile.read(io.BytesIO(raw), dtype="float32", always_2d=True)
        audio = cls(raw)
        audio.samples, audio.rate = samples.mean(axis=1), int(rate)
        return audio
