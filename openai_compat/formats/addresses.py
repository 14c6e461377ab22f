"""Which addresses media may be fetched from (SSRF rules, media.py): a host string read as the
system resolver reads it, and whether an address is public, IPv4 inside IPv6 judged by the
IPv4 address it carries. Both media.py (URLs as given) and media_client.py (every address a
name resolves to, at connect time) check here."""

from __future__ import annotations

import ipaddress
import socket

# IPv6 prefixes that carry an IPv4 address in their last 32 bits (NAT64, well-known and local).
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))


class RefusedAddress(OSError):
    """A media URL's host is (or resolves to) an address we do not fetch from."""

    def __init__(self, host: str, address: str) -> None:
        super().__init__(f"{host} resolves to {address}, a non-public address")
        self.host = host
        self.address = address


def canonical_ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a host string means to the system resolver, or None for a name.

    `ipaddress` accepts only canonical literals, but getaddrinfo and most HTTP clients also
    read inet_aton's forms: `127.1`, `2130706433`, `0x7f.0.0.1`, `0177.0.0.1`.
    """
    host = host.strip("[]").split("%", 1)[0]
    if host.endswith(".") and not host.endswith(".."):
        host = host[:-1]  # a fully qualified numeric name resolves like the bare one
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if not host or ":" in host or not all(c.isalnum() or c == "." for c in host):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """IPv4 addresses an IPv6 address routes to: mapped, compatible, 6to4, Teredo, NAT64."""
    found = [a for a in (ip.ipv4_mapped, ip.sixtofour) if a is not None]
    if ip.teredo is not None:
        found += list(ip.teredo)
    packed = int(ip)
    if packed >> 32 == 0 and packed > 1:  # ::a.b.c.d (deprecated IPv4-compatible form)
        found.append(ipaddress.IPv4Address(packed))
    if any(ip in net for net in _NAT64):
        found.append(ipaddress.IPv4Address(packed & 0xFFFFFFFF))
    return found


def is_public_address(address: str) -> bool:
    ip = canonical_ip(address)
    if ip is None:
        raise ValueError(f"{address!r} is not an IP address")
    candidates: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        # A translation prefix routes to its IPv4 address: judge that one.
        candidates = list(_embedded_ipv4(ip)) or candidates
    return all(a.is_global and not a.is_multicast and not a.is_reserved for a in candidates)
