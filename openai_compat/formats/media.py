"""Fetching user-supplied media safely: http(s) URLs and data: URIs -> decoded images/audio.

User URLs are an attack surface (SSRF). By default a URL whose host resolves to a loopback,
private, link-local, multicast, reserved or unspecified address is refused: the check runs on
the addresses the connection will actually use (a resolver that filters them, so DNS
rebinding cannot slip between check and connect), on IP literals in every spelling the system
resolver accepts (`127.1`, `2130706433`, `0x7f.1`, `0177.0.0.1`, IPv4 inside IPv6), and again
on every redirect, which are followed by hand. Each item has a byte cap, images a pixel cap
checked before decoding and audio a duration cap; one deadline covers a whole fetch with its
redirects. Items of a request are fetched and decoded as one task group: when one fails, the
others are cancelled. Every failure is a 400 that names the input's index.

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urljoin, urlsplit

from openai_compat.formats.addresses import RefusedAddress, canonical_ip, is_public_address
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
        concurrency: int = 16,
        decoders: int = 2,
    ) -> None:
        self.allow_private = allow_private
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.limits = MediaLimits(max_pixels, max_audio_seconds)
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
        self, items: Sequence[str], modality: Modality, sampling_rate: int | None = None
    ) -> list[Any]:
        """Every item fetched and decoded concurrently; the first failure is a 400 and cancels
        the other items' fetches and pending decodes."""
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(self._one(i, item, modality, sampling_rate))
                    for i, item in enumerate(items)
                ]
        except BaseExceptionGroup as failed:
            raise _first_error(failed) from None
        return [t.result() for t in tasks]

    async def _one(
        self, index: int, item: str, modality: Modality, sampling_rate: int | None
    ) -> Any:
        if item.startswith("data:"):
            raw = self._data_uri(index, item)
        else:
            async with self._limit:
                raw = await self._download(index, item)
        decode = functools.partial(_decode, index, raw, modality, sampling_rate, self.limits)
        return await asyncio.get_running_loop().run_in_executor(self._decoders, decode)

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
                f"{host} is {ip}, not a public address; refusing to fetch",
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
                    index, f"{refused}; refusing to fetch", "refused_address"
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
    return f"the image is {dims}; at most {limits.max_pixels} pixels are decoded"


# The image formats decoded (Pillow's names): what browsers, SDKs and scanners send.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
# What an image was before decoding (Cohere's embed responses report it), kept in img.info.
IMAGE_META = "openai_compat_meta"
_BIT_DEPTHS = {"1": 1, "I;16": 16, "I;16B": 16, "I;16L": 16, "I": 32, "F": 32}


def _decode(
    index: int, raw: bytes, modality: Modality, sampling_rate: int | None, limits: MediaLimits
) -> Any:
    """Validate (and for images, decode) media before it reaches the engine."""
    if modality == "image":
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
        try:
            img.load()
        except Exception:
            raise MediaError(index, "the content is not an image we can decode") from None
        if img.width < 3 or img.height < 3:
            raise MediaError(index, f"the image is {img.width}x{img.height}; at least 3x3")
        meta = {
            "width": img.width,
            "height": img.height,
            "format": (img.format or "unknown").lower(),
            "bit_depth": _BIT_DEPTHS.get(img.mode, 8),
        }
        out = img.convert("RGB") if img.mode not in ("RGB", "L") else img
        out.info[IMAGE_META] = meta
        return out
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
