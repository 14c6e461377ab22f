"""The media fetcher on its own: data URIs, size and time limits, and the SSRF rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from openai_compat import media
from openai_compat.errors import BadRequest
from openai_compat.media import GuardedResolver, MediaFetcher, RefusedAddress, is_public_address
from tests.media_samples import data_uri, png, wav


def _fetcher(allow_private: bool = False, max_bytes: int = 100_000, timeout: float = 5.0):  # type: ignore[no-untyped-def]
    return MediaFetcher(allow_private=allow_private, max_bytes=max_bytes, timeout=timeout)


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("2606:4700:4700::1111", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # cloud metadata
        ("100.64.0.1", False),  # carrier-grade NAT
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("::1", False),
        ("fe80::1", False),
        ("fc00::1", False),
        ("::ffff:127.0.0.1", False),  # IPv4-mapped loopback
        ("ff02::1", False),
    ],
)
def test_public_address_rules(address: str, public: bool) -> None:
    assert is_public_address(address) is public


async def test_resolver_refuses_names_that_resolve_to_loopback() -> None:
    resolver = GuardedResolver(allow_private=False)
    try:
        with pytest.raises(RefusedAddress):
            await resolver.resolve("localhost", 80)
    finally:
        await resolver.close()


async def test_data_uris_decode_and_validate() -> None:
    f = _fetcher()
    try:
        (img,) = await f.fetch_all([data_uri(png(), "image/png")], "image")
        assert img.size == (40, 30)
        for bad, fragment in [
            ("data:image/png;base64,@@@not-base64@@@", "does not decode"),
            ("data:image/png,rawtext", "data:<type>;base64"),
            (data_uri(b"plain text, not a picture", "image/png"), "not an image"),
            (data_uri(png(2, 2), "image/png"), "at least 3x3"),
            (data_uri(b"\0" * 200_000, "image/png"), "larger than"),
            ("ftp://example.com/a.png", "http(s) URL"),
            ("just words", "http(s) URL"),
        ]:
            with pytest.raises(BadRequest) as info:
                await f.fetch_all([data_uri(png(), "image/png"), bad], "image")
            assert info.value.param == "input"
            assert info.value.message.startswith("input[1]:"), info.value.message
            assert fragment in info.value.message
    finally:
        await f.close()


async def test_audio_is_checked_for_format_and_sampling_rate() -> None:
    f = _fetcher()
    try:
        (raw,) = await f.fetch_all([data_uri(wav(), "audio/wav")], "audio", 16000)
        assert raw[:4] == b"RIFF"
        with pytest.raises(BadRequest, match="8000 Hz; this model needs 16000 Hz"):
            await f.fetch_all([data_uri(wav(rate=8000), "audio/wav")], "audio", 16000)
        with pytest.raises(BadRequest, match="not an audio file"):
            await f.fetch_all([data_uri(png(), "audio/wav")], "audio", 16000)
    finally:
        await f.close()


async def test_loopback_urls_are_refused_by_default(file_server: tuple[str, Path]) -> None:
    url, root = file_server
    (root / "a.png").write_bytes(png())
    f = _fetcher()
    try:
        for target in (f"{url}/a.png", url.replace("127.0.0.1", "localhost") + "/a.png"):
            with pytest.raises(BadRequest) as info:
                await f.fetch_all([target], "image")
            assert info.value.code == "refused_address"
    finally:
        await f.close()
    allowed = _fetcher(allow_private=True)
    try:
        (img,) = await allowed.fetch_all([f"{url}/a.png"], "image")
        assert img.size == (40, 30)
    finally:
        await allowed.close()


async def test_redirects_to_private_addresses_are_refused(
    file_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, root = file_server
    (root / "b.png").write_bytes(png())
    # Pretend 127.0.0.1 is public so the first hop is allowed; 127.0.0.2 stays private.
    monkeypatch.setattr(media, "is_public_address", lambda a: a == "127.0.0.1")
    f = _fetcher()
    try:
        (img,) = await f.fetch_all([f"{url}/redirect?to=/b.png"], "image")  # same host: fine
        assert img.size == (40, 30)
        port = url.rsplit(":", 1)[1]
        evil = f"{url}/redirect?to=http://127.0.0.2:{port}/b.png"
        with pytest.raises(BadRequest) as info:
            await f.fetch_all([evil], "image")
        assert info.value.code == "refused_address"
    finally:
        await f.close()


async def test_size_and_time_limits_on_urls(file_server: tuple[str, Path]) -> None:
    url, root = file_server
    (root / "big.bin").write_bytes(b"\0" * 150_000)
    (root / "slow").write_bytes(png())
    f = _fetcher(allow_private=True, timeout=1.0)
    try:
        with pytest.raises(BadRequest, match="larger than 100000 bytes"):
            await f.fetch_all([f"{url}/big.bin"], "image")
        with pytest.raises(BadRequest, match="longer than 1s"):
            await f.fetch_all([f"{url}/slow"], "image")
        with pytest.raises(BadRequest, match="HTTP 404"):
            await f.fetch_all([f"{url}/missing.png"], "image")
        with pytest.raises(BadRequest, match="could not be fetched"):
            await f.fetch_all(["http://127.0.0.1:1/nothing-listens-here"], "image")
    finally:
        await f.close()
