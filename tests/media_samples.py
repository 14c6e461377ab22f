"""Small media files made on the fly: PNG images and WAV audio, as bytes and data: URIs."""

from __future__ import annotations

import base64
import io

import numpy as np


def png(width: int = 40, height: int = 30, color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    img = Image.new("RGB", (width, height), color)
    img.putpixel((1, 1), (0, 255, 0))
    img.save(buf, format="PNG")
    return buf.getvalue()


def wav(seconds: float = 0.5, rate: int = 16000, freq: float = 440.0) -> bytes:
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    soundfile.write(
        buf, (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32), rate, format="WAV"
    )
    return buf.getvalue()


def data_uri(raw: bytes, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(raw).decode()


def png_bomb(width: int = 12000, height: int = 12000) -> bytes:
    """A valid 1-bit PNG of width x height black pixels: a few KiB that decode to `width *
    height` bytes in Pillow (a decompression bomb)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    row = b"\0" * (1 + (width + 7) // 8)  # filter byte + packed bits
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    idat = zlib.compress(row * height, 9)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
