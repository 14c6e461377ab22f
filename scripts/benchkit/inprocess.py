"""The in-process ceiling: our engine driven without HTTP, in a pinned worker process."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchkit.load import Scenario, drive_inprocess, sentences
from benchkit.stream import drive_stream, stream
from benchkit.systems import INPROCESS, MODEL_SETTINGS, pin_to_server_cpus, rss_kib, server_env

# The worker is the command itself (`bench.py --inprocess-worker`), not this module.
ENTRY = Path(__file__).resolve().parent.parent / "bench.py"


def inprocess_engine(setting: str) -> Any:
    """The same engine and settings as our server's, for calling directly: the native engine
    (loading.create_engine, as the server builds it), without HTTP."""
    from openai_compat.frame.settings import ModelConfig
    from openai_compat.models.loading import create_engine

    served, source, _, engine, batch = MODEL_SETTINGS[setting]
    config = ModelConfig(model=source, name=served, engine=engine, device="cpu", batch_size=batch)
    return create_engine(config)


async def inprocess_worker(setting: str) -> None:
    """`bench.py --inprocess-worker SETTING`: one engine, driven in its own process (pinned
    like the servers), one JSON line in (a run) and one out (its numbers) at a time."""
    # The protocol keeps the real stdout; whatever the engine prints goes to stderr.
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    engine = inprocess_engine(setting)
    await engine.astart()
    print(json.dumps({"ready": True}), file=proto, flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        if "stream" in job:  # --repeats: a stream of distinct requests (benchkit/repeats.py)
            requests = stream(*job["stream"])
            answer = await drive_stream(
                None, engine, requests, job["served"], job["concurrency"], job["duration"]
            )
            print(json.dumps(answer), file=proto, flush=True)
            continue
        sc = Scenario(**job["scenario"])
        texts = sentences(sc.inputs, job["seed"])
        ok, err, secs, lat = await drive_inprocess(
            engine, texts, sc, job["duration"], job["warmup"], job["max_requests"]
        )
        mem = rss_kib(os.getpid())
        answer = {"ok": ok, "err": err, "secs": secs, "lat": lat, **mem}
        print(json.dumps(answer), file=proto, flush=True)
    await engine.astop()


class InProcess:
    """The in-process ceiling in a worker subprocess on the server CPUs."""

    def __init__(self, setting: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(ENTRY), "--inprocess-worker", INPROCESS[setting]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=server_env(),
            text=True,
            preexec_fn=pin_to_server_cpus,
        )

    def _ask(self, job: dict[str, Any] | None) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if job is not None:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the in-process worker died")
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def start(self) -> None:
        await asyncio.to_thread(self._ask, None)

    async def run(self, job: dict[str, Any]) -> dict[str, Any]:
        return await asyncio.to_thread(self._ask, job)

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
