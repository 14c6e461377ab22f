"""Probes: liveness (/health), readiness (/ready) and Prometheus metrics (/metrics)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_compat.api.protocol import ERROR_RESPONSES, HealthResponse, ReadyResponse
from openai_compat.formats.encoding import orjson_response
from openai_compat.ground.errors import ServiceUnavailable, api_error_response
from openai_compat.ground.lifecycle import Lifecycle
from openai_compat.models.metrics import CONTENT_TYPE, Metrics
from openai_compat.models.registry import Registry

router = APIRouter(tags=["health"])


@router.get("/health", response_model=HealthResponse, responses={503: ERROR_RESPONSES[503]})
async def health(request: Request) -> Response:
    """200 while the process and its engines live (also while loading); 503 if one has died.
    The body is infinity-emb's (`{"unix": <seconds>}`, what its clients read); TEI's and
    vLLM's clients read only the status. Whether the models are loaded: GET /ready."""
    lifecycle: Lifecycle = request.app.state.lifecycle
    registry: Registry = request.app.state.registry
    if lifecycle.phase == "failed":
        # the reason names paths and library internals: it is in the log, not in an answer
        # to an unauthenticated probe
        message = lifecycle.unavailable_message() + " The reason is in the server's log."
        return api_error_response(ServiceUnavailable(message))
    dead = registry.dead()
    if dead and lifecycle.phase == "ready":
        return api_error_response(
            ServiceUnavailable(f"engine(s) stopped: {', '.join(dead)}", code="engine_dead")
        )
    return orjson_response({"unix": time.time()})


@router.get("/ready", response_model=ReadyResponse, responses={503: ERROR_RESPONSES[503]})
async def ready(request: Request) -> Response:
    """200 with the served models once all are loaded; 503 while loading and once draining."""
    lifecycle: Lifecycle = request.app.state.lifecycle
    registry: Registry = request.app.state.registry
    if lifecycle.phase != "ready":
        return api_error_response(
            ServiceUnavailable(lifecycle.unavailable_message(), code=lifecycle.phase)
        )
    runner = request.app.state.batches.runner_status()
    # an open probe: with keys configured it names no models (a key's list is GET /v1/models)
    names = [] if request.app.state.tenants.enabled else registry.served_names()
    body = {"status": "ready", "models": names, "batch_runner": runner}
    if lifecycle.cpus is not None:
        body["cpus"] = lifecycle.cpus  # the CPUs we may use and the pools sized to them
    return orjson_response(body)


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Requests, latency, inputs, tokens, queued and in-flight work per model, load times."""
    m: Metrics = request.app.state.metrics
    return Response(m.render(), media_type=CONTENT_TYPE)
