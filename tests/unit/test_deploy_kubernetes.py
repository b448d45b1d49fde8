"""deploy/kubernetes/ checked offline (issue 63, item 2): no cluster, no kubectl, no Helm here.

* every manifest against the Kubernetes API's own schema at a pinned version,
  ``kubernetes-validate --strict``, failing on any warning;
* the RabbitmqCluster against the operator's CRD (tests/vendor/rabbitmq-cluster-operator/),
  unknown fields included, and its broker configuration against deploy/rabbitmq/ (drift);
* every ORCH_* variable a known setting, and every value one the settings classes take;
* every command a module that exists, every probe a path and a port the process serves.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from manager.api.health import router as manager_probes
from manager.api.metrics import router as manager_metrics
from manager.settings import ManagerSettings
from observer_service.health import PATHS as SERVICE_PATHS
from observer_service.settings import ServiceSettings
from shared.settings import CommonSettings

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = REPO / "deploy" / "kubernetes"
RABBITMQ = REPO / "deploy" / "rabbitmq"
CRD = REPO / "tests" / "vendor" / "rabbitmq-cluster-operator" / "rabbitmq.com_rabbitmqclusters.yaml"
KUBERNETES_VERSION = "1.34.0"
# What a Secret or the pod gives at run time, for the settings check.
_FROM_SECRETS = {
    "ORCH_AMQP_URLS": "amqps://orch:pw@rabbitmq-0:5671/,amqps://orch:pw@rabbitmq-1:5671/",
    "ORCH_DATABASE_URL": "postgresql+asyncpg://orch:pw@postgres:5432/orch",
    "ORCH_API_TOKENS": "a-long-random-token",
    "ORCH_MANAGER_NAME": "orchestrator-manager-5d9f-abcde",
    "ORCH_SERVICE_NAME": "orchestrator-observer-7c4b-fghij",
}


def manifests() -> dict[str, list[dict[str, Any]]]:
    return {path.name: list(yaml.safe_load_all(path.read_text())) for path in sorted(KUBERNETES.glob("*.yaml"))}


def workloads() -> list[tuple[str, dict[str, Any]]]:
    """(kind/name, pod spec) of every Deployment and Job."""
    found = []
    for documents in manifests().values():
        for doc in documents:
            if doc["kind"] in ("Deployment", "Job"):
                found.append((f"{doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]["spec"]))
    return found


def test_the_kustomization_lists_every_manifest_but_the_example_secret() -> None:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    present = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml", "secret.example.yaml"}
    assert listed == present


def test_every_manifest_is_valid_at_the_pinned_kubernetes_version() -> None:
    # The RabbitmqCluster is no built-in kind: checked against its CRD below.
    names = [p.name for p in sorted(KUBERNETES.glob("*.yaml"))]
    names = [n for n in names if n not in ("kustomization.yaml", "rabbitmq-cluster.yaml")]
    files = [str(KUBERNETES / n) for n in names]
    done = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", KUBERNETES_VERSION, *files],
        capture_output=True,
        text=True,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0 and "WARN" not in said and "ERROR" not in said, said
    assert said.count(" passed ") == sum(len(manifests()[n]) for n in names)


def _unknown_fields(value: Any, schema: dict[str, Any], where: str) -> list[str]:
    """Fields of ``value`` that ``schema`` does not name (CRD schemas allow them, then prune)."""
    found = []
    if isinstance(value, dict) and "properties" in schema:
        for key, item in value.items():
            if key not in schema["properties"]:
                if not schema.get("x-kubernetes-preserve-unknown-fields"):
                    found.append(f"{where}.{key}")
                continue
            found += _unknown_fields(item, schema["properties"][key], f"{where}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found += _unknown_fields(item, schema["items"], f"{where}[{i}]")
    return found


def test_the_rabbitmq_cluster_fits_the_operators_crd_and_pins_its_image() -> None:
    (cluster,) = manifests()["rabbitmq-cluster.yaml"]
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == cluster["apiVersion"].split("/")[1]]
    schema = version["schema"]["openAPIV3Schema"]
    jsonschema.validate(cluster, schema)
    assert _unknown_fields(cluster["spec"], schema["properties"]["spec"], "spec") == []
    assert cluster["spec"]["replicas"] == 3
    image = cluster["spec"]["image"]
    assert image.startswith("rabbitmq:4.3.") and image.count(".") == 2, image  # a patch release, pinned
    assert cluster["spec"]["tls"]["secretName"] and cluster["spec"]["tls"]["caSecretName"]


def test_the_rabbitmq_cluster_configuration_is_deploy_rabbitmqs_word_for_word() -> None:
    (cluster,) = manifests()["rabbitmq-cluster.yaml"]
    config = cluster["spec"]["rabbitmq"]
    parts = ("orchestrator.conf", "deny-deprecated.conf", "cluster.conf")
    assert config["additionalConfig"] == "\n".join((RABBITMQ / p).read_text() for p in parts)
    assert config["advancedConfig"] == (RABBITMQ / "advanced.config").read_text()


def _settings_of(container: dict[str, Any]) -> type[CommonSettings]:
    command = container["command"]
    if command[-1] == "observer_service":
        return ServiceSettings
    return ManagerSettings  # the manager, and alembic (migrations/env.py reads ManagerSettings)


@pytest.mark.parametrize(("workload", "pod"), workloads(), ids=[w for w, _ in workloads()])
def test_every_setting_is_known_and_takes_its_value(workload: str, pod: dict[str, Any], tmp_path: Path) -> None:
    readable = tmp_path / "mounted.pem"
    readable.write_text("a file the secret volume provides")
    for container in pod["containers"]:
        settings = _settings_of(container)
        fields = {f"ORCH_{name.upper()}" for name in settings.model_fields}
        mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
        env = {}
        for var in container.get("env", []):
            name = var["name"]
            assert name in fields, f"{workload}: {name} is no setting of {settings.__name__}"
            if "value" in var:
                value = var["value"]
                if name.endswith("_FILE"):  # a file of a mounted Secret; read at start
                    assert any(value.startswith(m.rstrip("/") + "/") for m in mounts), f"{workload}: {name}={value}"
                    value = str(readable)
            else:
                value = _FROM_SECRETS[name]
            env[name] = value
        with pytest.MonkeyPatch.context() as patch:
            for name in [n for n in os.environ if n.startswith("ORCH_")]:
                patch.delenv(name)
            for name, value in env.items():
                patch.setenv(name, value)
            settings()  # raises on any value it does not take


@pytest.mark.parametrize(("workload", "pod"), workloads(), ids=[w for w, _ in workloads()])
def test_every_command_runs_a_module_and_every_probe_asks_what_the_process_serves(
    workload: str, pod: dict[str, Any]
) -> None:
    routes = [*manager_probes.routes, *manager_metrics.routes]
    manager_paths = {route.path for route in routes}  # type: ignore[attr-defined]
    for container in pod["containers"]:
        command = container["command"]
        assert command[:2] == ["python", "-m"] and importlib.util.find_spec(command[2]) is not None, command
        env = {var["name"]: var.get("value") for var in container.get("env", [])}
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        if command[2] == "manager":
            assert ports["http"] == int(env["ORCH_MANAGER_PORT"]) and env["ORCH_MANAGER_HOST"] == "0.0.0.0"
            served = manager_paths
        elif command[2] == "observer_service":
            assert ports["metrics"] == int(env["ORCH_METRICS_PORT"]) and env["ORCH_METRICS_HOST"] == "0.0.0.0"
            served = set(SERVICE_PATHS)
        else:
            assert command[2] == "alembic" and (REPO / "alembic.ini").exists()
            continue
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = container.get(kind)
            if probe is None:
                continue
            assert probe["httpGet"]["path"] in served and probe["httpGet"]["port"] in ports, (workload, kind)
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        annotations = _pod_annotations(workload)
        assert int(annotations["prometheus.io/port"]) in ports.values() and annotations["prometheus.io/path"] in served


def _pod_annotations(workload: str) -> dict[str, str]:
    kind, name = workload.split("/")
    for documents in manifests().values():
        for doc in documents:
            if doc["kind"] == kind and doc["metadata"]["name"] == name:
                return dict(doc["spec"]["template"]["metadata"].get("annotations", {}))
    raise AssertionError(workload)


def test_rollouts_never_lose_capacity_and_a_drain_keeps_a_manager() -> None:
    deployments = {
        doc["metadata"]["name"]: doc for docs in manifests().values() for doc in docs if doc["kind"] == "Deployment"
    }
    for deployment in deployments.values():
        assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert deployments["orchestrator-manager"]["spec"]["replicas"] == 2
    (pdb,) = manifests()["manager-pdb.yaml"]
    assert pdb["spec"]["minAvailable"] == 1
    assert (
        pdb["spec"]["selector"]["matchLabels"] == deployments["orchestrator-manager"]["spec"]["selector"]["matchLabels"]
    )


def test_prometheus_finds_each_component_by_the_labels_and_annotations_the_manifests_set() -> None:
    config = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus-kubernetes.yml").read_text())
    alerts = (REPO / "deploy" / "prometheus" / "alerts.yml").read_text()
    components = {"orchestrator-manager": "manager", "orchestrator-service": "observer"}
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == set(components)
    for name, component in components.items():
        assert name in alerts
        (sd,) = jobs[name]["kubernetes_sd_configs"]
        assert sd["role"] == "pod"
        keep = {
            tuple(r["source_labels"]): r["regex"] for r in jobs[name]["relabel_configs"] if r.get("action") == "keep"
        }
        assert keep[("__meta_kubernetes_pod_label_app_kubernetes_io_component",)] == component
        assert keep[("__meta_kubernetes_pod_annotation_prometheus_io_scrape",)] == "true"
    for workload, _pod in workloads():
        if workload.startswith("Deployment/"):
            assert _pod_annotations(workload)["prometheus.io/scrape"] == "true"
