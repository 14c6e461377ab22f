"""--ray: what Ray Serve costs and what its replicas buy (issue #27).

Two phases, each its own single-node Ray cluster (`ray start --head`, loopback, a temporary
HOME and temp dir) pinned with sched_setaffinity like every benchmark server, and
`openai-compat serve --ray` deploying the same TOML the single-process server reads:

- overhead: Ray with one model replica (num_cpus 1; the ingress and the proxy on the same
  core) vs the single-process server, both on --server-cpus (one core by default): the cost of
  Ray's proxy, the ingress hop and the DeploymentHandle call;
- scaling: a node on two cores with one model replica vs two (num_cpus 1 each: Ray gives each
  one thread), redeployed in place round after round; the single-process server on the same
  two cores (two engine threads) is the third row. On a 2-CPU machine the load generator
  shares the second core here (said so in the result). With --ray-env the node runs with it.

Every request carries --inputs texts (default 16), --concurrency in flight (default 16),
--rounds alternated rounds (the order flips each round); texts are short sentences, or of
--ray-tokens tokens each. Writes ray-serve.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from benchkit.grid import mean_tokens, texts_of_length
from benchkit.load import Result, Scenario, drive_http, sentences
from benchkit.systems import SERVER_ENV, Server, _start, free_port, wait_ready

SERVED = "all-MiniLM-L6-v2"


def _config(path: Path, replicas: int) -> Path:
    path.write_text(
        "cache_bytes = 0\n"  # the benchmark repeats its body: measure the serving path
        f'[[models]]\nname = "{SERVED}"\nmodel = "builtin:all-MiniLM-L6-v2"\n'
        'device = "cpu"\nbatch_size = 32\n'
        f"ray = {{num_replicas = {replicas}, ray_actor_options = {{num_cpus = 1}}}}\n"
        "[ray_ingress]\nray_actor_options = {num_cpus = 0}\n"
    )
    return path


def _pinned(cpus: set[int]) -> Any:
    return lambda: os.sched_setaffinity(0, cpus)


class RayNode:
    """One `ray start --head` node on `cpus`, with the app deployed by our CLI."""

    def __init__(
        self, cpus: set[int], workdir: Path, extra_env: dict[str, str] | None = None
    ) -> None:
        self.cpus = cpus
        self.root = Path(tempfile.mkdtemp(prefix="rb-", dir="/tmp"))  # short socket paths
        (self.root / "home").mkdir()
        self.env = {
            **os.environ,
            **SERVER_ENV,
            "HOME": str(self.root / "home"),
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_ADDRESS": "",
        }
        self.env.pop("OMP_NUM_THREADS", None)  # Ray gives each actor its num_cpus
        self.env.update(extra_env or {})  # e.g. a Ray Serve setting, for every process
        if self.env.get("RAY_SERVE_ENABLE_HA_PROXY") == "1":
            # HAProxy's files and fixed metrics/stats ports (/tmp/haproxy-serve, 9101, 8404)
            # are the machine's: this node gets its own, beside a second node
            hap = self.root / "haproxy"
            for key, value in (("CONFIG_FILE_LOC", "haproxy.cfg"), ("SOCKET_PATH", "admin.sock")):
                self.env[f"RAY_SERVE_HAPROXY_{key}"] = f"{hap}/{value}"
            self.env["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"] = str(hap)
            self.env["RAY_SERVE_HAPROXY_SERVER_STATE_FILE"] = f"{hap}/server-state"
            self.env["RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH"] = f"{hap}/metrics.sock"
            self.env["RAY_SERVE_HAPROXY_METRICS_PORT"] = str(free_port())
            self.env["RAY_SERVE_HAPROXY_STATS_PORT"] = str(free_port())
        # a driver keeps to loopback only while Ray thinks clusters are off
        self.driver_env = {**self.env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
        # Ray replaces a --node-ip-address of 127.0.0.1 with the interface's address; another
        # loopback address stays as given
        self.address = f"127.0.0.2:{free_port()}"
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = workdir / f"ray-{len(cpus)}cpu{'-env' if extra_env else ''}.log"
        cmd = [self._ray(), "start", "--head", f"--port={self.address.rsplit(':', 1)[1]}"]
        cmd += ["--node-ip-address=127.0.0.2", f"--num-cpus={len(cpus)}"]
        cmd += ["--include-dashboard=false", "--disable-usage-stats"]
        cmd += [f"--temp-dir={self.root}/t", f"--dashboard-agent-listen-port={free_port()}"]
        cmd += [f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}"]
        subprocess.run(
            cmd,
            env=self.env,
            check=True,
            capture_output=True,
            timeout=180,
            preexec_fn=_pinned(cpus),
        )

    @staticmethod
    def _ray() -> str:
        return str(Path(sys.executable).with_name("ray"))

    def deploy(self, config: Path) -> float:
        """Deploy (or roll out) `config`; the seconds until the app ran."""
        port = self.url.rsplit(":", 1)[1]
        cmd = [sys.executable, "-m", "openai_compat", "serve", "--ray", self.address]
        cmd += ["--config", str(config), "--host", "127.0.0.1", "--port", port]
        cmd += ["--log-level", "warning", "--ray-proxy-location", "HeadOnly"]
        started = time.monotonic()
        done = subprocess.run(
            cmd,
            env=self.driver_env,
            capture_output=True,
            text=True,
            timeout=900,
            preexec_fn=_pinned(self.cpus),
        )
        with self.log.open("a") as log:
            log.write(done.stdout + done.stderr)
        if done.returncode:
            raise RuntimeError(f"deploy failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
        seconds = time.monotonic() - started
        # the first requests through a new proxy route and handle take seconds: not measured
        body = {"model": SERVED, "input": sentences(16, 3)}  # warm-up only
        with httpx.Client(timeout=300) as client:
            for _ in range(3):
                client.post(self.url + "/v1/embeddings", json=body).raise_for_status()
        return seconds

    def stop(self) -> None:
        """`ray stop`, then until none of this node's processes is left (30 s at most)."""
        subprocess.run(
            [self._ray(), "stop", "--force"], env=self.env, capture_output=True, timeout=120
        )
        subprocess.run(["pkill", "-TERM", "-f", f"haproxy -db -f {self.root}/"], check=False)
        deadline = time.monotonic() + 30
        while _running(str(self.root).encode()) and time.monotonic() < deadline:
            time.sleep(0.5)
        shutil.rmtree(self.root, ignore_errors=True)


def _running(marker: bytes) -> bool:
    """Whether a live process's command line holds `marker`."""
    for proc in Path("/proc").iterdir():
        try:
            if marker in (proc / "cmdline").read_bytes():
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    return True
        except (OSError, IndexError):
            continue
    return False


def _single(config: Path, cpus: set[int], workdir: Path) -> Server:
    """The single-process server on `cpus`, one engine thread per CPU."""
    port = free_port()
    cmd = [sys.executable, "-m", "openai_compat", "serve", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--config", str(config), "--log-level", "warning"]
    return _start(f"single-{len(cpus)}cpu", cmd, port, workdir, cpus)


def _texts(args: argparse.Namespace, count: int, seed: int) -> list[str]:
    """Short sentences (8-16 words), or texts of --ray-tokens tokens each."""
    if args.ray_tokens:
        return texts_of_length(args.ray_tokens, count, seed)
    return sentences(count, seed)


def _busy_cores(seconds: float) -> float:
    """Cores' worth of CPU time the whole machine spent busy over `seconds` (/proc/stat)."""

    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields) - idle, sum(fields)

    busy0, total0 = sample()
    time.sleep(seconds)
    busy1, total1 = sample()
    cores = os.cpu_count() or 1
    return round((busy1 - busy0) / max(1, total1 - total0) * cores, 3)


def _group(cmdline: list[str]) -> str:
    """Which part of the system a process is, for the CPU accounting."""
    first, line = cmdline[0], " ".join(cmdline)
    if first.startswith("ray::ServeReplica:"):
        return "replica " + first.rsplit(":", 1)[-1]
    if first.startswith("ray::ProxyActor"):
        return "ray proxy"
    if first.endswith("/haproxy"):  # RAY_SERVE_ENABLE_HA_PROXY=1: the proxy's data plane
        return "haproxy"
    if "bench.py" in line:
        return "load generator"
    if "openai_compat serve --ray" in line:
        return "deploy command"
    if "openai_compat serve" in line:
        return "single-process server"
    if first.startswith("ray::") or "/ray/" in line:
        return "ray control plane"  # controller, GCS, raylet, agents, monitors
    return "other"


def _cpu_seconds() -> dict[int, tuple[str, float]]:
    """Every process's CPU seconds so far (user + system), with its group."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, IndexError):
            continue
        if cmdline and cmdline[0]:
            out[int(proc.name)] = (_group(cmdline), (int(fields[11]) + int(fields[12])) / tick)
    return out


def _cores_by_group(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], seconds: float
) -> dict[str, float]:
    used: dict[str, float] = {}
    for pid, (group, cpu) in after.items():
        used[group] = used.get(group, 0.0) + cpu - before.get(pid, (group, 0.0))[1]
    return {g: round(c / seconds, 3) for g, c in sorted(used.items()) if c / seconds >= 0.005}


async def _measure(url: str, sc: Scenario, args: argparse.Namespace) -> dict[str, Any]:
    body = orjson.dumps({"model": SERVED, "input": _texts(args, sc.inputs, 11)})
    cpu_before, started = _cpu_seconds(), time.monotonic()
    ok, errors, seconds, lat = await drive_http(
        url + "/v1/embeddings",
        body,
        sc,
        args.durations["minilm"],
        args.warmups["minilm"],
        args.max_requests,
    )
    cores = _cores_by_group(cpu_before, _cpu_seconds(), time.monotonic() - started)
    run = Result("", sc, ok, errors, seconds, lat)
    return {
        "cpu_cores_by_part": cores,  # over the run, warm-up included
        "requests": ok,
        "errors": errors,
        "inputs_per_s": round(run.inputs_per_s, 1),
        "p50_ms": round(run.pct(0.5), 1) if lat else None,
        "p99_ms": round(run.pct(0.99), 1) if lat else None,
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


async def _overhead(args: argparse.Namespace, sc: Scenario, workdir: Path) -> dict[str, Any]:
    """Ray with one replica vs the single process on one core; with --ray-env, also a second
    node whose processes get that environment (e.g. a Ray Serve setting), in the same rounds."""
    cpus = set(args.server_cpus) if len(args.server_cpus) == 1 else {min(args.server_cpus)}
    config = _config(workdir / "ray-1.toml", 1)
    nodes = {"ray": RayNode(cpus, workdir)}
    if args.ray_env:
        nodes["ray-env"] = RayNode(cpus, workdir, dict(kv.split("=", 1) for kv in args.ray_env))
    single = _single(config, cpus, workdir)
    rounds = []
    try:
        deploy_s = {name: node.deploy(config) for name, node in nodes.items()}["ray"]
        await wait_ready(single, "/ready", limit=600)
        # with no traffic: what Ray's own processes (controller, GCS, raylet, agents) use
        idle = _busy_cores(10.0)
        systems = ["single", *nodes]
        for rnd in range(args.rounds):
            order = systems[rnd % len(systems) :] + systems[: rnd % len(systems)]
            row: dict[str, Any] = {"round": rnd + 1}
            for system in order:
                url = single.url if system == "single" else nodes[system].url
                row[system] = await _measure(url, sc, args)
                print(f"[ray] overhead round {rnd + 1} {system}: {row[system]}", file=sys.stderr)
            row["ratio"] = round(row["ray"]["inputs_per_s"] / row["single"]["inputs_per_s"], 3)
            if "ray-env" in row:
                row["ratio_env"] = round(
                    row["ray-env"]["inputs_per_s"] / row["single"]["inputs_per_s"], 3
                )
            rounds.append(row)
    finally:
        single.stop()
        for node in nodes.values():
            node.stop()
    result = {
        "cpus": sorted(cpus),
        "deploy_seconds": round(deploy_s, 1),
        "idle_busy_cores": idle,  # the machine's, Ray node(s) and idle servers up, no traffic
        "rounds": rounds,
        "ray_vs_single": _spread([r["ratio"] for r in rounds]),
        "overhead": round(1 - statistics.median(r["ratio"] for r in rounds), 3),
    }
    if args.ray_env:
        result["ray_env"] = args.ray_env
        result["ray_env_vs_single"] = _spread([r["ratio_env"] for r in rounds])
    return result


async def _scaling(args: argparse.Namespace, sc: Scenario, workdir: Path) -> dict[str, Any]:
    cpus = set(sorted(args.server_cpus | args.gen_cpus)[:2])
    configs = {n: _config(workdir / f"ray-{n}.toml", n) for n in (1, 2)}
    env = dict(kv.split("=", 1) for kv in args.ray_env)
    node = RayNode(cpus, workdir, env or None)
    single = _single(configs[1], cpus, workdir)
    rounds = []
    try:
        await wait_ready(single, "/ready", limit=600)
        deployed = None
        for rnd in range(args.rounds):
            order: list[int | str] = [1, 2, "single"] if rnd % 2 == 0 else ["single", 2, 1]
            row: dict[str, Any] = {"round": rnd + 1}
            for system in order:
                if system == "single":
                    row["single"] = await _measure(single.url, sc, args)
                    print(f"[ray] scaling round {rnd + 1} single: {row['single']}", file=sys.stderr)
                    continue
                assert isinstance(system, int)
                if deployed != system:
                    row[f"deploy_{system}_s"] = round(node.deploy(configs[system]), 1)
                    deployed = system
                row[f"ray_{system}"] = await _measure(node.url, sc, args)
                print(
                    f"[ray] scaling round {rnd + 1} {system} replica(s): {row[f'ray_{system}']}",
                    file=sys.stderr,
                )
            row["ratio_2_vs_1"] = round(
                row["ray_2"]["inputs_per_s"] / row["ray_1"]["inputs_per_s"], 3
            )
            row["ratio_2_vs_single"] = round(
                row["ray_2"]["inputs_per_s"] / row["single"]["inputs_per_s"], 3
            )
            rounds.append(row)
    finally:
        single.stop()
        node.stop()
    return {
        "cpus": sorted(cpus),
        "ray_env": args.ray_env,
        "generator_shares_a_server_cpu": bool(args.gen_cpus & cpus),
        "rounds": rounds,
        "two_vs_one_replica": _spread([r["ratio_2_vs_1"] for r in rounds]),
        "two_replicas_vs_single_process": _spread([r["ratio_2_vs_single"] for r in rounds]),
    }


async def ray_serve(args: argparse.Namespace, out_dir: Path, workdir: Path) -> dict[str, Any]:
    sc = Scenario("minilm", args.inputs[0], "float", "text", args.concurrency[0])
    result: dict[str, Any] = {
        "inputs_per_request": sc.inputs,
        "tokens_per_text": round(mean_tokens(_texts(args, sc.inputs, 11)), 1),
        "concurrency": sc.concurrency,
        "seconds_per_run": args.durations["minilm"],
        "generator_cpus": sorted(args.gen_cpus),
    }
    if "overhead" in args.ray_phases:
        result["overhead"] = await _overhead(args, sc, workdir)
        print(json.dumps({"ray_vs_single": result["overhead"]["ray_vs_single"]}), flush=True)
    if "scaling" in args.ray_phases:
        result["scaling"] = await _scaling(args, sc, workdir)
        print(json.dumps({"two_vs_one": result["scaling"]["two_vs_one_replica"]}), flush=True)
    (out_dir / "ray-serve.json").write_text(json.dumps(result, indent=2))
    return result
