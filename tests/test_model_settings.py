"""Every `[[models]]` setting does what docs/configuration.md says, or start-up refuses it.

EFFECTS names, for each ModelConfig field, the test that shows the setting changing what it
says it changes (a vector, a batch, a load); the first test fails when a field is added
without one. The settings with no test elsewhere are tested here: dtype, device, batch_size,
model_warmup, wave_batching, compile, bettertransformer, revision and trust_remote_code.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from openai_compat.frame.settings import ModelConfig, Settings
from openai_compat.models.loading import check_options, create_engine
from openai_compat.models.registry import EngineFailure
from tests.utils import ROOT, app_client

HERE = "tests/test_model_settings.py"
TEXTS = ["A man is eating food.", "The stock market crashed today."]

EFFECTS: dict[str, tuple[str, str]] = {
    "model": (
        "tests/test_e2e_embeddings.py",
        "test_token_id_inputs_equal_text",
    ),
    "name": (
        "tests/test_e2e_foundation.py",
        "test_model_ids_with_slashes_raw_and_percent_encoded",
    ),
    "aliases": (
        "tests/test_e2e_embeddings.py",
        "test_alias_works_from_the_sdk",
    ),
    "engine": (
        "tests/test_backends.py",
        "test_onnx_vectors_match_the_torch_model",
    ),
    "kind": (
        "tests/test_e2e_sparse.py",
        "test_vectors_equal_a_direct_transformers_computation",
    ),
    "quantize": (
        "tests/test_backends.py",
        "test_backends_refuse_what_they_cannot_run",
    ),
    "device": (
        HERE,
        "test_options_that_cannot_apply_stop_start_up",
    ),
    "batch_size": (
        HERE,
        "test_batch_size_and_model_warmup",
    ),
    "backend": (
        "tests/test_native_engine.py",
        "test_exported_backends_serve_the_model_within_their_fidelity",
    ),
    "max_batch_tokens": (
        "tests/test_native_engine.py",
        "test_max_batch_tokens_bounds_every_batch",
    ),
    "forward_lanes": (
        "tests/test_native_engine.py",
        "test_forward_lanes_follow_the_setting",
    ),
    "revision": (
        HERE,
        "test_revision_loads_that_revision_of_a_hub_model",
    ),
    "trust_remote_code": (
        HERE,
        "test_trust_remote_code_runs_the_folders_own_model_code",
    ),
    "dtype": (
        HERE,
        "test_dtype_casts_the_weights_and_the_vectors_follow",
    ),
    "dtype_check": (
        "tests/test_precision.py",
        "test_dtype_check_false_takes_the_candidate_unchecked",
    ),
    "pooling_method": (
        "tests/test_pooling.py",
        "test_pooling_method_serves_that_pooling",
    ),
    "model_warmup": (
        HERE,
        "test_batch_size_and_model_warmup",
    ),
    "wave_batching": (
        "tests/test_infinity_engine.py",
        "test_wave_batching_puts_the_feeder_in_front_of_infinity_emb",
    ),
    "compile": (
        HERE,
        "test_compile_runs_the_forward_pass_compiled",
    ),
    "bettertransformer": (
        HERE,
        "test_options_that_cannot_apply_stop_start_up",
    ),
    "max_length": (
        "tests/test_e2e_rerank_classify.py",
        "test_cross_encoder_truncates_pairs_at_its_configured_limit",
    ),
    "truncate": (
        "tests/test_e2e_embeddings.py",
        "test_no_truncate_setting_refuses_long_input_with_index_and_length",
    ),
    "long_input": (
        "tests/test_long_inputs.py",
        "test_chunks_cover_the_text_and_each_is_the_slices_vector",
    ),
    "window_overlap": (  # windows overlap: each starts before the last one ended
        "tests/test_long_inputs.py",
        "test_chunks_cover_the_text_and_each_is_the_slices_vector",
    ),
    "cache": (
        "tests/test_cache.py",
        "test_a_repeated_request_is_answered_bit_for_bit_from_the_cache",
    ),
    "token_ids": (
        HERE,
        "test_token_ids_model_embeds_exactly_the_ids_sent",
    ),
    "prompts": (
        "tests/test_e2e_prompts_cohere.py",
        "test_every_way_of_asking_for_the_query_prompt_gives_the_prompted_vector",
    ),
    "default_prompt": (
        "tests/test_e2e_prompts_cohere.py",
        "test_search_document_maps_to_the_models_passage_prompt",
    ),
    "matryoshka_dimensions": (  # the declared sizes pass, others are a 400 naming them
        "tests/test_model_families.py",
        "test_every_family_answers_its_routes_from_its_folder_alone",
    ),
    "hybrid_weights": (  # BGE-M3's rerank: the second model's weights equal compute_score's
        "tests/test_e2e_bge_m3.py",
        "test_rerank_scores_as_compute_score_does",
    ),
    "quantization_range": (
        "tests/test_e2e_prompts_cohere.py",
        "test_models_list_prompts_and_int8_ranges",
    ),
    "load": (
        "tests/test_model_pool.py",
        "test_ten_concurrent_first_requests_share_one_load",
    ),
    "keep_alive": (
        "tests/test_model_pool.py",
        "test_keep_alive_unloads_an_idle_model_and_a_request_may_set_it",
    ),
    "ray": (  # num_replicas = 2 and max_replicas_per_node = 1: one replica on each node
        "tests/test_e2e_ray_serve.py",
        "test_a_models_replicas_land_on_both_nodes",
    ),
}


def test_every_model_setting_names_a_test_that_shows_its_effect() -> None:
    assert set(EFFECTS) == set(ModelConfig.model_fields)
    for setting, (path, name) in EFFECTS.items():
        source = (ROOT / path).read_text()
        assert re.search(rf"^(async )?def {name}\(", source, re.M), (setting, path, name)
    documented = (ROOT / "docs" / "configuration.md").read_text()
    for setting in ModelConfig.model_fields:
        assert f"\n{setting} = " in documented, f"{setting} is not in docs/configuration.md"


def _vectors(body: dict[str, Any]) -> np.ndarray:
    return np.array([d["embedding"] for d in body["data"]], dtype=np.float32)


def _minilm(**options: Any) -> ModelConfig:
    options.setdefault("quantization_range", 0.3)  # no int8 calibration: fewer engine calls
    options.setdefault("dtype", "float32")  # the library's computation is the reference
    options.setdefault("name", "m")
    return ModelConfig(model="builtin:all-MiniLM-L6-v2", **options)


@pytest.mark.slow
async def test_dtype_casts_the_weights_and_the_vectors_follow(st_model: Any) -> None:
    async with app_client(Settings(models=(_minilm(dtype="bfloat16", model_warmup=False),))) as c:
        entry = c.app_state.registry.loaded("m")  # type: ignore[attr-defined]
        weights = next(entry.engine.model.parameters())
        got = _vectors((await c.post("/v1/embeddings", json={"model": "m", "input": TEXTS})).json())
    assert str(weights.dtype) == "torch.bfloat16"
    want = st_model.encode(TEXTS, normalize_embeddings=True)
    # bfloat16 keeps 8 bits of mantissa: close to the float32 vectors, never equal to them
    assert 1e-3 < float(np.abs(got - want).max()) < 0.05
    assert float((got * want).sum(axis=1).min()) > 0.999


@pytest.fixture
def engine_batches(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int]]]:
    """(inputs, padded tokens per input) of every forward pass the native engine runs."""
    from openai_compat.engine.text import TextRunner

    seen: list[tuple[int, int]] = []
    original = TextRunner._forward

    def spy(self: Any, rows: Any) -> Any:
        seen.append((len(rows), max(r.length for r in rows)))
        return original(self, rows)

    monkeypatch.setattr(TextRunner, "_forward", spy)
    yield seen


@pytest.mark.slow
@pytest.mark.parametrize("warm", [True, False])
async def test_batch_size_and_model_warmup(
    engine_batches: list[tuple[int, int]], warm: bool
) -> None:
    """batch_size caps every batch the model runs; model_warmup runs one full batch and one
    max-length input before /ready (none without it). The native engine's queue forms its
    own batches: no wave feeder in front of it (wave_batching is infinity-emb's:
    test_infinity_engine.py)."""
    config = _minilm(batch_size=3, model_warmup=warm)
    async with app_client(Settings(models=(config,))) as c:
        at_ready = list(engine_batches)
        entry = c.app_state.registry.loaded("m")  # type: ignore[attr-defined]
        assert entry.feeder is None
        texts = [f"text number {i}" for i in range(8)]
        r = await c.post("/v1/embeddings", json={"model": "m", "input": texts})
        assert r.status_code == 200
    if warm:  # one input at the model's limit (256 tokens), before /ready
        assert (1, 256) in at_ready, at_ready
    else:
        # the start-up probes only: single short inputs
        assert at_ready and all(n == 1 and tokens < 16 for n, tokens in at_ready), at_ready
    served = engine_batches[len(at_ready) :]
    assert sum(n for n, _ in served) == 8 and max(n for n, _ in served) <= 3


async def test_the_warm_up_stops_at_512_tokens() -> None:
    """A model whose limit is 8,192 tokens (BGE-M3) warms up on 512: on 2 CPU cores its
    limit took 150 s of a 157 s start."""
    from types import SimpleNamespace

    from openai_compat.models import loading

    seen: list[list[str]] = []

    class Engine:
        async def embed(self, texts: list[str]) -> None:
            seen.append(texts)

    for limit, words in ((8192, 512), (256, 256), (None, 512)):
        seen.clear()
        entry = SimpleNamespace(
            config=SimpleNamespace(batch_size=2),
            max_length=limit,
            engine=Engine(),
            capabilities={"embed"},
            sparse=False,
            quantizer=None,
        )
        await loading.warm_up(entry)  # type: ignore[arg-type]
        assert [len(t) for t in seen] == [2, 1]
        assert len(seen[1][0].split()) == words


@pytest.mark.slow
async def test_compile_runs_the_forward_pass_compiled() -> None:
    """compile = true: the model's forward runs under torch.compile (a hook inside it sees
    torch.compiler.is_compiling() while the graph is traced), with the same vectors."""
    import torch

    texts = ["A man is eating food.", "The stock market crashed today."]
    answers, traced = {}, {}
    for compile_ in (False, True):
        engine = create_engine(_minilm(compile=compile_))
        seen: list[bool] = []
        engine.model[0].register_forward_hook(
            lambda *_, seen=seen: seen.append(torch.compiler.is_compiling())
        )
        await engine.astart()
        try:
            vectors, _ = await engine.embed(texts)
        finally:
            await engine.astop()
        answers[compile_], traced[compile_] = np.array(vectors), any(seen)
    assert traced == {False: False, True: True}
    np.testing.assert_allclose(answers[True], answers[False], atol=1e-5)


def test_options_that_cannot_apply_stop_start_up() -> None:
    import torch

    if not torch.cuda.is_available():  # was an IndexError from deep in torch
        with pytest.raises(EngineFailure, match="torch sees no CUDA device"):
            check_options(_minilm(device="cuda"))
    with pytest.raises(EngineFailure, match="local folder"):
        check_options(_minilm(revision="v2"))
    # infinity-emb skipped it silently; the native engine has no BetterTransformer to swap in
    with pytest.raises(EngineFailure, match="native engine runs transformers' own attention"):
        check_options(_minilm(bettertransformer=True))
    # forward lanes are the native scheduler's: on infinity-emb's engines they would do nothing
    with pytest.raises(EngineFailure, match="forward_lanes applies to the native engine"):
        check_options(_minilm(engine="optimum", forward_lanes=2))
    check_options(_minilm(device="cpu"))


def _seed_hub(repo: str, folder: Path, revision: str) -> None:
    from huggingface_hub import constants

    from tests.fixtures.hub_cache import seed

    seed(Path(constants.HF_HUB_CACHE), repo, folder, revision)


@pytest.mark.slow
async def test_revision_loads_that_revision_of_a_hub_model(
    tmp_path: Path, minilm_path: str, st_model: Any
) -> None:
    """The offline hub cache holds two revisions of one repo: main (mean pooling) and v2 (CLS
    pooling); `revision` picks which one is served."""
    cls = tmp_path / "cls"
    shutil.copytree(minilm_path, cls)
    pooling = json.loads((cls / "1_Pooling" / "config.json").read_text())
    pooling.update(pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    (cls / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    repo = f"test-org/minilm-{tmp_path.name}"
    _seed_hub(repo, Path(minilm_path), "main")
    _seed_hub(repo, cls, "v2")
    models = (
        ModelConfig(model=repo, name="main", quantization_range=0.3, model_warmup=False),
        ModelConfig(
            model=repo, name="v2", revision="v2", quantization_range=0.3, model_warmup=False
        ),
    )
    async with app_client(Settings(models=models)) as c:
        got = {
            name: _vectors(
                (await c.post("/v1/embeddings", json={"model": name, "input": TEXTS})).json()
            )
            for name in ("main", "v2")
        }
    np.testing.assert_allclose(got["main"], st_model.encode(TEXTS), atol=1e-5)
    assert float(np.abs(got["v2"] - got["main"]).max()) > 0.05


NEGATED = '''
from transformers import BertModel


class NegatedBert(BertModel):
    """BertModel whose hidden states come out negated: code only this folder ships."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        if isinstance(out, tuple):  # return_dict=False, as sentence-transformers calls it
            return (-out[0],) + out[1:]
        out["last_hidden_state"] = -out["last_hidden_state"]
        return out
'''


@pytest.mark.slow
async def test_trust_remote_code_runs_the_folders_own_model_code(
    tmp_path: Path, minilm_path: str, st_model: Any
) -> None:
    folder = tmp_path / "negated"
    shutil.copytree(minilm_path, folder)
    (folder / "modeling_negated.py").write_text(NEGATED)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_negated.NegatedBert"}
    (folder / "config.json").write_text(json.dumps(config))
    models = tuple(
        ModelConfig(
            model=str(folder),
            name=name,
            trust_remote_code=trusted,
            quantization_range=0.3,
            model_warmup=False,
        )
        for name, trusted in (("plain", False), ("trusted", True))
    )
    async with app_client(Settings(models=models)) as c:
        got = {
            name: _vectors(
                (await c.post("/v1/embeddings", json={"model": name, "input": TEXTS})).json()
            )
            for name in ("plain", "trusted")
        }
    want = st_model.encode(TEXTS, normalize_embeddings=True)
    np.testing.assert_allclose(got["plain"], want, atol=1e-5)  # its code is not run
    np.testing.assert_allclose(got["trusted"], -want, atol=1e-5)  # its code is run


def _direct_ids(minilm_path: str, rows: list[list[int]]) -> np.ndarray:
    """MiniLM run by transformers on exactly these ids: mean-pooled, normalised."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(minilm_path).eval()
    out = []
    with torch.inference_mode():
        for ids in rows:
            hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            pooled = hidden.mean(0)
            out.append((pooled / pooled.norm()).numpy())
    return np.array(out)


@pytest.mark.slow
async def test_token_ids_model_embeds_exactly_the_ids_sent(minilm_path: str) -> None:
    """token_ids = "model": [1,1,1,1,1] is 5 tokens and the vector of those ids (it was their
    decoded text re-tokenized: 22 tokens, another vector); usage counts the ids; ids past the
    model's limit are cut with truncate = true (refused without, as /v1/embeddings' default)."""
    models = (
        _minilm(name="ids", token_ids="model", truncate=True, model_warmup=False),
        _minilm(name="strict", token_ids="model", model_warmup=False),
    )
    rows = [[1, 1, 1, 1, 1], [101, 7592, 2088, 102]]
    async with app_client(Settings(models=models)) as c:
        r = await c.post("/v1/embeddings", json={"model": "ids", "input": rows})
        assert r.status_code == 200, r.text
        body = r.json()
        long = await c.post("/v1/embeddings", json={"model": "ids", "input": [[2023] * 300]})
        refused = await c.post("/v1/embeddings", json={"model": "strict", "input": [[2023] * 300]})
        text = await c.post("/v1/embeddings", json={"model": "ids", "input": ["hello world"]})
    assert body["usage"]["prompt_tokens"] == 9
    np.testing.assert_allclose(_vectors(body), _direct_ids(minilm_path, rows), atol=1e-5)
    assert long.json()["usage"]["prompt_tokens"] == 256  # the model's limit
    np.testing.assert_allclose(
        _vectors(long.json())[0], _direct_ids(minilm_path, [[2023] * 256])[0], atol=1e-5
    )
    assert refused.status_code == 400 and "300 tokens" in refused.json()["error"]["message"]
    # text on the same model is tokenized as usual ([CLS] hello world [SEP])
    assert text.json()["usage"]["prompt_tokens"] == 4
    np.testing.assert_allclose(_vectors(text.json())[0], _vectors(body)[1], atol=1e-5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"engine": "optimum", "backend": "onnx"}, "backend applies to engine = 'native' only"),
        ({"quantize": "int8"}, "quantize applies to backend = 'onnx' or 'openvino'"),
        ({"engine": "torch", "quantize": "int8"}, "quantize applies to backend = 'onnx'"),
    ],
)
def test_backend_and_quantize_are_refused_where_they_do_nothing(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        ModelConfig(model="builtin:all-MiniLM-L6-v2", **options)
    # where they apply, the same options are accepted
    ModelConfig(model="builtin:all-MiniLM-L6-v2", engine="native", backend="onnx", quantize="int8")
