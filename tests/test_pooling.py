"""`pooling_method` changes what it says: "cls" serves the model's first-token vector (checked
against transformers directly), "mean" the mean-pooled one; where it cannot apply, start-up
stops naming the model."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from openai_compat.engine.pooling import apply_pooling
from openai_compat.frame.settings import ModelConfig, Settings
from tests.utils import app_client

TEXTS = ["A man is eating food.", "The stock market crashed today."]


def _direct(minilm_path: str, pooling: str) -> np.ndarray:
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    model = AutoModel.from_pretrained(minilm_path).eval()
    batch = tokenizer(TEXTS, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    if pooling == "cls":
        pooled = hidden[:, 0]
    else:
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1)
    pooled = torch.nn.functional.normalize(pooled, dim=-1)  # the folder's Normalize module
    return pooled.numpy()


@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["cls", "mean"])
async def test_pooling_method_serves_that_pooling(minilm_path: str, pooling: str) -> None:
    model = ModelConfig(
        model="builtin:all-MiniLM-L6-v2", name="m", pooling_method=pooling, model_warmup=False
    )
    async with app_client(Settings(models=(model,))) as client:
        r = await client.post("/v1/embeddings", json={"model": "m", "input": TEXTS})
        assert r.status_code == 200, r.text
        got = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
    expected = _direct(minilm_path, pooling)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    other = _direct(minilm_path, "mean" if pooling == "cls" else "cls")
    assert float(np.abs(got - other).max()) > 0.05  # the two poolings really differ here


def test_pooling_method_refused_where_it_cannot_apply() -> None:
    cross_encoder: Any = type("CrossEncoderPatched", (), {})()
    with pytest.raises(ValueError, match="applies to embedding models"):
        apply_pooling(cross_encoder, "cls", pooled=False)
    with pytest.raises(ValueError, match="sparse"):
        apply_pooling(object(), "cls", pooled=True, sparse=True)
    apply_pooling(cross_encoder, "auto", pooled=False)  # auto changes nothing anywhere
    with pytest.raises(ValueError):
        ModelConfig(model="x", pooling_method="first")  # type: ignore[arg-type]
