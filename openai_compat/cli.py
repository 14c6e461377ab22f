"""Command line -> Settings -> uvicorn. Flags are generated from the Settings model."""

from __future__ import annotations

import argparse
import os
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from openai_compat import __version__
from openai_compat.engine.build import engine_package, runs_natively
from openai_compat.frame.config import build_settings, cli_fields, env_name
from openai_compat.frame.settings import ConfigError, Settings
from openai_compat.ground import cpus, logs
from openai_compat.models import memory


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="openai-compat",
        description="A server for embedding, rerank, classify, CLIP/CLAP, multi-vector and "
        "visual document retrieval models (sentence-transformers 6) that the OpenAI, Cohere, "
        "TEI, infinity-emb, vLLM, Jina, Voyage AI and Ollama clients use unchanged.",
    )
    parser.add_argument("--version", action="version", version=f"openai-compat {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="Run the HTTP server.",
        description="Run the HTTP server. Every option can also be set by the environment "
        "variable shown, or in the --config TOML file; the command line wins.",
    )
    download = sub.add_parser(
        "download",
        help="Download the configured hub models into the local cache (HF_HOME), e.g. at "
        "image build time, so replicas start without the network.",
    )
    demo = sub.add_parser(
        "demo-models",
        help="Make offline demo models (no model hub): a reranker and a sentiment classifier "
        "fine-tuned from the packaged all-MiniLM-L6-v2 (about 30 s on 2 idle cores), three "
        "tiny visual retrieval models with random weights (plumbing, not meaning), and "
        "DIR/demo.toml serving them: `openai-compat serve --config DIR/demo.toml`.",
    )
    demo.add_argument("dir", nargs="?", default="demo", metavar="DIR", help="(default: demo)")
    batch = sub.add_parser(
        "batch",
        help="Run a batch file (OpenAI's Batch API lines) without a server; resumable.",
        description="Run every line of INPUT (OpenAI batch format: custom_id, method, url, "
        "body) through the configured models, writing OpenAI's output lines to OUTPUT (and "
        "failed lines to OUTPUT.errors.jsonl). Interrupted, the same command continues where "
        "it stopped (state in OUTPUT.state/). Takes every server option too (--config, "
        "--model...).",
    )
    batch.add_argument("input", metavar="INPUT", help="JSONL file of requests")
    batch.add_argument("-o", "--output", required=True, help="JSONL output file")
    batch.add_argument(
        "--endpoint",
        default="/v1/embeddings",
        help="the route every line calls (default /v1/embeddings; also /v1/rerank, "
        "/v2/rerank, /v1/classify)",
    )
    batch.add_argument(
        "--force", action="store_true", help="run again even if OUTPUT exists and is complete"
    )
    batch.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="run on a Ray cluster with Ray Data (ADDRESS, or RAY_ADDRESS, or a local "
        "instance); INPUT and OUTPUT may then be any URI pyarrow reads (s3://, gs://)",
    )
    batch.add_argument("--ray-actors", type=int, default=1, help="model replicas (actors)")
    batch.add_argument("--ray-cpus-per-actor", type=float, default=1.0)
    batch.add_argument("--ray-gpus-per-actor", type=float, default=0.0)
    serve.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="deploy on a Ray cluster with Ray Serve (ADDRESS, or RAY_ADDRESS, or a local "
        "instance) and return once it runs: an ingress (this app) and one deployment per "
        "model ([models.ray] in the config); run again to roll out a changed config",
    )
    serve.add_argument(
        "--ray-proxy-location",
        choices=("EveryNode", "HeadOnly"),
        default="EveryNode",
        help="where Ray Serve's HTTP proxies run (--host/--port on each)",
    )
    _add_settings_flags(serve)
    _add_settings_flags(download, DOWNLOAD_FLAGS)
    _add_settings_flags(batch, set(cli_fields()) - SERVER_ONLY_FLAGS)
    return parser


# What `download` reads: the models and where exports go.
DOWNLOAD_FLAGS = {"model", "alias", "config", "log_level", "export_dir"}
# The HTTP server's own options, which `batch` (no server: its lines run in-process) ignores.
SERVER_ONLY_FLAGS = {
    *("host", "port", "api_key", "keys_file", "admin_key", "protect_docs_and_metrics"),
    *("forwarded_allow_ips", "otel", "access_log", "graceful_timeout", "max_body_bytes"),
    *("max_load_waiters", "load_wait_timeout", "max_queued_inputs", "cache_scope"),
    *("data_dir", "batch_max_file_bytes", "batch_max_data_bytes", "batch_min_free_bytes"),
    *("max_loaded_models", "memory_budget"),
}


def _add_settings_flags(serve: argparse.ArgumentParser, only: set[str] | None = None) -> None:
    for name, field in cli_fields().items():
        if only is not None and name not in only:
            continue
        annotation = field.annotation
        extra = field.json_schema_extra or {}
        envs = " or ".join([env_name(name), *extra.get("env", [])])
        default = "none" if extra.get("secret") else repr(field.default)
        help_text = f"{field.description} [env: {envs}; default: {default}]"
        kwargs: dict[str, Any] = {"dest": name, "default": None, "help": help_text}
        origin = typing.get_origin(annotation)
        if origin is tuple:
            kwargs["action"] = "append"
            kwargs["metavar"] = name.upper()
        elif annotation is bool or annotation == (bool | None):
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["metavar"] = name.upper()
        serve.add_argument(_flag(name), **kwargs)


def serve(settings: Settings) -> int:
    """Run until stopped; 1 if a model failed to load."""
    import threading

    # No collections while the imports below make their 800k lasting objects (memory.py).
    memory.pause_collection()
    memory.before_engine_import()  # MKL keeps no per-thread GEMM buffers
    # Thread pools sized to the CPUs we may use (affinity, cgroup quota) before torch starts.
    cpus.size_pools()
    # The engine's imports (torch, transformers: seconds) start now, beside the web stack's.
    package = engine_package(c.engine for c in settings.served_models())
    threading.Thread(
        target=memory.import_engine,
        args=(package,),
        name="model-load-import",
        daemon=True,
    ).start()
    from openai_compat.ground.lifecycle import loaders_running
    from openai_compat.tenants.keys import KeysFileError
    from openai_compat.web.app import create_app
    from openai_compat.web.server import DrainingServer, PortInUse, bind

    logs.configure(settings.log_level, settings.log_format)
    if settings.metrics_port is not None and settings.metrics_port == settings.port:
        print("openai-compat: --metrics-port must differ from --port", file=sys.stderr)
        return 2
    try:
        listening = [bind(settings.host, settings.port)]
        if settings.metrics_port is not None:
            listening.append(bind(settings.host, settings.metrics_port))
    except PortInUse as exc:
        print(f"openai-compat: {exc}", file=sys.stderr)
        return 2
    try:
        app = create_app(settings)
    except KeysFileError as exc:
        print(f"openai-compat: keys file error: {exc}", file=sys.stderr)
        return 2
    server = DrainingServer(app, settings)
    fatal: list[str] = []

    def on_fatal(error: str) -> None:
        fatal.append(error)
        server.should_exit = True

    app.state.lifecycle.on_fatal = on_fatal
    server.run(sockets=listening)
    status = 0
    if fatal:
        print(f"openai-compat: {fatal[0]}", file=sys.stderr)
        status = 1
    if loaders_running():
        # Stopped while a model was loading: the loader thread cannot be interrupted, and
        # the interpreter's exit would wait for (or crash in) it. Leave now.
        import logging

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def download(settings: Settings) -> int:
    """Fetch every hub model of the configuration into the Hugging Face cache, and make the
    exports of models served with engine = "onnx" or "openvino", so replicas start without
    either."""
    from huggingface_hub import snapshot_download

    from openai_compat.engine import fidelity

    failed = 0
    for model in settings.served_models():
        source = model.source
        try:
            if Path(source).exists():
                print(f"{model.served_name}: local folder {source}, nothing to download")
            else:
                path = snapshot_download(source, revision=model.revision)
                # the snapshot's folder is the commit fetched: the revision to pin
                commit = Path(path).name
                pin = "" if model.revision == commit else f' (pin it: revision = "{commit}")'
                print(f"{model.served_name}: {source} -> {path}")
                print(f"{model.served_name}: revision {commit}{pin}")
            if runs_natively(model.engine) and model.backend != "torch":
                folder = _native_export(model, settings)
                print(f"{model.served_name}: {model.backend} export -> {folder}")
                print(f"{model.served_name}: {fidelity.describe(fidelity.read(folder))}")
        except Exception as exc:  # offline, unknown repo, no space...: one line, not a trace
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            print(
                f"openai-compat download: {model.served_name} ({source}): "
                f"{type(exc).__name__}: {reason}",
                file=sys.stderr,
            )
            failed += 1
    return 1 if failed else 0


def _native_export(model: Any, settings: Settings) -> Path:
    """Load a native model served on an export: made (and measured) if not cached yet."""
    from openai_compat.engine import native
    from openai_compat.ground import cpus

    engine = native.load(model, cpus.engine_threads(), settings.exports())
    folder = engine.runner.exported
    if folder is None:  # load() runs every backend but torch on an export
        raise RuntimeError(f"model {model.served_name!r} was not served on an export")
    return folder


def demo_models(folder: Path) -> int:
    from openai_compat.models import demo as demo_models

    print(
        f"making the demo models in {folder}: two fine-tunings of the packaged MiniLM, "
        "about 30 s on 2 idle CPU cores, minutes beside other work (a progress bar each)...",
        file=sys.stderr,
    )
    from openai_compat.models.demo_vision import NOTICE

    print(
        f"...and the {NOTICE}; and a tiny BGE-M3 (its three outputs), RANDOM weights too.",
        file=sys.stderr,
    )
    config = demo_models.build(folder)
    print(f"done: openai-compat serve --config {config}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    command = args.command
    if command == "demo-models":
        sys.exit(demo_models(Path(args.dir)))
    job_keys = (
        *("input", "output", "endpoint", "force"),
        *("ray", "ray_actors", "ray_cpus_per_actor", "ray_gpus_per_actor"),
        "ray_proxy_location",
    )
    job = {k: vars(args).pop(k, None) for k in job_keys}
    values = {k: v for k, v in vars(args).items() if k != "command"}
    for name, value in list(values.items()):
        if isinstance(value, list):
            values[name] = tuple(value)
    try:
        settings = build_settings(values)
        settings.served_models()
    except ConfigError as exc:
        print(f"openai-compat: configuration error: {exc}", file=sys.stderr)
        sys.exit(2)
    # infinity-emb reports anonymous usage unless told not to; we only report if the user
    # explicitly turned it on.
    os.environ.setdefault("INFINITY_ANONYMOUS_USAGE_STATS", "0")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    if command == "batch":
        from openai_compat.batch import cli as batch_cli

        logs.configure("warning", settings.log_format)  # the progress bar, not access lines
        if job["ray"] is not None:
            from openai_compat.batch import ray_job

            sys.exit(
                ray_job.run(
                    settings,
                    job["input"],
                    job["output"],
                    job["endpoint"],
                    job["ray"] or None,
                    job["ray_actors"],
                    job["ray_cpus_per_actor"],
                    job["ray_gpus_per_actor"],
                )
            )
        sys.exit(
            batch_cli.run(
                settings, Path(job["input"]), Path(job["output"]), job["endpoint"], job["force"]
            )
        )
    if command == "serve" and job["ray"] is not None:
        from openai_compat.ray_serve import launch

        logs.configure(settings.log_level, settings.log_format)
        sys.exit(launch.deploy(settings, job["ray"] or None, job["ray_proxy_location"]))
    sys.exit(download(settings) if command == "download" else serve(settings))
