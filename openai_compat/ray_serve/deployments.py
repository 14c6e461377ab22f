"""The Ray Serve deployments: `ModelServer` (one model's engine and its wave batching, one
deployment per configured model) and `Ingress` (our whole FastAPI app, calling the models
through DeploymentHandles; ray_serve/remote.py)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterator
from typing import Any

from openai_compat.engine import priority
from openai_compat.frame.settings import RayOptions, Settings
from openai_compat.ground import cpus
from openai_compat.models import memory
from openai_compat.models.loading import ModelLoader, stop_engines
from openai_compat.models.metrics import Metrics
from openai_compat.models.registry import ModelEntry, Registry
from openai_compat.ray_serve.batch import BatchServer, with_batch_api
from openai_compat.ray_serve.metrics import RayMetricsExport
from openai_compat.ray_serve.remote import ENTRY_FIELDS, pack, remote_app, worker_start

logger = logging.getLogger("openai_compat")


class ModelServer:
    """One model, loaded as the single-process server loads it (engine, warm-up, int8
    calibration, wave batching); each method is one engine call from an ingress."""

    async def __init__(self, settings: Settings, name: str) -> None:  # type: ignore[misc]
        (config,) = [c for c in settings.served_models() if c.served_name == name]
        await worker_start(settings)
        threads = cpus.engine_threads()  # Ray sets OMP_NUM_THREADS to the replica's num_cpus
        cpus.apply_to_torch(threads)
        memory.freeze_imports()
        self.registry = Registry([config])
        self.entry: ModelEntry = await ModelLoader(
            self.registry, settings.exports(), settings.max_multivector_values
        )(config)
        self.registry.add(self.entry)
        # This replica's own metrics (engine queue, inputs, in flight, load time), exported
        # through Ray's metrics agent with its deployment and replica tags (ray_serve/metrics.py)
        self.metrics = Metrics(self.registry)
        self.export = RayMetricsExport.running(self.metrics.registry)
        logger.info("replica of %r ready (%d threads)", name, threads)

    @contextlib.contextmanager
    def _serving(self, method: str, inputs: int, background: bool) -> Iterator[None]:
        """A call's inputs count as queued and in flight while it runs (never refused: the
        ingress admits), and as served by `method` once answered. A Batch API line's
        (`background`) waits for live calls, as on one machine."""
        with contextlib.ExitStack() as stack:
            if background:
                stack.enter_context(priority.background())
            stack.enter_context(self.entry.admit(inputs, 0))
            yield
        self.metrics.inputs.labels(self.entry.name, method).inc(inputs)

    def describe(self) -> dict[str, Any]:
        entry = self.entry
        engine = entry.engine
        tokenizer = engine.tokenizer()
        return {
            "config": entry.config,
            "capabilities": sorted(entry.capabilities),
            "native": sorted(entry.engine.capabilities),
            "tokenizer": tokenizer.to_str() if entry.counter and tokenizer else None,
            "logits": entry.logits is not None,
            "id2label": engine.labels(),
            "pooling_mode": engine.pooling_mode(),
            **{field: getattr(entry, field) for field in ENTRY_FIELDS},
        }

    async def embed(
        self,
        texts: list[str],
        task: str | None = None,
        background: bool = False,
        prompt: str | None = None,
        outputs: list[str] | None = None,
    ) -> tuple[dict[str, Any], int]:
        with self._serving("embed", len(texts), background):
            asked = frozenset(outputs) if outputs else None
            vectors, usage = await self.entry.embed(texts, task, prompt, asked)
        return pack(vectors), usage

    async def image_embed(
        self, images: list[Any], background: bool = False, prompt: str | None = None
    ) -> tuple[dict[str, Any], int]:
        with self._serving("image_embed", len(images), background):
            options = {"prompt": prompt} if prompt else {}
            vectors, usage = await self.entry.engine.image_embed(images=images, **options)
        return pack(vectors), usage

    async def audio_embed(
        self, audios: list[Any], background: bool = False
    ) -> tuple[dict[str, Any], int]:
        with self._serving("audio_embed", len(audios), background):
            vectors, usage = await self.entry.engine.audio_embed(audios=audios)
        return pack(vectors), usage

    async def rerank(
        self, query: str, docs: list[str], background: bool = False
    ) -> tuple[list[tuple[int, float]], int]:
        with self._serving("rerank", len(docs), background):
            results, usage = await self.entry.engine.rerank(query=query, docs=docs)
        return [(int(r.index), float(r.relevance_score)) for r in results], usage

    async def classify(
        self, sentences: list[Any], background: bool = False
    ) -> tuple[list[Any], int]:
        with self._serving("classify", len(sentences), background):
            result: tuple[list[Any], int] = await self.entry.engine.classify(sentences=sentences)
        return result

    async def logits(
        self, texts: list[Any], background: bool = False
    ) -> list[list[dict[str, Any]]]:
        assert self.entry.logits is not None
        with self._serving("logits", len(texts), background):
            return await self.entry.logits.logits(texts)

    async def token_vectors(self, texts: list[str], background: bool = False) -> list[Any]:
        with self._serving("token_vectors", len(texts), background):
            if self.entry.late is None:  # closed with the entry's engine (models/loading.py)
                self.entry.late = self.entry.engine.late_runner()
            return await self.entry.late.token_vectors(texts)

    def check_health(self) -> None:
        """Ray's health check: a replica whose engine died is replaced."""
        if not self.entry.alive():
            raise RuntimeError(f"the engine of {self.entry.name!r} stopped")

    async def __del__(self) -> None:
        await self.export.stop()
        await stop_engines(self.registry)


class Ingress:
    """Our whole app on a registry of remote entries, one per model deployment; its Files
    and Batch API requests go to the BatchServer (ray_serve/batch.py)."""

    async def __init__(  # type: ignore[misc]
        self, settings: Settings, names: list[str], batch: Any, *handles: Any
    ) -> None:
        app, self.export = await remote_app(settings, names, handles, batch_runner=False)
        self.asgi = with_batch_api(app, batch)

    def __serve_build_asgi_app__(self) -> Any:
        return self.asgi

    async def __del__(self) -> None:
        await self.export.stop()


def _scaling(options: RayOptions) -> dict[str, Any]:
    extra: dict[str, Any] = (
        {"autoscaling_config": options.autoscaling_config}
        if options.autoscaling_config
        else {"num_replicas": options.num_replicas}
    )
    if options.max_replicas_per_node is not None:
        extra["max_replicas_per_node"] = options.max_replicas_per_node
    return extra


def model_deployment(settings: Settings, name: str) -> Any:
    """The bound ModelServer deployment of one configured model, with its [models.ray]."""
    (config,) = [c for c in settings.served_models() if c.served_name == name]
    options = config.ray
    extra = _scaling(options)
    return (
        _deployment(ModelServer)
        .options(
            name=deployment_name(name),
            ray_actor_options=options.ray_actor_options,
            max_ongoing_requests=options.max_ongoing_requests or 64,
            graceful_shutdown_timeout_s=settings.graceful_timeout,
            health_check_period_s=5,
            **extra,
        )
        .bind(settings, name)
    )


def _deployment(cls: type) -> Any:
    from ray import serve  # the `ray` extra: imported only where Ray Serve runs

    made: Any = serve.deployment(cls)
    return made


def deployment_name(model: str) -> str:
    """Ray's name for a model's deployment: the served name where every character is one Ray
    takes as is; else the name made safe plus a hash of the original, so distinct served
    names ("a/b", "a_b") never share one deployment."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model)
    if safe == model:
        return "model-" + safe
    return f"model-{safe}-{hashlib.sha256(model.encode()).hexdigest()[:8]}"


def application(settings: Settings) -> Any:
    """The Ray Serve application: the ingress, one deployment per configured model, and the
    batch server (the Files and Batch APIs, one replica where the data dir is)."""
    names = [c.served_name for c in settings.served_models()]
    models = [model_deployment(settings, name) for name in names]
    from ray import serve

    batch_options = settings.ray_batch
    batch = (
        _deployment(BatchServer)
        .options(
            name="batch",
            num_replicas=1,
            ray_actor_options=batch_options.ray_actor_options,
            max_ongoing_requests=batch_options.max_ongoing_requests or 1024,
            graceful_shutdown_timeout_s=settings.graceful_timeout,
        )
        .bind(settings, names, *models)
    )
    options = settings.ray_ingress
    ingress = _deployment(serve.ingress()(Ingress))
    return ingress.options(
        name="ingress",
        ray_actor_options=options.ray_actor_options,
        max_ongoing_requests=options.max_ongoing_requests or 512,
        graceful_shutdown_timeout_s=settings.graceful_timeout,
        **_scaling(options),
    ).bind(settings, names, batch, *models)
