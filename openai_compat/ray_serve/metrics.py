"""Every replica's Prometheus metrics, through Ray's metrics export.

On one machine, `/metrics` is the whole server. On Ray Serve, a scrape of `/metrics` through
the proxy reaches one ingress replica, and the model replicas (their engine queues, load times,
inputs) have no HTTP port at all. So each replica copies its own registry (metrics.py) into
Ray's metrics every few seconds; Ray's agent on each node serves them on the node's
`--metrics-export-port`, where Prometheus finds every node (Ray's service-discovery file, or
KubeRay's PodMonitor), each series tagged by Ray Serve with its `deployment`, `replica` and
`application`. Names gain Ray's `ray_` prefix; counters and histogram series arrive as gauges
holding the same cumulative values, so `rate()` and `histogram_quantile()` read them as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, cast

from prometheus_client import CollectorRegistry

logger = logging.getLogger("openai_compat")

# Ray reports to its agent every 10 s (metrics_report_interval_ms); copying more often than
# that only costs the replica time.
INTERVAL = 5.0


class RayMetricsExport:
    """Copies one prometheus_client registry into Ray Serve gauges (ray.serve.metrics)."""

    def __init__(self, registry: CollectorRegistry, interval: float = INTERVAL) -> None:
        self.registry, self.interval = registry, interval
        self.gauges: dict[str, Any] = {}
        self.task: asyncio.Task[None] | None = None

    def sync(self) -> int:
        """One copy of every sample; returns how many were set."""
        from ray.serve.metrics import Gauge  # the `ray` extra, where Ray Serve runs

        count = 0
        for family in self.registry.collect():
            for sample in family.samples:
                gauge = self.gauges.get(sample.name)
                if gauge is None:
                    gauge = Gauge(
                        sample.name,
                        description=family.documentation or sample.name,
                        tag_keys=cast(Any, tuple(sorted(sample.labels))),
                    )
                    self.gauges[sample.name] = gauge
                gauge.set(sample.value, tags=dict(sample.labels))
                count += 1
        return count

    @classmethod
    def running(cls, registry: CollectorRegistry) -> RayMetricsExport:
        """An export of `registry`, copying from now on (stop() ends it)."""
        export = cls(registry)
        export.task = asyncio.get_running_loop().create_task(export._run())
        return export

    async def _run(self) -> None:
        while True:
            try:
                self.sync()
            except Exception:  # never take the replica down over its metrics
                logger.exception("copying metrics to Ray failed")
            await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
