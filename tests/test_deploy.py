"""cerebrium.toml against Cerebrium's documented schema, its entrypoint booted locally, and the
Dockerfile's structure (no Docker engine here to build it)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest

from openai_compat.web.server import SHUTDOWN_MARGIN
from tests.utils import SERVER_ENV, free_port

ROOT = Path(__file__).resolve().parent.parent

# The cerebrium.toml fields as Cerebrium documents them, section by section:
# - [cerebrium.deployment], [cerebrium.hardware], [cerebrium.dependencies.*]:
#   https://docs.cerebrium.ai/docs/container-images/defining-container-images
# - [cerebrium.scaling] (min/max_replicas, cooldown, replica_concurrency, scaling metrics):
#   https://docs.cerebrium.ai/docs/scaling/scaling-apps ;
#   response_grace_period (SIGTERM, then SIGKILL once it has elapsed):
#   https://docs.cerebrium.ai/docs/scaling/graceful-termination ;
#   roll_out_duration_seconds (0-600): https://docs.cerebrium.ai/docs/deployments/gradual-roll-out
# - [cerebrium.runtime.custom] (port, entrypoint, healthcheck_endpoint, readycheck_endpoint,
#   dockerfile_path): https://docs.cerebrium.ai/docs/container-images/custom-web-servers
# section -> key -> (type, allowed values or None). Required keys marked in REQUIRED.
SCHEMA: dict[str, dict[str, tuple[type | tuple[type, ...], Any]]] = {
    "deployment": {
        "name": (str, None),
        "python_version": (str, {"3.10", "3.11", "3.12", "3.13"}),
        "disable_auth": (bool, None),
        "include": (list, None),
        "exclude": (list, None),
        "shell_commands": (list, None),
        "pre_build_commands": (list, None),
        "docker_base_image_url": (str, None),
        "use_uv": (bool, None),
    },
    "hardware": {
        "cpu": ((int, float), None),
        "memory": ((int, float), None),
        "compute": (
            str,
            {
                "CPU",
                "TURING_T4",
                "AMPERE_A10",
                "ADA_L4",
                "AMPERE_A100_40GB",
                "AMPERE_A100_80GB",
                "HOPPER_H100",
                "ADA_L40",
            },
        ),
        "gpu_count": (int, None),
        "provider": (str, {"aws", "gcp"}),
        "region": (str, None),
    },
    "scaling": {
        "min_replicas": (int, None),
        "max_replicas": (int, None),
        "cooldown": (int, None),
        "replica_concurrency": (int, None),
        "response_grace_period": (int, None),
        "scaling_metric": (
            str,
            {
                "concurrency_utilization",
                "requests_per_second",
                "cpu_utilization",
                "memory_utilization",
            },
        ),
        "scaling_target": (int, None),
        "scaling_buffer": (int, None),
        "roll_out_duration_seconds": (int, None),
    },
    "runtime.custom": {
        "port": (int, None),
        "entrypoint": (list, None),
        "healthcheck_endpoint": (str, None),
        "readycheck_endpoint": (str, None),
        "dockerfile_path": (str, None),
    },
}
REQUIRED = {
    "deployment": {"name"},
    "hardware": {"cpu", "memory", "compute"},
    "runtime.custom": {"port", "entrypoint"},
}


def _config() -> dict[str, Any]:
    return tomllib.loads((ROOT / "cerebrium.toml").read_text())["cerebrium"]


def _section(cfg: dict[str, Any], dotted: str) -> dict[str, Any]:
    for part in dotted.split("."):
        cfg = cfg[part]
    return cfg


def test_cerebrium_toml_matches_the_schema() -> None:
    cfg = _config()
    assert set(cfg) <= {"deployment", "hardware", "scaling", "runtime", "dependencies"}
    for name, keys in SCHEMA.items():
        section = _section(cfg, name)
        assert set(section) <= set(keys), f"unknown keys in [{name}]: {set(section) - set(keys)}"
        assert REQUIRED.get(name, set()) <= set(section)
        for key, value in section.items():
            kind, allowed = keys[key]
            assert isinstance(value, kind) and not (kind is int and isinstance(value, bool)), key
            if allowed is not None:
                assert value in allowed, f"{name}.{key} = {value!r}"
    deps = cfg["dependencies"]
    assert set(deps) <= {"pip", "apt", "conda", "paths"}
    assert all(isinstance(v, str) for table in deps.values() for v in table.values())


def test_cerebrium_values_fit_the_server() -> None:
    cfg = _config()
    runtime, scaling, hardware = cfg["runtime"]["custom"], cfg["scaling"], cfg["hardware"]
    assert hardware["compute"] == "AMPERE_A10" and hardware["gpu_count"] >= 1
    assert runtime["healthcheck_endpoint"] == "/health"
    assert runtime["readycheck_endpoint"] == "/ready"
    entry = runtime["entrypoint"]
    assert entry[:2] == ["openai-compat", "serve"]
    args = dict(zip(entry[2::2], entry[3::2], strict=True))
    assert int(args["--port"]) == runtime["port"]
    assert args["--host"] == "0.0.0.0"
    assert (ROOT / args["--config"]).is_file()
    # Cerebrium sends SIGKILL once response_grace_period has elapsed after SIGTERM: it must
    # cover the server's real worst case, the drain deadline plus the engine-stop margin.
    worst_case = float(args["--graceful-timeout"]) + SHUTDOWN_MARGIN
    assert scaling["response_grace_period"] >= worst_case
    assert 0 <= scaling["min_replicas"] <= scaling["max_replicas"]
    assert scaling["replica_concurrency"] > 1  # one replica batches concurrent requests
    assert any("pip install" in c and "." in c for c in cfg["deployment"]["shell_commands"])
    # the shipped production config is the tutorial's four models, in its order
    prod = tomllib.loads((ROOT / args["--config"]).read_text())["models"]
    assert [m["model"] for m in prod] == [
        "openai/clip-vit-base-patch32",
        "michaelfeil/bge-small-en-v1.5",
        "mixedbread-ai/mxbai-rerank-xsmall-v1",
        "philschmid/tiny-bert-sst2-distilled",
    ]


@pytest.mark.slow
def test_cerebrium_entrypoint_boots_with_the_offline_config() -> None:
    """The exact entrypoint, with the offline model config and a free loopback port."""
    entry = list(_config()["runtime"]["custom"]["entrypoint"])
    entry[entry.index("--config") + 1] = str(ROOT / "configs" / "offline.toml")
    entry[entry.index("--host") + 1] = "127.0.0.1"  # tests bind loopback only
    port = free_port()
    entry[entry.index("--port") + 1] = str(port)
    exe = str(Path(sys.executable).with_name(entry[0]))  # the installed console script
    proc = subprocess.Popen(
        [exe, *entry[1:]],
        cwd=ROOT,
        env={**os.environ, **SERVER_ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 240
        status = None
        while time.monotonic() < deadline and proc.poll() is None and status != 200:
            try:
                status = httpx.get(url + "/ready", timeout=2).status_code
            except httpx.TransportError:
                time.sleep(0.2)
        assert status == 200, f"not ready: {shlex.join(entry)}"
        assert httpx.get(url + "/health").status_code == 200
        r = httpx.post(url + "/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": "hello"})
        assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 384
    finally:
        proc.terminate()
        proc.wait(60)
    assert proc.returncode == 0  # drained and stopped cleanly on SIGTERM


def test_dockerfile_runs_the_same_cli() -> None:
    text = (ROOT / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    assert re.fullmatch(r"ARG BASE_IMAGE=python:3\.1[1-3]-slim", lines[0])  # the official base
    assert lines[1] == "FROM ${BASE_IMAGE}"  # or a local one (scripts/check_image.py)
    exposed = {int(p) for ln in lines if ln.startswith("EXPOSE") for p in ln.split()[1:]}
    port_env = re.search(r"OPENAI_COMPAT_PORT=(\d+)", text)
    assert port_env and int(port_env.group(1)) in exposed
    assert re.search(r"OPENAI_COMPAT_HOST=0\.0\.0\.0", text)
    (entry,) = [ln for ln in lines if ln.startswith("ENTRYPOINT")]
    assert entry == 'ENTRYPOINT ["openai-compat", "serve"]'
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["openai-compat"] == "openai_compat.cli:main"
    assert "STOPSIGNAL SIGTERM" in lines
    for ln in lines:
        if ln.startswith("COPY"):
            for src in ln.split()[1:-1]:
                assert (ROOT / src).exists(), src


def test_dockerfile_builds_a_cpu_image_for_a_user_and_two_volumes() -> None:
    """What scripts/check_image.py proves by running the image, in the text CI always reads."""
    text = (ROOT / "Dockerfile").read_text()
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in text
    assert re.search(r'pip install "\$TORCH_SPEC" --index-url "\$TORCH_INDEX_URL"', text)
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0")  # the server's user is the last one set
    assert 'VOLUME ["/models", "/data"]' in text
    assert "HF_HOME=/models" in text and "OPENAI_COMPAT_DATA_DIR=/data" in text
    (check,) = re.findall(r"^HEALTHCHECK .*\n.*", text, re.M)
    assert "/health" in check
    # the build context is an allow-list (no .venv, .git or test artifacts): exactly what the
    # COPY lines take
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    rules = [r.strip() for r in lines if r.strip() and not r.startswith("#")]
    copied = {src for ln in text.splitlines() if ln.startswith("COPY") for src in ln.split()[1:-1]}
    assert rules[0] == "*" and {r[1:] for r in rules if r.startswith("!")} == copied
