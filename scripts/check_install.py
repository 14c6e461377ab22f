"""Prove the README's first command on a fresh virtual environment, as a new user runs it.

CI runs this before the test suite (the suite's venv has the `test` extra, which can hide a
runtime dependency that only a test package brings). Steps:

1. a new venv with no extras: the `pip install ...` steps of the README's first command, as written;
   the torch they install must be a CPU build (`torch.version.cuda is None`: on Linux PyPI's
   torch is the CUDA build, which the README's PyTorch CPU index avoids). pip's configuration is
   not isolated for that step here: this machine reaches no PyTorch index, only the local wheel
   folder its pip configuration names (which holds the same CPU build); elsewhere the step runs
   as any user runs it;
2. `openai-compat serve` on the offline default model: wait for /ready, one /v1/embeddings answer
   (384 floats whose cosine matches the packaged model's known value), SIGTERM, exit status 0;
3. the same venv with the package re-installed non-editable (`pip install .`, what the Dockerfile
   and cerebrium.toml run), served from outside the source tree, checked the same way.

Usage: python3 scripts/check_install.py [--keep]   (stdlib only; runs on any python3 >= 3.11)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# FACTS: cos of these two under all-MiniLM-L6-v2 is 0.7553
PAIR = ["A man is eating food.", "A man is eating a piece of bread."]
EXPECTED_COSINE = 0.7553
# How far the pair's cosine may be from it, by the dtype the server says it serves in
# (/v1/models): fp32 reproduces the library's value; bfloat16 (the default on a CPU with
# bf16 instructions) keeps 8 mantissa bits, measured 0.7542 on such a CPU (CI's runner).
COSINE_TOLERANCE = {"float32": 5e-4, "bfloat16": 3e-3, "float16": 2e-3}
READY_TIMEOUT = 180.0
STOP_TIMEOUT = 60.0


def readme_first_command() -> list[str]:
    """The README's first bash block, split on `&&` (the Quick start's serve command)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    if block is None:
        raise SystemExit("README.md has no bash block")
    steps = [s.strip() for s in block.group(1).replace("\\\n", " ").split("&&")]
    if not steps or steps[-1] != "openai-compat serve":
        raise SystemExit(f"README's first command does not end in `openai-compat serve`: {steps}")
    return steps


def run(cmd: list[str], **kw: object) -> None:
    print("+", shlex.join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def request(url: str, body: dict[str, object] | None = None, timeout: float = 60.0) -> object:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def serve_and_check(venv: Path, cwd: Path, data_home: Path, label: str) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "XDG_DATA_HOME": str(data_home), "DO_NOT_TRACK": "1"}
    env.pop("PYTHONPATH", None)
    cmd = [str(venv / "bin" / "openai-compat"), "serve", "--host", "127.0.0.1", "--port", str(port)]
    print(f"[{label}] +", shlex.join(cmd), flush=True)
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"[{label}] server exited with {proc.returncode} before /ready")
            try:
                request(base + "/ready", timeout=5)
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    raise SystemExit(f"[{label}] not ready after {READY_TIMEOUT:.0f}s") from None
                time.sleep(0.5)
        listing = request(base + "/v1/models")
        assert isinstance(listing, dict), listing
        dtype = next(m.get("dtype") for m in listing["data"] if m["id"] == "all-MiniLM-L6-v2")
        if dtype not in COSINE_TOLERANCE:
            raise SystemExit(f"[{label}] /v1/models says the default model runs in {dtype!r}")
        answer = request(base + "/v1/embeddings", {"model": "all-MiniLM-L6-v2", "input": PAIR})
        assert isinstance(answer, dict), answer
        vectors = [row["embedding"] for row in answer["data"]]
        if len(vectors) != 2 or any(len(v) != 384 for v in vectors):
            raise SystemExit(f"[{label}] expected 2 x 384 floats, got {[len(v) for v in vectors]}")
        dot = sum(a * b for a, b in zip(*vectors, strict=True))
        norms = math.prod(math.sqrt(sum(x * x for x in v)) for v in vectors)
        cosine = dot / norms
        if abs(cosine - EXPECTED_COSINE) > COSINE_TOLERANCE[dtype]:
            raise SystemExit(
                f"[{label}] cosine {cosine:.4f} in {dtype}, expected {EXPECTED_COSINE}"
                f" +- {COSINE_TOLERANCE[dtype]}"
            )
        print(f"[{label}] 2 x 384 floats in {dtype}, cosine {cosine:.4f}", flush=True)
        # package data came along: the playground page, the docs pages' own script, and the
        # Swagger UI build the runtime dependencies bring
        for path, marker in (
            ("/playground", b"<html"),
            ("/docs/assets/swagger-init.js", b"SwaggerUIBundle"),
            ("/docs/assets/swagger-ui-bundle.js", b"SwaggerUI"),
        ):
            with urllib.request.urlopen(base + path, timeout=10) as page:
                if marker.lower() not in page.read(1 << 20).lower():
                    raise SystemExit(f"[{label}] {path} is not what it should be")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=STOP_TIMEOUT)
        if code != 0:
            raise SystemExit(f"[{label}] exit status {code} after SIGTERM (expected 0)")
        print(f"[{label}] SIGTERM -> exit status 0", flush=True)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def check_cpu_torch(venv: Path) -> None:
    """The venv's torch is a CPU build (a CUDA one is gigabytes a CPU server never uses)."""
    probe = "import torch; print(torch.__version__, torch.version.cuda)"
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"the README's install cannot import torch:\n{done.stderr[-3000:]}")
    out = done.stdout.split()
    if len(out) != 2 or out[1] != "None":
        raise SystemExit(f"the README's install gave torch {' '.join(out)}: a CUDA build")
    print(f"torch {out[0]}: a CPU build", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary venv")
    args = parser.parse_args()

    steps = readme_first_command()
    installs = [s for s in steps if s.startswith("pip install ")]
    if not installs or "pip install -e ." not in installs:
        raise SystemExit(f"README's first command has no `pip install -e .`: {steps}")

    work = Path(tempfile.mkdtemp(prefix="oc-install-"))
    venv = work / "venv"
    started = time.monotonic()
    try:
        run([sys.executable, "-m", "venv", str(venv)])
        pip = [str(venv / "bin" / "python"), "-m", "pip"]
        for step in installs:  # exactly the README's pip steps, in the repo root
            run(pip + shlex.split(step)[1:] + ["-q"], cwd=ROOT)
        check_cpu_torch(venv)
        serve_and_check(venv, ROOT, work / "data-editable", "pip install -e .")

        # What the Dockerfile and cerebrium.toml run: a real (non-editable) install.
        run([*pip, "uninstall", "-q", "-y", "openai-compat"])
        run([*pip, "install", "-q", "."], cwd=ROOT)
        run([*pip, "check"])
        outside = work / "elsewhere"
        outside.mkdir()
        where = subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-c",
                "import openai_compat; print(openai_compat.__file__)",
            ],
            cwd=outside,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        if str(ROOT) in where:
            raise SystemExit(f"non-editable install still imports from the source tree: {where}")
        serve_and_check(venv, outside, work / "data-wheel", "pip install .")
        print(f"install check passed in {time.monotonic() - started:.0f}s", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
