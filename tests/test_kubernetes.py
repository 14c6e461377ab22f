"""The Kubernetes manifests (deploy/kubernetes/) against Kubernetes' own schemas, offline: every
object through kubernetes-validate (the API's JSON schemas, shipped in that package, strict:
unknown fields are errors); KubeRay's RayService against the fields of its v1 CRD with its pod
templates against Kubernetes' PodTemplateSpec; and what the manifests say of the server (ports,
probe paths, user, metric) against what the image serves."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "deploy" / "kubernetes"
# The oldest Kubernetes release still supported upstream when these were written (2026-12).
K8S_VERSION = "1.34.0"


def _objects(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def _dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def test_every_object_is_valid_for_kubernetes() -> None:
    kinds = []
    for obj in _objects("openai-compat.yaml"):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        kinds.append(obj["kind"])
    assert kinds == [
        *("Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"),
        *("PersistentVolumeClaim", "Deployment", "Service", "Ingress"),
    ]


def test_the_validator_refuses_a_misspelt_field() -> None:
    (deployment, *_) = _objects("openai-compat.yaml")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_the_deployment_matches_the_image() -> None:
    deployment, service, budget, autoscaler, *_ = _objects("openai-compat.yaml")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    dockerfile = _dockerfile()
    port = int(re.search(r"OPENAI_COMPAT_PORT=(\d+)", dockerfile).group(1))  # type: ignore[union-attr]
    assert f"EXPOSE {port}" in dockerfile
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["OPENAI_COMPAT_HOST"] == "0.0.0.0" and env["OPENAI_COMPAT_PORT"] == str(port)
    # Prometheus scrapes the metrics port (no key needed, also with a keys file), which the
    # Service does not expose
    metrics_port = int(env["OPENAI_COMPAT_METRICS_PORT"])
    assert ports == {"http": port, "metrics": metrics_port}
    for pods in (deployment, _objects("openai-compat.yaml")[5]):
        notes = pods["spec"]["template"]["metadata"]["annotations"]
        assert notes["prometheus.io/port"] == str(metrics_port)
        assert notes["prometheus.io/path"] == "/metrics"
        (each,) = pods["spec"]["template"]["spec"]["containers"]
        assert {e["name"]: e.get("value") for e in each["env"]}[
            "OPENAI_COMPAT_METRICS_PORT"
        ] == str(metrics_port)
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    # probes: /health for liveness and start-up (200 while models load), /ready for readiness
    assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["startupProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    # the image's user, and a root file system it never writes (state in /data and /tmp)
    uid = int(re.search(r"useradd .*--uid (\d+)", dockerfile).group(1))  # type: ignore[union-attr]
    assert pod["securityContext"]["runAsUser"] == uid and pod["securityContext"]["runAsNonRoot"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    # HF_HOME (hub downloads, exports) is written: a volume, or "Read-only file system"
    assert {"/tmp", "/models"} <= mounts and "HF_HOME=/models" in dockerfile
    # the drain fits the grace period: --graceful-timeout (30 s) plus the shutdown margin
    from openai_compat.frame.settings import Settings
    from openai_compat.web.server import SHUTDOWN_MARGIN

    drain = Settings().graceful_timeout + SHUTDOWN_MARGIN
    assert pod["terminationGracePeriodSeconds"] > drain
    # the Service, the budget and the autoscaler point at this Deployment
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"] == labels
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert budget["spec"]["selector"]["matchLabels"] == labels
    assert autoscaler["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]


def test_the_batch_api_lives_on_one_pod_with_a_persistent_volume() -> None:
    """With replicas: 2 each pod had its own /data, so an upload, its batch and its polls
    landed on different pods. The replicas serve no Files/Batch API; one batch pod (one
    replica, Recreate) owns a PersistentVolumeClaim at /data; the Ingress sends those paths
    there and the rest to the replicas."""
    api, service, _, _, claim, batch, batch_service, ingress = _objects("openai-compat.yaml")
    (api_container,) = api["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in api_container["env"]}
    from openai_compat.frame.config import env_name

    assert env[env_name("batch_api")] == "0"
    assert api["spec"]["replicas"] > 1 and batch["spec"]["replicas"] == 1
    assert batch["spec"]["strategy"] == {"type": "Recreate"}
    pod = batch["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (container,) = pod["containers"]
    data = next(m for m in container["volumeMounts"] if m["mountPath"] == "/data")
    claimed = volumes[data["name"]]["persistentVolumeClaim"]["claimName"]
    assert claimed == claim["metadata"]["name"] and "OPENAI_COMPAT_DATA_DIR=/data" in _dockerfile()
    assert batch_service["spec"]["selector"] == batch["spec"]["template"]["metadata"]["labels"]
    routes = {
        p["path"]: p["backend"]["service"]["name"]
        for rule in ingress["spec"]["rules"]
        for p in rule["http"]["paths"]
    }
    from openai_compat.web.middleware import BATCH_PREFIXES

    assert {routes[prefix] for prefix in BATCH_PREFIXES} == {batch_service["metadata"]["name"]}
    assert routes["/"] == service["metadata"]["name"]


def test_the_autoscaler_scales_on_a_metric_the_server_exports() -> None:
    *_, autoscaler, _, _, _, _ = _objects("openai-compat.yaml")
    (metric,) = autoscaler["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    # the collector's families (tests/test_e2e_reliability.py reads this one off /metrics)
    assert f'"{name}"' in (ROOT / "openai_compat" / "models" / "metrics.py").read_text()


# KubeRay's RayService (ray.io/v1), the fields this manifest uses, as its CRD defines them:
# ray-operator/config/crd/bases/ray.io_rayservices.yaml in github.com/ray-project/kuberay
# (spec.serveConfigV2 a string; rayClusterConfig: rayVersion, enableInTreeAutoscaling,
# headGroupSpec {rayStartParams: string map, template: PodTemplateSpec, required template},
# workerGroupSpecs [{groupName, replicas, minReplicas, maxReplicas, rayStartParams, template},
# required groupName and template]). Unknown fields are refused, as the API server prunes them.
_GROUP = {"rayStartParams": dict, "template": dict}
_SCHEMA: dict[str, dict[str, Any]] = {
    "spec": {"serveConfigV2": str, "rayClusterConfig": dict},
    "rayClusterConfig": {
        "rayVersion": str,
        "enableInTreeAutoscaling": bool,
        "headGroupSpec": dict,
        "workerGroupSpecs": list,
    },
    "headGroupSpec": {**_GROUP, "serviceType": str, "enableIngress": bool},
    "workerGroup": {
        **_GROUP,
        "groupName": str,
        "replicas": int,
        "minReplicas": int,
        "maxReplicas": int,
        "numOfHosts": int,
        "suspend": bool,
    },
}
_REQUIRED = {"headGroupSpec": {"template"}, "workerGroup": {"groupName", "template"}}


def _check(kind: str, value: dict[str, Any]) -> None:
    fields = _SCHEMA[kind]
    for key, item in value.items():
        assert key in fields, f"{kind}: unknown field {key!r}"
        assert isinstance(item, fields[key]), f"{kind}.{key}: {type(item).__name__}"
    missing = _REQUIRED.get(kind, set()) - set(value)
    assert not missing, f"{kind}: missing {missing}"


def _pod_template(template: dict[str, Any]) -> None:
    spec = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "t"},
        "template": template,
    }
    kubernetes_validate.validate(spec, K8S_VERSION, strict=True)


def test_the_rayservice_follows_kuberays_crd_and_serves_our_application() -> None:
    (service,) = _objects("rayservice.yaml")
    assert (service["apiVersion"], service["kind"]) == ("ray.io/v1", "RayService")
    _check("spec", service["spec"])
    cluster = service["spec"]["rayClusterConfig"]
    _check("rayClusterConfig", cluster)
    _check("headGroupSpec", cluster["headGroupSpec"])
    _pod_template(cluster["headGroupSpec"]["template"])
    for group in cluster["workerGroupSpecs"]:
        _check("workerGroup", group)
        _pod_template(group["template"])
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        assert all(isinstance(v, str) for v in group["rayStartParams"].values())
    # the application it deploys is ours, on the Ray we pin, with a config the image carries
    (app,) = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    module, _, attribute = app["import_path"].partition(":")
    source = ROOT / (module.replace(".", "/") + ".py")
    assert re.search(rf"^def {attribute}\(", source.read_text(), re.M), app["import_path"]
    config = Path(app["args"]["config"])
    assert "WORKDIR /app" in _dockerfile() and config.parts[:2] == ("/", "app")
    assert (ROOT / config.relative_to("/app")).is_file(), config
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f"ray[data,serve]=={cluster['rayVersion']}" in pyproject
