"""Image (CLIP) and audio (CLAP) embeddings through the openai SDK's extra_body, the tutorial's
/image_embed, and the safe-fetching rules on a live server."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from tests.media_samples import data_uri, png, wav
from tests.utils import RemoteServer, projected

pytestmark = pytest.mark.slow


def _client(srv: RemoteServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


@pytest.fixture(scope="module")
def clip_reference(tiny_media_models: dict[str, Path]):  # type: ignore[no-untyped-def]
    """The same tiny CLIP run directly with transformers."""
    import torch
    from PIL import Image
    from transformers import CLIPModel, CLIPProcessor

    path = tiny_media_models["clip"]
    model = CLIPModel.from_pretrained(path).eval()
    processor = CLIPProcessor.from_pretrained(path)

    def image(raw: bytes) -> np.ndarray:
        with torch.no_grad():
            feats = model.get_image_features(
                **processor(images=Image.open(io.BytesIO(raw)).convert("RGB"), return_tensors="pt")
            )
        return _unit(projected(feats)[0].numpy())

    return image


def test_image_by_data_uri_and_by_url_equal_the_model_run_directly(
    media_server: RemoteServer, file_server: tuple[str, Path], clip_reference
) -> None:  # type: ignore[no-untyped-def]
    url, root = file_server
    red, blue = png(color=(220, 20, 20)), png(50, 40, color=(20, 20, 220))
    (root / "blue.png").write_bytes(blue)
    client = _client(media_server)
    resp = client.embeddings.create(
        model="clip",
        input=[data_uri(red, "image/png"), f"{url}/blue.png"],
        extra_body={"modality": "image"},
    )
    assert [d.index for d in resp.data] == [0, 1]
    for item, raw in zip(resp.data, (red, blue), strict=True):
        got = np.asarray(item.embedding, dtype=np.float32)
        assert np.max(np.abs(got - clip_reference(raw))) < 1e-4
    assert resp.usage.prompt_tokens == 2 * ((32 // 8) ** 2 + 1)  # ViT patches + class token
    text = client.embeddings.create(model="clip", input="a red square")
    assert len(text.data[0].embedding) == len(resp.data[0].embedding) == 16


def test_image_float_and_base64_agree_and_dimensions_apply(media_server: RemoteServer) -> None:
    item = data_uri(png(), "image/png")
    body = {"model": "clip", "input": [item], "modality": "image"}
    fl = httpx.post(media_server.base_url + "/embeddings", json=body).json()
    b64 = httpx.post(
        media_server.base_url + "/embeddings", json={**body, "encoding_format": "base64"}
    ).json()
    decoded = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.asarray(fl["data"][0]["embedding"], np.float32))
    cut = httpx.post(media_server.base_url + "/embeddings", json={**body, "dimensions": 4}).json()
    v = np.asarray(fl["data"][0]["embedding"][:4])
    np.testing.assert_allclose(cut["data"][0]["embedding"], v / np.linalg.norm(v), atol=1e-6)


def test_audio_by_data_uri_and_url(
    media_server: RemoteServer, file_server: tuple[str, Path], tiny_media_models
) -> None:  # type: ignore[no-untyped-def]
    import soundfile
    import torch
    from transformers import ClapModel, ClapProcessor

    url, root = file_server
    tone = wav(freq=440.0)
    (root / "tone.wav").write_bytes(tone)
    client = _client(media_server)
    resp = client.embeddings.create(
        model="clap",
        input=[data_uri(tone, "audio/wav"), f"{url}/tone.wav"],
        extra_body={"modality": "audio"},
        encoding_format="float",
    )
    a, b = (np.asarray(d.embedding) for d in resp.data)
    np.testing.assert_allclose(a, b, atol=1e-5)  # the same file both ways
    path = tiny_media_models["clap"]
    model, proc = ClapModel.from_pretrained(path).eval(), ClapProcessor.from_pretrained(path)
    samples, rate = soundfile.read(io.BytesIO(tone))
    # the model's own processor on the decoded samples
    feats = proc(audio=[samples], sampling_rate=rate, return_tensors="pt", padding=True)
    with torch.no_grad():
        ref = projected(model.get_audio_features(input_features=feats["input_features"]))
    assert np.max(np.abs(a - _unit(ref[0].numpy()))) < 1e-4
    text = client.embeddings.create(model="clap", input="a beep")
    assert len(text.data[0].embedding) == len(a)


def test_modality_must_match_the_model(media_server: RemoteServer) -> None:
    client = _client(media_server)
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(
            model="clap", input=[data_uri(png(), "image/png")], extra_body={"modality": "image"}
        )
    assert info.value.body["param"] == "model"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="clip", input=[[1, 2]], extra_body={"modality": "image"})


def test_default_settings_refuse_loopback_urls(
    multi_server: RemoteServer, file_server: tuple[str, Path]
) -> None:
    url, root = file_server
    (root / "ok.png").write_bytes(png())
    client = _client(multi_server)
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(
            model="clip",
            input=[data_uri(png(), "image/png"), f"{url}/ok.png"],
            extra_body={"modality": "image"},
        )
    body = info.value.body
    assert body["param"] == "input" and body["code"] == "refused_address"  # type: ignore[index]
    assert body["message"].startswith("input[1]")  # type: ignore[index]


@pytest.mark.parametrize(
    ("item", "code"),
    [
        (data_uri(b"\0" * 300_000, "image/png"), "too_large"),
        (data_uri(b"this is not an image", "image/png"), "invalid_media"),
        ("data:image/png;base64,!!!", "invalid_media"),
    ],
)
def test_bad_media_items_name_their_index(media_server: RemoteServer, item: str, code: str) -> None:
    r = httpx.post(
        media_server.base_url + "/embeddings",
        json={"model": "clip", "input": [data_uri(png(), "image/png"), item], "modality": "image"},
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["param"] == "input" and "input[1]" in err["message"]
