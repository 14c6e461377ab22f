"""`openai-compat serve --ray [ADDRESS]`, and the application builder for Ray's own CLI and
KubeRay (`serve run` / `serve deploy` / a RayService's serveConfigV2):

    serve run openai_compat.ray_serve.launch:build config=configs/ray.toml

Deploying again with a changed configuration updates the running application in place:
Ray Serve starts the new replicas, sends new requests to them once they are healthy, and
lets the old ones finish what they hold (graceful_shutdown_timeout_s = --graceful-timeout)
before stopping them.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from openai_compat.frame.config import build_settings
from openai_compat.frame.settings import Settings

APP_NAME = "openai-compat"


def build(args: dict[str, Any]) -> Any:
    """Ray Serve's application builder: `args` are our settings by name (`config` for the
    TOML file), as `serve run ... config=FILE port=8000` or serveConfigV2's `args:` give
    them; the environment's OPENAI_COMPAT_* variables apply too."""
    from openai_compat.ray_serve.deployments import application

    return application(build_settings({k.replace("-", "_"): v for k, v in args.items()}))


def deploy(settings: Settings, address: str | None, proxy_location: str) -> int:
    """Deploy (or update) the application on the cluster at `address` and return once it
    runs; the cluster keeps serving it (`serve delete openai-compat` removes it)."""
    import ray
    from ray import serve

    from openai_compat.ray_serve.deployments import application

    ray.init(
        address=address or os.environ.get("RAY_ADDRESS") or None,
        include_dashboard=False,
        log_to_driver=False,
        namespace="serve",
    )
    try:
        serve.start(
            http_options={
                "host": settings.host,
                "port": settings.port,
                "location": proxy_location,
            }
        )
        started = time.monotonic()
        try:
            serve.run(application(settings), name=APP_NAME, route_prefix="/", blocking=False)
        except RuntimeError as exc:  # Serve gave up on a deployment: say which and why
            print(f"openai-compat: {exc}", file=sys.stderr)
        status = _wait_running(serve, settings)
        if status != "RUNNING":
            print(f"openai-compat: the application is {status} on Ray", file=sys.stderr)
            return 1
        print(
            f"openai-compat is running on Ray Serve at http://{settings.host}:{settings.port} "
            f"({time.monotonic() - started:.0f}s); `serve status` shows its deployments, "
            f"`serve delete {APP_NAME}` removes it"
        )
        return 0
    finally:
        ray.shutdown()


def _wait_running(serve: Any, settings: Settings, limit: float = 1800.0) -> str:
    """Until the application runs or fails (a model that cannot load fails its replicas'
    constructors: Ray reports DEPLOY_FAILED with their error)."""
    deadline = time.monotonic() + limit
    said: set[str] = set()
    while True:
        app = serve.status().applications.get(APP_NAME)
        state = str(getattr(app, "status", "NOT_STARTED")).rsplit(".", 1)[-1]
        for name, dep in (app.deployments if app is not None else {}).items():
            # e.g. a replica that cannot be placed: "... taken more than 30s to be scheduled
            # ... Resources required for each replica: ..., total resources available: ..."
            if dep.message and dep.message not in said and state == "DEPLOYING":
                said.add(dep.message)
                print(f"openai-compat: waiting for {name}: {dep.message}", file=sys.stderr)
        if state in ("RUNNING", "DEPLOY_FAILED", "UNHEALTHY") or time.monotonic() > deadline:
            if state != "RUNNING" and app is not None:
                print(f"openai-compat: {app.message}", file=sys.stderr)
                for name, dep in app.deployments.items():
                    if dep.message:
                        print(f"  {name}: {dep.message}", file=sys.stderr)
            return state
        time.sleep(1.0)
