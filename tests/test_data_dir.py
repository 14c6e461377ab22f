"""Two servers of one user do not share a data dir by default (one per port), and a data dir
held by another process is refused naming that process (the quick-start server answered the
Batch API with a bare 503 while a second server held the one default dir)."""

from __future__ import annotations

from pathlib import Path

import pytest

from openai_compat.batch.store import Store, StoreBusy
from openai_compat.frame.settings import Settings


def test_the_default_data_dir_is_per_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert Settings(port=8000).data() == tmp_path / "openai-compat" / "port-8000"
    assert Settings(port=9000).data() != Settings(port=8000).data()
    assert Settings(port=9000, data_dir=tmp_path / "mine").data() == tmp_path / "mine"
    legacy = tmp_path / "openai-compat"  # made before per-port defaults: still used
    legacy.mkdir()
    (legacy / "batch.sqlite3").touch()
    assert Settings(port=9000).data() == legacy


def test_a_held_data_dir_names_its_holder(tmp_path: Path) -> None:
    first = Store(tmp_path / "data", holder="pid 4242, port 8000")
    try:
        with pytest.raises(StoreBusy, match=r"\(pid 4242, port 8000\); give each server"):
            Store(tmp_path / "data")
    finally:
        first.close()
    Store(tmp_path / "data").close()  # free again once the holder is gone
