"""The HTTP side of media fetching (media.py): aiohttp's client session behind a resolver that
refuses non-public addresses. media.py imports this on the first URL it fetches: aiohttp costs
a server about 90 ms of start-up and 8 MiB resident, which one that never fetches a URL (every
text model) does not pay."""

from __future__ import annotations

import socket

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from openai_compat.formats.addresses import RefusedAddress, is_public_address

ClientError = aiohttp.ClientError


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


def new_session(*, allow_private: bool, timeout: float, dns_ttl: int) -> aiohttp.ClientSession:
    """A pooled session whose every connection goes through GuardedResolver."""
    connector = aiohttp.TCPConnector(
        resolver=GuardedResolver(allow_private), limit=64, ttl_dns_cache=dns_ttl
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=timeout),
        headers={"User-Agent": "openai-compat media fetcher"},
    )
