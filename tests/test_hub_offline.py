"""A hub model that cannot be had is one line, once, before any engine starts: not in the
local cache and the hub unreachable (offline the hub library retried each file for ~23 s,
logging every try, then the load failed with its full text), or HF_HUB_OFFLINE set. The hub
here is a closed port on 127.0.0.1: no traffic leaves the machine."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from openai_compat.frame.settings import ModelConfig
from openai_compat.models import loading
from openai_compat.models.registry import EngineFailure


@pytest.fixture
def no_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from huggingface_hub import constants

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


def test_an_uncached_model_without_a_hub_is_one_line_and_quick(
    no_hub: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = ModelConfig(model="example-org/not-cached", name="m", load="lazy")
    with caplog.at_level(logging.WARNING), pytest.raises(EngineFailure) as failed:
        loading.check_options(config)
    message = str(failed.value)
    assert message.startswith("model 'm' (example-org/not-cached) failed to load: it is not in")
    assert str(no_hub) in message and "the model hub cannot be reached" in message
    assert "openai-compat download" in message and "\n" not in message
    assert not [r for r in caplog.records if "Retrying" in r.getMessage()]  # no retry spam


def test_hf_hub_offline_is_said_as_such(no_hub: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    config = ModelConfig(model="example-org/not-cached", name="m")
    with pytest.raises(EngineFailure, match="HF_HUB_OFFLINE is set"):
        loading.check_options(config)


def test_a_cached_model_needs_no_hub(no_hub: Path, minilm_path: str) -> None:
    from tests.fixtures.hub_cache import seed

    seed(no_hub, "example-org/cached", Path(minilm_path))
    loading.check_options(ModelConfig(model="example-org/cached", name="m"))  # no error
