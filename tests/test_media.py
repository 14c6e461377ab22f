"""The media fetcher on its own: data URIs, size and time limits, and the SSRF rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from openai_compat.formats import media
from openai_compat.formats.addresses import RefusedAddress, is_public_address
from openai_compat.formats.media import MediaFetcher
from openai_compat.formats.media_client import GuardedResolver
from openai_compat.ground.errors import BadRequest
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


async def test_audio_is_decoded_once_and_a_corrupt_body_is_a_400() -> None:
    """A header can be sound over a body that is not: the body is decoded when the item is
    validated (the samples ride along for the native engine), not found broken in the engine."""
    import io

    import numpy as np
    import soundfile

    buf = io.BytesIO()
    tone = (0.5 * np.sin(np.arange(16000) / 16000 * 2 * np.pi * 440)).astype(np.float32)
    soundfile.write(buf, tone, 16000, format="FLAC")
    flac = buf.getvalue()
    corrupt = flac[:200] + b"\xff" * (len(flac) - 200)
    assert soundfile.info(io.BytesIO(corrupt)).frames == 16000  # the header still reads
    f = _fetcher()
    try:
        (good,) = await f.fetch_all([data_uri(flac, "audio/flac")], "audio", 16000)
        assert bytes(good) == flac and good.rate == 16000
        np.testing.assert_allclose(good.samples, soundfile.read(io.BytesIO(flac))[0], atol=1e-6)
        with pytest.raises(BadRequest, match=r"input\[1\]: the content is not an audio file"):
            await f.fetch_all(
                [data_uri(flac, "audio/flac"), data_uri(corrupt, "audio/flac")], "audio", 16000
            )
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
            assert "--allow-private-media-urls" in info.value.message  # the switch (#61.16)
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


@pytest.mark.parametrize(
    "host",
    [
        "2130706433",
        "127.1",
        "0177.0.0.1",
        "0x7f.1",
        "0x7f000001",
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
        "[::127.0.0.1]",
        "[64:ff9b::7f00:1]",
        "[2002:7f00:1::]",
        "127.0.0.1.",
        "017700000001",
        "169.254.169.254",
        "2852039166",
        "[fe80::1%25eth0]",
    ],
)
async def test_every_spelling_of_a_private_address_is_refused_before_connecting(
    host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the fetcher tried to connect")

    f = _fetcher()
    monkeypatch.setattr(f, "_client", no_network)
    try:
        with pytest.raises(BadRequest) as info:
            await f.fetch_all([data_uri(png(), "image/png"), f"http://{host}/a.png"], "image")
        assert info.value.code == "refused_address", info.value.message
        assert info.value.message.startswith("input[1]:")
    finally:
        await f.close()


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("2130706433", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("134744072", "8.8.8.8"),
        ("example.com", None),
        ("1e3.example", None),
        ("[::1]", "::1"),
    ],
)
def test_hosts_are_read_as_the_system_resolver_reads_them(host: str, address: str | None) -> None:
    ip = media.canonical_ip(host)
    assert (None if ip is None else str(ip)) == address


def test_ipv6_forms_that_carry_a_private_ipv4_are_not_public() -> None:
    for address in ("64:ff9b::a00:1", "2002:c0a8:101::1", "::ffff:a9fe:a9fe", "::10.0.0.1"):
        assert is_public_address(address) is False, address
    assert is_public_address("64:ff9b::808:808") is True  # NAT64 of 8.8.8.8


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
async def test_decompression_bombs_are_refused_before_decoding() -> None:
    from tests.media_samples import png_bomb

    bomb = png_bomb()
    assert len(bomb) < 200_000  # 144 megapixels in a small file
    f = MediaFetcher(allow_private=False, max_bytes=1_000_000, timeout=5.0, max_pixels=4096**2)
    try:
        with pytest.raises(BadRequest) as info:
            await f.fetch_all([data_uri(bomb, "image/png")], "image")
        assert info.value.code == "too_large"
        assert "12000x12000" in info.value.message
        assert "--max-media-pixels" in info.value.message  # the switch (#61.16)
        with pytest.raises(BadRequest, match="Pillow's own limit") as info:  # > 179 Mpx
            await f.fetch_all([data_uri(png_bomb(15000, 15000), "image/png")], "image")
        assert info.value.code == "too_large"
        (ok,) = await f.fetch_all([data_uri(png_bomb(64, 64), "image/png")], "image")
        assert ok.size == (64, 64)
    finally:
        await f.close()


async def test_audio_longer_than_the_limit_is_refused() -> None:
    f = MediaFetcher(allow_private=False, max_bytes=1_000_000, timeout=5.0, max_audio_seconds=1.0)
    try:
        (ok,) = await f.fetch_all([data_uri(wav(0.5), "audio/wav")], "audio", 16000)
        assert ok[:4] == b"RIFF"
        with pytest.raises(BadRequest) as info:
            await f.fetch_all(
                [data_uri(wav(0.5), "audio/wav"), data_uri(wav(2.0), "audio/wav")], "audio", 16000
            )
        assert info.value.code == "too_large" and "2.0 s" in info.value.message
        assert info.value.message.startswith("input[1]:")
    finally:
        await f.close()


async def test_a_failed_item_cancels_the_other_fetches(file_server: tuple[str, Path]) -> None:
    import asyncio

    url, _ = file_server
    f = _fetcher(allow_private=True, timeout=10.0)
    try:
        with pytest.raises(BadRequest, match="input\\[1\\]"):
            await f.fetch_all([f"{url}/slow", "data:image/png;base64,!!!"], "image")
        # Nothing of that request is left running once its 400 is raised.
        leftover = [
            t
            for t in asyncio.all_tasks()
            if t is not asyncio.current_task()
            and not t.done()
            and getattr(t.get_coro(), "__qualname__", "").startswith("MediaFetcher.")
        ]
        assert leftover == []
    finally:
        await f.close()


async def test_one_deadline_covers_every_redirect(file_server: tuple[str, Path]) -> None:
    url, root = file_server
    (root / "c.png").write_bytes(png())
    f = _fetcher(allow_private=True, timeout=1.0)
    try:
        # Each hop answers in 0.6 s, inside the limit; the fetch as a whole takes 1.2 s.
        inner = f"{url}/redirect?delay=0.6%26to=/c.png"
        chained = f"{url}/redirect?delay=0.6&to={inner}"
        with pytest.raises(BadRequest, match="longer than 1s"):
            await f.fetch_all([chained], "image")
        (img,) = await f.fetch_all([f"{url}/redirect?delay=0.3&to=/c.png"], "image")
        assert img.size == (40, 30)
    finally:
        await f.close()


async def test_resolved_names_are_cached_for_a_bounded_time() -> None:
    f = _fetcher()
    try:
        connector = f._client().connector
        assert connector is not None and connector.use_dns_cache
        assert connector._cached_hosts._ttl == media._DNS_TTL  # type: ignore[attr-defined]
        assert 0 < media._DNS_TTL <= 300
    finally:
        await f.close()


def test_a_server_that_fetches_no_url_never_imports_aiohttp() -> None:
    """media_client.py (aiohttp: ~90 ms of start-up, 8 MiB) loads on the first URL fetched,
    not with the app: a text model's server never pays for it."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from openai_compat.web.app import create_app\n"
        "from openai_compat.frame.config import build_settings\n"
        "create_app(build_settings({}, {}))\n"
        "print('aiohttp' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "False"


async def test_only_the_accepted_image_formats_are_opened() -> None:
    """Pillow's rarer decoders (PSD, FITS, PCF... this year's CVEs) are never reached: an
    image in a format the server does not accept is a 400 naming the ones it does, while
    each accepted one decodes."""
    import io

    from PIL import Image

    def encoded(fmt: str) -> bytes:
        out = io.BytesIO()
        Image.new("RGB", (8, 8), (200, 10, 10)).save(out, format=fmt)
        return out.getvalue()

    f = _fetcher()
    try:
        for fmt in media.IMAGE_FORMATS:
            (img,) = await f.fetch_all([data_uri(encoded(fmt), "image/x")], "image")
            assert img.size == (8, 8), fmt
        for fmt in ("TGA", "PCX", "ICO", "SGI"):  # each decodes in Pillow, none is accepted
            with pytest.raises(BadRequest, match="accepted: PNG, JPEG") as info:
                await f.fetch_all([data_uri(encoded(fmt), "image/x")], "image")
            assert info.value.param == "input", fmt
    finally:
        await f.close()


def _encoded(size: tuple[int, int], fmt: str = "PNG") -> bytes:
    import io

    from PIL import Image

    img = Image.new("RGB", size, (40, 90, 160))
    img.paste((250, 250, 0), (0, 0, size[0] // 3, size[1] // 3))  # not one colour
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


async def test_a_requests_pixels_are_budgeted_from_headers_before_any_decode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """#61.1: a single-colour 4096 x 4096 page is a few KB; five of them declare 84 Mpx. The
    request is refused from the headers, naming the image that crossed the budget and the
    option, and nothing is decoded."""
    page = _encoded((4096, 4096))
    assert len(page) < 100_000
    decoded: list[int] = []
    real = media._decode_image

    def spy(index: int, *args: object) -> object:
        decoded.append(index)
        return real(index, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(media, "_decode_image", spy)
    f = MediaFetcher(allow_private=False, max_bytes=1_000_000, timeout=5.0)
    try:
        with pytest.raises(BadRequest) as info:
            await f.fetch_all([data_uri(page, "image/png")] * 5, "image", image_side=56)
        assert info.value.message.startswith("input[4]:"), info.value.message
        assert "--max-request-pixels" in info.value.message and "83886080" in info.value.message
        assert info.value.code == "too_large" and decoded == []
        # four are within the default budget (64 Mi pixels): decoded one after the other
        images = await f.fetch_all([data_uri(page, "image/png")] * 4, "image", image_side=56)
        assert decoded == [0, 1, 2, 3] and len(images) == 4
    finally:
        await f.close()


async def test_images_are_shrunk_to_the_side_the_processor_keeps_as_they_decode() -> None:
    """Shrunk by whole factors, never below twice `image_side` on the shortest side; the original
    size stays in the image's metadata (Cohere reports it). JPEG through its DCT draft."""
    f = MediaFetcher(allow_private=False, max_bytes=4_000_000, timeout=5.0)
    try:
        png_page, jpeg_page = _encoded((2000, 1000)), _encoded((4000, 3000), "JPEG")
        (small,) = await f.fetch_all([data_uri(png_page, "image/png")], "image", None, 112)
        assert small.size == (500, 250)  # reduced by 4: 1000 // (2 x 112)
        assert small.info[media.IMAGE_META]["width"] == 2000
        (jpeg,) = await f.fetch_all([data_uri(jpeg_page, "image/jpeg")], "image", None, 224)
        assert jpeg.size == (1000, 750)  # the DCT's 1/4 scale (1/8 would go under 448)
        assert jpeg.info[media.IMAGE_META] == {
            "width": 4000, "height": 3000, "format": "jpeg", "bit_depth": 8,
        }  # fmt: skip
        (whole,) = await f.fetch_all([data_uri(png_page, "image/png")], "image")
        assert whole.size == (2000, 1000)  # no side known: decoded as it is
        (near,) = await f.fetch_all([data_uri(png_page, "image/png")], "image", None, 300)
        assert near.size == (2000, 1000)  # under 4x the side: left whole
    finally:
        await f.close()
