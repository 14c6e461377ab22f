"""engine = "onnx" / "openvino" (the native engine's backends, engine/exported.py): exported
once and cached, served with the same batching, and as accurate as the torch model they came
from (cosine >= 0.999 for fp32, >= 0.98 for int8)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest

from openai_compat.engine import backends
from tests.utils import SERVER_ENV, RemoteServer

pytestmark = pytest.mark.slow

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The stock market crashed today.",
    "A woman is playing the violin on a stage.",
    "Heavy rain caused flooding in the city centre.",
    "How do I reset my password?",
    "The new phone has a larger battery and a better camera.",
    "Children are playing football in the park after school.",
    # one long input: the int8 exports were calibrated on sentences
    "The committee met on Tuesday to review the budget for the coming year. After a long "
    "discussion about maintenance costs, staff salaries and the new library wing, members "
    "agreed to postpone the vote until the auditors had finished their report, which is "
    "expected early next month. Several residents spoke during the public session, most of "
    "them in favour of keeping the swimming pool open through the winter.",
]
EXPORTED = {"onnx": ("onnx", None), "int8": ("onnx", "int8")} | {
    "openvino": ("openvino", None),
    "ov-int8": ("openvino", "int8"),
}


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("exports")


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory, export_dir: Path) -> Path:
    cfg = tmp_path_factory.mktemp("onnx-cfg") / "onnx.toml"
    cfg.write_text(
        f'export_dir = "{export_dir}"\n'
        '[[models]]\nname = "torch"\nmodel = "builtin:all-MiniLM-L6-v2"\n'
        + "".join(
            f'[[models]]\nname = "{name}"\nmodel = "builtin:all-MiniLM-L6-v2"\n'
            f'engine = "{engine}"\n' + (f'quantize = "{quantize}"\n' if quantize else "")
            for name, (engine, quantize) in EXPORTED.items()
        )
    )
    return cfg


@pytest.fixture(scope="module")
def downloaded(config: Path, export_dir: Path) -> list[Path]:
    """`openai-compat download` makes the exports ahead of time."""
    out = subprocess.run(
        [sys.executable, "-m", "openai_compat", "download", "--config", str(config)],
        env={**os.environ, **SERVER_ENV},
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    assert "onnx export ->" in out and "openvino export ->" in out
    files = sorted([*export_dir.glob("*/*.onnx"), *export_dir.glob("*/*.xml")])
    assert {f.parent.name.rsplit("-", 1)[0] for f in files} == set(EXPORTED)
    return files


@pytest.fixture(scope="module")
def server(config: Path, downloaded: list[Path]) -> Iterator[RemoteServer]:
    with RemoteServer(["--config", str(config)]) as srv:
        yield srv


def test_the_server_reuses_the_exports_it_finds(
    server: RemoteServer, downloaded: list[Path]
) -> None:
    assert "exporting" not in server.output()
    mtimes = [f.stat().st_mtime for f in downloaded]
    assert mtimes == [f.stat().st_mtime for f in sorted(downloaded)]


def test_onnx_vectors_match_the_torch_model(server: RemoteServer, minilm_path: str) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(f"{minilm_path}/tokenizer.json")
    tok.no_padding()
    tokens = sum(len(tok.encode(s).ids) for s in SENTENCES)
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    vectors = {}
    for name in ("torch", *EXPORTED):
        resp = client.embeddings.create(model=name, input=SENTENCES)
        vectors[name] = np.array([d.embedding for d in resp.data], dtype=np.float32)
        assert resp.usage.prompt_tokens == tokens  # the engine counts the same tokens
    for name, (_, quantize) in EXPORTED.items():
        cosine = np.sum(vectors["torch"] * vectors[name], axis=1)
        assert cosine.min() >= (0.98 if quantize else 0.999), (name, cosine)
        # meaning survives: the known pair stays close, the unrelated one far
        v = vectors[name]
        assert abs(float(v[0] @ v[1]) - 0.7553) < 0.02 and float(v[0] @ v[2]) < 0.1, name
    # the exports differ from one another: each name really runs its own backend
    assert not np.allclose(vectors["onnx"], vectors["openvino"], atol=1e-7)
    assert not np.allclose(vectors["int8"], vectors["ov-int8"], atol=1e-3)


def test_a_second_load_finds_the_cache(export_dir: Path, downloaded: list[Path]) -> None:
    """Loading a model again (another replica, a restart) serves the export on disk: nothing
    is written, and the runtime runs the cached graph."""
    from openai_compat.engine import native
    from openai_compat.frame.settings import ModelConfig

    before = {f: f.stat().st_mtime_ns for f in downloaded}
    for name, (engine, quantize) in EXPORTED.items():
        config = ModelConfig(
            model="builtin:all-MiniLM-L6-v2", name=name, engine=engine, quantize=quantize
        )
        folder = native.load(config, 1, export_dir).runner.exported
        assert folder is not None and any(f.parent == folder for f in before), name
    assert before == {f: f.stat().st_mtime_ns for f in downloaded}


def test_openvino_telemetry_is_declined_unless_tracking_is_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from openvino_telemetry.utils.opt_in_checker import ConsentCheckResult, OptInChecker

    original = OptInChecker.check
    monkeypatch.setenv("DO_NOT_TRACK", "1")  # what `openai-compat serve/download` sets
    with backends.openvino_telemetry_declined():
        assert OptInChecker().check(False, False) == ConsentCheckResult.DECLINED
    assert OptInChecker.check is original
    monkeypatch.setenv("DO_NOT_TRACK", "0")  # the user turned tracking on: OpenVINO decides
    with backends.openvino_telemetry_declined():
        assert OptInChecker.check is original


def test_the_cache_key_follows_the_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"hidden_size": 384}')
    one = backends._key(str(tmp_path), None, "onnx", None)
    assert one == backends._key(str(tmp_path), None, "onnx", None)
    assert one != backends._key(str(tmp_path), None, "onnx", "int8")
    (tmp_path / "config.json").write_text('{"hidden_size": 768}')
    assert one != backends._key(str(tmp_path), None, "onnx", None)


def test_the_cache_key_follows_the_weights_changed_in_place(tmp_path: Path) -> None:
    """New weights written over the old ones (same name, same size, mtime set back as
    `cp -p` does) get a new export; the digests are kept in the export dir."""
    import os

    model, exports = tmp_path / "model", tmp_path / "exports"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 384}')
    weights = model / "model.safetensors"
    weights.write_bytes(b"\x01" * 4096)
    old = backends._key(str(model), None, "onnx", None, exports)
    assert old == backends._key(str(model), None, "onnx", None, exports)
    stat = weights.stat()
    weights.write_bytes(b"\x02" * 4096)  # fine-tuned in place: same size
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the old mtime
    new = backends._key(str(model), None, "onnx", None, exports)
    assert new != old
    assert (exports / backends.DIGESTS).is_file()
    digests = (exports / backends.DIGESTS).read_text()
    assert str(weights.resolve()) in digests


def test_backends_refuse_what_they_cannot_run(
    tmp_path: Path, trained_models: dict[str, Path]
) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(
        f'export_dir = "{tmp_path}"\n'
        f'[[models]]\nname = "rr"\nmodel = "{trained_models["reranker"]}"\nengine = "onnx"\n'
    )
    srv = RemoteServer(["--config", str(cfg)], wait_ready=False)
    try:
        assert srv.proc.wait(180) == 1
        assert "backend = 'onnx' serves text embedding models only" in srv.output()
    finally:
        srv.stop()
    quantize_alone = tmp_path / "q.toml"
    quantize_alone.write_text('[[models]]\nmodel = "builtin:all-MiniLM-L6-v2"\nquantize = "int8"\n')
    done = subprocess.run(
        [sys.executable, "-m", "openai_compat", "serve", "--config", str(quantize_alone)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "quantize applies to backend = 'onnx' or 'openvino'" in done.stderr


async def test_exported_models_load_lazily_and_reload_from_the_cache(
    export_dir: Path, downloaded: list[Path]
) -> None:
    """An ONNX and an OpenVINO model served lazily (docs/models.md): the first request loads
    each from the export cache, an unload frees it, and loading again reuses the same export
    files (nothing exported again) and answers the same vectors."""
    from openai_compat.frame.settings import ModelConfig, Settings
    from tests.utils import app_client

    admin = {"Authorization": "Bearer k"}
    models = (
        ModelConfig(model="builtin:all-MiniLM-L6-v2", name="torch", model_warmup=False),
        *(
            ModelConfig(model="builtin:all-MiniLM-L6-v2", name=n, engine=n, load="lazy")
            for n in ("onnx", "openvino")
        ),
    )
    mtimes = [f.stat().st_mtime_ns for f in downloaded]
    settings = Settings(models=models, export_dir=export_dir, admin_key="k", cache_bytes=0)
    async with app_client(settings) as c:
        for name in ("onnx", "openvino"):
            body = {"model": name, "input": SENTENCES[:3], "encoding_format": "float"}
            first = (await c.post("/v1/embeddings", json=body)).json()["data"]
            unloaded = await c.post(f"/admin/models/{name}/unload", headers=admin)
            assert unloaded.json()["state"] == "unloaded"
            again = (await c.post("/v1/embeddings", json=body)).json()["data"]
            assert [d["embedding"] for d in again] == [d["embedding"] for d in first]
            state = (await c.get("/admin/models", headers=admin)).json()["data"]
            assert {m["id"]: m["loads"] for m in state}[name] == 2
    assert [f.stat().st_mtime_ns for f in downloaded] == mtimes  # no export made again


@pytest.mark.parametrize(("engine", "module"), [("onnx", "onnxruntime"), ("openvino", "openvino")])
def test_a_backend_without_its_extra_names_ours(
    engine: str, module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend without its runtime names our extra, not the library's packages."""
    import importlib.util

    from openai_compat.frame.settings import ModelConfig
    from openai_compat.models import loading
    from openai_compat.models.registry import EngineFailure

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a)
    )
    config = ModelConfig(model="builtin:all-MiniLM-L6-v2", name="m", engine=engine)
    with pytest.raises(EngineFailure, match=rf"pip install 'openai-compat\[{engine}\]'"):
        loading.check_options(config)
