"""deploy/kubernetes as kustomize renders it: probes on /healthz and /readyz, a preStop pause
and a grace period that covers it and the drain, a Service, HPA and PDB that select the gateway
pods (and only them), the config as a ConfigMap that the real loader accepts with the Secret
the docs tell you to create, and the opt-in ServiceMonitor. (.ci/deploy-check validates the
rendered manifests against the Kubernetes schemas; this checks that they fit together.)"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # no stubs in the lint tools

from tests.deploy.files import DEPLOY, ROOT, load_config
from tests.deploy.test_dockerfile import parse as parse_dockerfile

KUBERNETES = DEPLOY / "kubernetes"

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None,
                                reason="kubectl (with kustomize) renders the manifests")


def render(directory: Path) -> list[dict[str, Any]]:
    done = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return render(KUBERNETES)


@pytest.fixture(scope="module")
def trial() -> list[dict[str, Any]]:
    return render(KUBERNETES / "overlays" / "trial")


@pytest.fixture(scope="module")
def monitored() -> list[dict[str, Any]]:
    # kustomize takes relative paths only, so the overlay that opts in lives in the repository
    (ROOT / "build").mkdir(exist_ok=True)
    where = Path(tempfile.mkdtemp(prefix="tests-deploy-", dir=ROOT / "build"))
    (where / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources: [../../deploy/kubernetes]\n"
        "components: [../../deploy/kubernetes/components/servicemonitor]\n")
    try:
        return render(where)
    finally:
        shutil.rmtree(where)


def one(docs: list[dict[str, Any]], kind: str, name: str = "tollhouse") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(name)
             and (kind == "ConfigMap" or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind}/{name}: {len(found)}"
    return found[0]


def gateway(docs: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any] = one(docs, "Deployment")["spec"]["template"]["spec"][
        "containers"][0]
    assert container["name"] == "gateway"
    return container


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def documented_secret(kustomization: Path) -> dict[str, str]:
    """The Secret the `kubectl create secret` line in a kustomization's comment makes, with a
    letters-and-digits value standing for each `$(openssl rand -hex 24)` or placeholder."""
    text = kustomization.read_text("utf-8")
    assert "kubectl create secret generic tollhouse" in text
    secret = {}
    for name, value in re.findall(r"--from-literal=([A-Z_]+)=(\S+)", text):
        if value.startswith("$("):
            value = f"{name.lower().replace('_', '')}0x"
        else:  # the base's URL placeholders, as a person fills them in
            value = (value.replace("USER", "tollhouse").replace("PASSWORD", "pw0")
                     .replace("HOST", "db.internal").replace("DB", "tollhouse"))
        secret[name] = value
    return secret


def container_env(container: dict[str, Any], secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """The environment the kubelet gives `container`: envFrom first, then env in order, each
    $(VAR) expanded from what is defined before it."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(secrets[source["secretRef"]["name"]])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                      lambda m: env.get(m.group(1), m.group(0)), var["value"])
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            if ref["key"] in secrets[ref["name"]]:
                env[var["name"]] = secrets[ref["name"]][ref["key"]]
            else:
                assert ref.get("optional"), f"{var['name']}: {ref['key']} is not in the Secret"
    return env


def config_of(docs: list[dict[str, Any]], env: dict[str, str]) -> Any:
    return load_config(one(docs, "ConfigMap", "tollhouse-config")["data"]["config.toml"], env)


def test_the_base_renders_what_a_cluster_without_crds_accepts(base: list[dict[str, Any]]) -> None:
    kinds = sorted(d["kind"] for d in base)
    assert kinds == ["ConfigMap", "Deployment", "HorizontalPodAutoscaler",
                     "PodDisruptionBudget", "Service"]
    assert all(d["apiVersion"] in ("v1", "apps/v1", "autoscaling/v2", "policy/v1") for d in base)


def test_probes_and_the_drain(base: list[dict[str, Any]]) -> None:
    container = gateway(base)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] in ports
    cfg = config_of(base, container_env(container, {"tollhouse": documented_secret(
        KUBERNETES / "base" / "kustomization.yaml")}))
    assert cfg.server.port == ports["http"]
    pause = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep" and 0 < int(pause[1]) <= 15
    spec = one(base, "Deployment")["spec"]["template"]["spec"]
    # the kubelet's clock runs from the preStop's start: pause, then the drain, then a flush
    assert spec["terminationGracePeriodSeconds"] >= int(pause[1]) + cfg.server.shutdown_grace_s + 10
    strategy = one(base, "Deployment")["spec"]["strategy"]["rollingUpdate"]
    assert strategy["maxUnavailable"] == 0


def test_the_config_loads_with_the_secret_the_docs_create(base: list[dict[str, Any]],
                                                          trial: list[dict[str, Any]]) -> None:
    container = gateway(base)
    assert container["envFrom"] == [{"secretRef": {"name": "tollhouse"}}]
    secret = documented_secret(KUBERNETES / "base" / "kustomization.yaml")
    cfg = config_of(base, container_env(container, {"tollhouse": secret}))
    assert cfg.database.url.startswith("postgresql://")
    assert cfg.state.url.startswith("redis://")
    assert cfg.server.listen == "0.0.0.0:8080" and cfg.auth.mode == "jwt"
    # the trial makes its URLs from the trial Secret's passwords, for its own two services
    trial_secret = documented_secret(KUBERNETES / "overlays" / "trial" / "kustomization.yaml")
    trial_cfg = config_of(trial, container_env(gateway(trial), {"tollhouse": trial_secret}))
    assert trial_cfg.database.url == (f"postgresql://tollhouse:{trial_secret['POSTGRES_PASSWORD']}"
                                      "@tollhouse-postgres:5432/tollhouse")
    assert trial_cfg.state.url == (f"redis://:{trial_secret['REDIS_PASSWORD']}"
                                   "@tollhouse-redis:6379/0")
    services = {d["metadata"]["name"]: d for d in trial if d["kind"] == "Service"}
    assert services["tollhouse-postgres"]["spec"]["ports"][0]["port"] == 5432
    assert services["tollhouse-redis"]["spec"]["ports"][0]["port"] == 6379
    for name in ("tollhouse-postgres", "tollhouse-redis"):
        spec = one(trial, "Deployment", name)["spec"]["template"]["spec"]
        env = container_env(spec["containers"][0], {"tollhouse": trial_secret})
        assert set(env.values()) & {trial_secret["POSTGRES_PASSWORD"],
                                    trial_secret["REDIS_PASSWORD"]}, name
    # no secret is committed: neither kustomization makes one
    assert not [d for d in base + trial if d["kind"] == "Secret"]


def test_the_configmap_is_the_one_mounted(base: list[dict[str, Any]]) -> None:
    configmap = one(base, "ConfigMap", "tollhouse-config")["metadata"]["name"]
    spec = one(base, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert volumes[mounts["/etc/tollhouse"]["name"]]["configMap"]["name"] == configmap
    env = {e["name"]: e.get("value") for e in gateway(base)["env"]}
    assert env["TOLLHOUSE_CONFIG"] == "/etc/tollhouse/config.toml"


def test_service_hpa_and_pdb_select_the_gateway_pods_only(trial: list[dict[str, Any]]) -> None:
    deployment = one(trial, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selects(deployment["spec"]["selector"]["matchLabels"], labels)
    assert "replicas" not in deployment["spec"]  # the HPA owns the count
    service = one(trial, "Service")
    pdb = one(trial, "PodDisruptionBudget")
    assert selects(service["spec"]["selector"], labels)
    assert selects(pdb["spec"]["selector"]["matchLabels"], labels)
    container_ports = {p["name"] for p in gateway(trial)["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports
    for name in ("tollhouse-postgres", "tollhouse-redis"):  # the trial's stores are not gateways
        other = one(trial, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
        assert not selects(service["spec"]["selector"], other), name
        assert not selects(pdb["spec"]["selector"]["matchLabels"], other), name
        assert not selects(deployment["spec"]["selector"]["matchLabels"], other), name
    hpa = one(trial, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": "tollhouse"}
    assert hpa["minReplicas"] >= 2 and hpa["maxReplicas"] > hpa["minReplicas"]
    assert pdb["spec"]["maxUnavailable"] == 1


def test_the_pod_runs_as_the_image_user_without_privileges(base: list[dict[str, Any]]) -> None:
    spec = one(base, "Deployment")["spec"]["template"]["spec"]
    _, stages = parse_dockerfile((DEPLOY / "Dockerfile").read_text("utf-8"))
    uid = int(stages[-1].args("USER")[-1].split(":")[0])
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == uid
    assert spec["automountServiceAccountToken"] is False
    security = gateway(base)["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    # what a read-only root leaves writable
    mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert "/tmp" in mounts


def test_the_servicemonitor_scrapes_the_service_with_the_metrics_token(
        base: list[dict[str, Any]], monitored: list[dict[str, Any]]) -> None:
    monitor = one(monitored, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    service = one(monitored, "Service")
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    credentials = endpoint["authorization"]["credentials"]
    assert credentials["name"] == "tollhouse"
    assert credentials["key"] in documented_secret(KUBERNETES / "base" / "kustomization.yaml")
    # the token Prometheus sends is the one the config checks
    config = one(base, "ConfigMap", "tollhouse-config")["data"]["config.toml"]
    assert f'metrics_token = "${{{credentials["key"]}}}"' in config
    # the component adds the monitor and nothing else
    assert sorted(d["kind"] for d in monitored) == sorted(
        [d["kind"] for d in base] + ["ServiceMonitor"])
