"""Fetching user-supplied media safely: http(s) URLs and data: URIs -> decoded images/audio.

User URLs are an attack surface (SSRF). By default a URL whose host resolves to a loopback,
private, link-local, multicast, reserved or unspecified address is refused: the check runs on
the addresses the connection will actually use (a resolver that filters them, so DNS
rebinding cannot slip between check and connect), on IP literals, and again on every
redirect, which are followed by hand. Each item has a size cap and the whole fetch a time
limit; every failure is a 400 that names the input's index.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import ipaddress
import socket
from collections.abc import Sequence
from typing import Any, Literal
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from openai_compat.errors import BadRequest

Modality = Literal["image", "audio"]

_REDIRECTS = {301, 302, 303, 307, 308}
_MAX_REDIRECTS = 5
_CHUNK = 64 * 1024


class MediaError(BadRequest):
    def __init__(self, index: int, message: str, code: str = "invalid_media") -> None:
        super().__init__(f"input[{index}]: {message}", param="input", code=code)


class RefusedAddress(OSError):
    """A media URL's host is (or resolves to) an address we do not fetch from."""

    def __init__(self, host: str, address: str) -> None:
        super().__init__(f"{host} resolves to {address}, a non-public address")
        self.host = host
        self.address = address


def is_public_address(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return bool(ip.is_global) and not ip.is_multicast and not ip.is_reserved


class GuardedResolver(AbstractResolver):
    """Resolves like aiohttp's default, then refuses non-public addresses."""

    def __init__(self, allow_private: bool) -> None:
        self._inner = ThreadedResolver()
        self._allow_private = allow_private

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        infos = await self._inner.resolve(host, port, family)
        if not self._allow_private:
            for info in infos:
                if not is_public_address(info["host"]):
                    raise RefusedAddress(host, info["host"])
        return infos

    async def close(self) -> None:
        await self._inner.close()


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


class MediaFetcher:
    """One per app: a pooled HTTP client plus the fetch rules from the settings."""

    def __init__(
        self, *, allow_private: bool, max_bytes: int, timeout: float, concurrency: int = 16
    ) -> None:
        self.allow_private = allow_private
        self.max_bytes = max_bytes
        self.timeout = timeout
        self._limit = asyncio.Semaphore(concurrency)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                resolver=GuardedResolver(self.allow_private), limit=64, ttl_dns_cache=None
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                headers={"User-Agent": "openai-compat media fetcher"},
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def fetch_all(
        self, items: Sequence[str], modality: Modality, sampling_rate: int | None = None
    ) -> list[Any]:
        """Every item fetched and decoded concurrently; the first failure is a 400."""
        return list(
            await asyncio.gather(
                *(self._one(i, item, modality, sampling_rate) for i, item in enumerate(items))
            )
        )

    async def _one(
        self, index: int, item: str, modality: Modality, sampling_rate: int | None
    ) -> Any:
        if item.startswith("data:"):
            raw = self._data_uri(index, item)
        else:
            async with self._limit:
                raw = await self._download(index, item)
        return await asyncio.to_thread(_decode, index, raw, modality, sampling_rate)

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
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise MediaError(index, "media must be an http(s) URL or a data: URI")
        host = parts.hostname
        try:
            ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return  # a name: the resolver checks what it resolves to
        if not self.allow_private and not is_public_address(host):
            raise MediaError(
                index, f"{host} is not a public address; refusing to fetch", "refused_address"
            )

    async def _download(self, index: int, url: str) -> bytes:
        session = self._client()
        try:
            for _ in range(_MAX_REDIRECTS + 1):
                self._check_url(index, url)
                async with session.get(url, allow_redirects=False) as resp:
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
        except MediaError:
            raise
        except TimeoutError:
            raise MediaError(index, f"fetching took longer than {self.timeout:g}s") from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            refused = _refusal(exc)
            if refused is not None:
                raise MediaError(
                    index, f"{refused}; refusing to fetch", "refused_address"
                ) from None
            raise MediaError(
                index, f"the URL could not be fetched ({type(exc).__name__})"
            ) from None


def _decode(index: int, raw: bytes, modality: Modality, sampling_rate: int | None) -> Any:
    """Validate (and for images, decode) media before it reaches the engine."""
    if modality == "image":
        from PIL import Image

        try:
            img = Image.open(io.BytesIO(raw))
            img.load()
        except Exception:
            raise MediaError(index, "the content is not an image we can decode") from None
        if img.width < 3 or img.height < 3:
            raise MediaError(index, f"the image is {img.width}x{img.height}; at least 3x3")
        return img.convert("RGB") if img.mode not in ("RGB", "L") else img
    import soundfile

    try:
        info = soundfile.info(io.BytesIO(raw))
    except Exception:
        raise MediaError(index, "the content is not an audio file we can decode") from None
    if sampling_rate and info.samplerate != sampling_rate:
        raise MediaError(
            index, f"audio is sampled at {info.samplerate} Hz; this model needs {sampling_rate} Hz"
        )
    return raw
