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
