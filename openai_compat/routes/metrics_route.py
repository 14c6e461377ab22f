"""GET /metrics: Prometheus text format."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_compat.metrics import CONTENT_TYPE, Metrics

router = APIRouter(tags=["health"])


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Requests, latency, inputs, tokens, queued and in-flight work per model, load times."""
    m: Metrics = request.app.state.metrics
    return Response(m.render(), media_type=CONTENT_TYPE)
