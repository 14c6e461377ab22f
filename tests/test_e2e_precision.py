"""#62 end to end: the server as a user starts it (no dtype anywhere) picks the device's
precision at load, shows the verdict in /v1/models, serves vectors that rank as the library's
float32 ones, never runs a float16 folder in float16 on CPU, and reads its cached verdict on
the next start. The expected dtype is this machine's CPU's (precision.cpu_has_bf16: bfloat16
where it has bf16 instructions, as CI's machines have); tests/test_precision.py fakes both."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from openai_compat.engine import precision
from tests.utils import RemoteServer, write_config

pytestmark = pytest.mark.slow

EXPECTED = "bfloat16" if precision.cpu_has_bf16() else "float32"
# new sentences, not the probe set's
TEXTS = [
    f"{subject} {verb} {thing} near the {place}."
    for subject in ("The farmer", "A child", "Our team", "The old dog")
    for verb, thing in (("paints", "a boat"), ("sells", "fresh bread"), ("finds", "a key"))
    for place in ("harbour", "station")
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory, minilm_path: str) -> Path:
    from sentence_transformers import SentenceTransformer

    root = tmp_path_factory.mktemp("precision")
    half = SentenceTransformer(minilm_path, device="cpu")
    half.half()  # saved in float16, as many current checkpoints are shipped
    half.save(str(root / "half"))
    models = [
        {"name": "minilm", "model": "builtin:all-MiniLM-L6-v2"},
        {"name": "half", "model": str(root / "half")},
    ]
    write_config(root / "models.toml", models)
    return root


def _server(folder: Path) -> RemoteServer:
    args = ["--config", str(folder / "models.toml"), "--cache-bytes", "0"]
    return RemoteServer(args, env={"OPENAI_COMPAT_DTYPE": None})  # the default: auto


@pytest.fixture(scope="module")
def srv(folder: Path) -> Iterator[RemoteServer]:
    with _server(folder) as server:
        yield server


def _cards(server: RemoteServer) -> dict[str, Any]:
    return {m["id"]: m for m in httpx.get(server.url + "/v1/models").json()["data"]}


def test_the_verdict_is_in_v1_models_and_a_half_folder_is_not_run_in_float16(
    srv: RemoteServer,
) -> None:
    for name, card in _cards(srv).items():
        assert card["dtype"] == EXPECTED and card["device"] == "cpu", (name, card)
        if EXPECTED == "bfloat16":
            check = card["precision"]["check"]
            assert check["passed"] and check["min_cosine"] >= 0.99, (name, check)
            assert check["agreement"] >= 0.99 and check["measure"] == "top-10 neighbour agreement"
        else:
            assert "without bfloat16" in card["precision"]["reason"]


def test_served_vectors_rank_as_the_librarys_float32_ones(srv: RemoteServer, st_model: Any) -> None:
    want = st_model.encode(TEXTS, normalize_embeddings=True)
    for name in ("minilm", "half"):
        data = httpx.post(
            srv.url + "/v1/embeddings", json={"model": name, "input": TEXTS}, timeout=60
        ).json()["data"]
        got = np.array([d["embedding"] for d in data], dtype=np.float64)
        cosines = np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1)
        assert cosines.min() > 0.999, (name, cosines.min())
        queries, docs = slice(0, 6), slice(6, None)
        agreement = precision.top_agreement(
            want[queries] @ want[docs].T, got[queries] @ got[docs].T
        )
        assert agreement >= 0.99, (name, agreement)


def test_the_serving_process_holds_no_pandas_or_pyarrow(srv: RemoteServer) -> None:
    """#62.3: the test venv has both (the ray extra); serving never uses them."""
    with open(f"/proc/{srv.proc.pid}/maps") as maps:
        mapped = maps.read()
    assert "/pandas/" not in mapped and "/pyarrow/" not in mapped


def test_the_next_start_reads_the_cached_verdict(srv: RemoteServer, folder: Path) -> None:
    if EXPECTED == "float32":
        pytest.skip("no lower precision to check on this CPU")
    first = _cards(srv)
    with _server(folder) as again:
        cards = _cards(again)
    for name, card in cards.items():
        assert card["precision"]["check"]["cached"] is True, name
        assert (
            card["precision"]["check"]["min_cosine"]
            == (first[name]["precision"]["check"]["min_cosine"])
        )
