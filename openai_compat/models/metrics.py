"""Prometheus metrics, one registry per app (no process globals): requests by route, model and
status, latency, inputs and tokens, queued and in-flight work per model, load times; and, for
the HTTP server's own process, its resident memory, CPU time and garbage collections (the
standard process_* and python_gc_* series)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.routing import compile_path

if TYPE_CHECKING:
    from openai_compat.models.registry import Registry

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# (BatchStats key, metric name, help) of the native engine's forward thread.
_FORWARD = (
    (
        "forward_seconds",
        "forward_seconds",
        "Seconds the model's forward passes ran (native engine): its rate is the share of "
        "time the model is busy.",
    ),
    ("batches", "batches", "Forward passes run."),
    ("inputs", "batch_inputs", "Inputs the forward passes ran."),
    ("tokens", "batch_tokens", "Real tokens the forward passes ran."),
    (
        "padded_tokens",
        "batch_padded_tokens",
        "Tokens the forward passes ran, padding included (longest x inputs per batch).",
    ),
    (
        "dropped_inputs",
        "dropped_inputs",
        "Queued inputs dropped before their batch because their caller had gone.",
    ),
)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _ModelState(Collector):
    """Read at scrape time from the registry: queued inputs, in-flight requests, engine queue."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        queued = GaugeMetricFamily(
            "openai_compat_queued_inputs",
            "Inputs admitted to a model and not yet answered, live and Batch API lines "
            "(--max-queued-inputs bounds each).",
            labels=["model"],
        )
        inflight = GaugeMetricFamily(
            "openai_compat_model_requests_in_flight",
            "Requests being served by a model.",
            labels=["model"],
        )
        engine_queue = GaugeMetricFamily(
            "openai_compat_engine_queue_items",
            "Inputs waiting for the model: in infinity-emb's batching queue, or held for the "
            "next wave (not yet handed to the model).",
            labels=["model"],
        )
        loaded = GaugeMetricFamily(
            "openai_compat_model_load_seconds", "Seconds the model took to load.", labels=["model"]
        )
        hits = CounterMetricFamily(
            "openai_compat_cache_hits", "Inputs answered from the exact cache.", labels=["model"]
        )
        misses = CounterMetricFamily(
            "openai_compat_cache_misses", "Inputs the cache did not hold.", labels=["model"]
        )
        evictions = CounterMetricFamily(
            "openai_compat_cache_evictions", "Vectors dropped for room.", labels=["model"]
        )
        held = GaugeMetricFamily(
            "openai_compat_cache_bytes", "Bytes the cache holds for a model.", labels=["model"]
        )
        # the native engine's forward thread: its busy time, batches, inputs, padding
        forward = {
            key: CounterMetricFamily(f"openai_compat_{name}", help_, labels=["model"])
            for key, name, help_ in _FORWARD
        }
        cache = self.registry.cache
        sizes = cache.per_model_bytes() if cache is not None else {}
        for entry in self.registry.entries():
            done = entry.engine.batch_stats()
            for key, family in forward.items():
                if done is not None:
                    family.add_metric([entry.name], done[key])
            if cache is not None and entry.cache is not None:
                stats = cache.stats.get(entry.name)
                hits.add_metric([entry.name], stats.hits if stats else 0)
                misses.add_metric([entry.name], stats.misses if stats else 0)
                evictions.add_metric([entry.name], stats.evictions if stats else 0)
                held.add_metric([entry.name], sizes.get(entry.name, 0))
            queued.add_metric([entry.name], entry.pending)
            inflight.add_metric([entry.name], entry.inflight + entry.background_inflight)
            engine_queue.add_metric([entry.name], entry.engine_queue())
            loaded.add_metric([entry.name], entry.load_seconds)
        return [
            queued,
            inflight,
            engine_queue,
            loaded,
            hits,
            misses,
            evictions,
            held,
            *forward.values(),
            *self._residency(),
        ]

    def _residency(self) -> list[GaugeMetricFamily | CounterMetricFamily]:
        """Per configured model (models/pool.py): state, loads, unloads, load time, size."""
        pool = self.registry.pool
        if pool is None:
            return []
        state = GaugeMetricFamily(
            "openai_compat_model_state",
            "1 for the model's residency state (unloaded, loading, loaded, unloading, failed).",
            labels=["model", "state"],
        )
        loads = CounterMetricFamily(
            "openai_compat_model_loads", "Times the model was loaded.", labels=["model"]
        )
        unloads = CounterMetricFamily(
            "openai_compat_model_unloads", "Times the model was unloaded.", labels=["model"]
        )
        seconds = CounterMetricFamily(
            "openai_compat_model_load_seconds_total",
            "Seconds spent loading the model, all loads together.",
            labels=["model"],
        )
        resident = GaugeMetricFamily(
            "openai_compat_model_resident_bytes",
            "The loaded model's resident size, measured (process RSS after its load minus "
            "before); 0 while unloaded.",
            labels=["model"],
        )
        for name, slot in pool.slots.items():
            for each in ("unloaded", "loading", "loaded", "unloading", "failed"):
                state.add_metric([name, each], 1.0 if slot.state == each else 0.0)
            loads.add_metric([name], slot.loads)
            unloads.add_metric([name], slot.unloads)
            seconds.add_metric([name], slot.load_seconds_total)
            size = slot.resident_bytes or 0
            resident.add_metric([name], size if slot.state in ("loaded", "unloading") else 0)
        return [state, loads, unloads, seconds, resident]


class Metrics:
    def __init__(self, registry: Registry, process: bool = False) -> None:
        """process: also this process's memory, CPU and collections (the HTTP server's;
        a Ray replica's copy into Ray's metrics leaves them to Ray's own)."""
        # `*_created` timestamp series double the output for no use here.
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "openai_compat_requests",
            "HTTP requests by route, model and status (499: the client went away).",
            ["route", "model", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "openai_compat_request_duration_seconds",
            "Request latency by route.",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inputs = Counter(
            "openai_compat_inputs",
            "Inputs served, by model and route.",
            ["model", "route"],
            registry=r,
        )
        self.tokens = Counter(
            "openai_compat_tokens", "Tokens counted in usage, by model.", ["model"], registry=r
        )
        self.rejected = Counter(
            "openai_compat_rejected_requests",
            "Requests refused before any work: 429 overload, 401 auth, 413 size, 503 draining.",
            ["reason"],
            registry=r,
        )
        self.cancelled = Counter(
            "openai_compat_cancelled_requests",
            "Requests whose client disconnected; their queued work was dropped.",
            ["route"],
            registry=r,
        )
        # Per caller (tenants/): the keys file's names and "api-key" for --api-key keys.
        self.key_requests = Counter(
            "openai_compat_key_requests",
            "Requests by key name and status (429: its rate limits or a full queue).",
            ["key", "status"],
            registry=r,
        )
        self.key_inputs = Counter(
            "openai_compat_key_inputs", "Inputs served, by key name.", ["key"], registry=r
        )
        self.key_tokens = Counter(
            "openai_compat_key_tokens",
            "Tokens counted in usage, by key name.",
            ["key"],
            registry=r,
        )
        self.in_flight = Gauge(
            "openai_compat_requests_in_flight", "HTTP requests being served.", registry=r
        )
        r.register(_ModelState(registry))
        if process:
            ProcessCollector(registry=r)  # process_resident_memory_bytes, CPU seconds, fds
            GCCollector(registry=r)  # python_gc_collections_total by generation

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RouteLabels:
    """Bounded labels for metrics: each path's route template (`/v1/batches/{batch_id}`),
    matched as the router matches it; never a raw client path ("unmatched" if no route)."""

    def __init__(self, templates: Iterable[str]) -> None:
        templates = list(templates)
        self.exact = {t for t in templates if "{" not in t}
        # the most specific first, in a fixed order: a template whose parameter takes the
        # rest of the path (Gemini's /v1/models/{target:path}) after one-segment ones
        # (/v1/models/{model_id}), whichever order the set gave
        templated = sorted((t for t in templates if "{" in t), key=lambda t: (":path}" in t, t))
        # the label without converters: /admin/models/{name}/load, not {name:path}
        self.patterns = [
            (compile_path(t)[0], re.sub(r"\{(\w+):\w+\}", r"{\1}", t)) for t in templated
        ]

    def __call__(self, path: str) -> str:
        if path in self.exact:
            return path
        for pattern, template in self.patterns:
            if pattern.match(path):
                return template
        return "unmatched"
