"""The Kubernetes manifests (``examples/kubernetes``) and the image (``Dockerfile``): every
kustomize overlay renders offline (``kubectl kustomize``), every object passes Kubernetes'
own schemas (``kubernetes-validate``, strictly: an unknown field fails), the deployment file
each overlay ships is a valid shuniu deployment, and the gateway's pod drains within its
grace period as a non-root user. The image cannot be built here (no base image can be
pulled); what its Dockerfile says is checked instead."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from shuniu.core.config.loader import load_deployment
from shuniu.core.http.workers import check_workers
from shuniu.core.plugin_manager import load_plugins

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "examples" / "kubernetes"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if p.is_dir())
KUBERNETES = "1.32.0"
CRDS = ("monitoring.coreos.com/", "keda.sh/")
"""API groups of custom resources, which Kubernetes' own schemas do not cover."""

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (with kustomize)")


def _render(overlay: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].startswith(name)]
    return found


def test_there_are_the_overlays_the_docs_describe() -> None:
    assert OVERLAYS == ["ascend-mindie", "ha", "nvidia-vllm", "nvidia-vllm-keda", "single"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_passes_kubernetes_schemas(overlay: str) -> None:
    objects = _render(overlay)
    checked = 0
    for obj in objects:
        if obj["apiVersion"].startswith(CRDS):
            _check_custom(obj, objects)
            continue
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)
        checked += 1
    assert checked >= 5
    assert all(o["metadata"].get("namespace") == "shuniu" for o in objects if o["kind"] != "Namespace")


def _check_custom(obj: dict[str, Any], objects: list[dict[str, Any]]) -> None:
    """The custom resources, whose schemas Kubernetes does not ship, checked by hand."""
    if obj["kind"] == "ServiceMonitor":
        assert obj["spec"]["endpoints"][0]["path"] == "/metrics"
        return
    assert obj["kind"] == "ScaledObject", obj["kind"]
    spec = obj["spec"]
    assert set(spec) <= {
        "scaleTargetRef",
        "minReplicaCount",
        "maxReplicaCount",
        "pollingInterval",
        "cooldownPeriod",
        "advanced",
        "triggers",
    }
    target = _one(objects, spec["scaleTargetRef"]["kind"], spec["scaleTargetRef"]["name"])
    assert target["kind"] == "StatefulSet"
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    assert "shuniu_pool_replica_demand" in trigger["metadata"]["query"]
    assert float(trigger["metadata"]["threshold"]) == 1.0
    # It replaces the HPA: one autoscaler per StatefulSet.
    assert not [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
    _check_scaling_matches_the_gateway(objects, spec["minReplicaCount"], spec["maxReplicaCount"])


def _check_scaling_matches_the_gateway(objects: list[dict[str, Any]], low: int, high: int) -> None:
    """The autoscaler's bounds are the gateway's ``min_replicas``/``max_replicas``, and the
    model it scales on has ``autoscaling:``."""
    data = yaml.safe_load(_deployment_file(objects))
    scaled = {name: m["autoscaling"] for name, m in data["models"].items() if "autoscaling" in m}
    assert scaled
    for cfg in scaled.values():
        assert (cfg.get("min_replicas", 1), cfg.get("max_replicas", 64)) == (low, high)


def test_the_hpa_scales_the_engines_on_the_look_ahead_signal() -> None:
    objects = _render("nvidia-vllm")
    hpa = _one(objects, "HorizontalPodAutoscaler", "vllm")
    spec = hpa["spec"]
    target = spec["scaleTargetRef"]
    assert _one(objects, target["kind"], target["name"])["kind"] == "StatefulSet"
    (metric,) = spec["metrics"]
    assert metric["external"]["metric"]["name"] == "shuniu_pool_replica_demand"
    model = metric["external"]["metric"]["selector"]["matchLabels"]["model"]
    assert model in yaml.safe_load(_deployment_file(objects))["models"]
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    _check_scaling_matches_the_gateway(objects, spec["minReplicas"], spec["maxReplicas"])


def test_the_schema_check_can_fail() -> None:
    deployment = copy.deepcopy(_one(_render("single"), "Deployment", "shuniu-gateway"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {"path": "/ready"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


def _deployment_file(objects: list[dict[str, Any]]) -> str:
    return _one(objects, "ConfigMap", "shuniu-deployment")["data"]["deployment.yaml"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_shipped_deployment_file_is_valid(overlay: str) -> None:
    objects = _render(overlay)
    text = _deployment_file(objects)
    env = {}
    secrets = [o for o in objects if o["kind"] == "Secret"]
    if secrets:
        env["SHUNIU_ADMIN_KEY_HASH"] = secrets[0]["stringData"]["admin-key-hash"]
    plugins = load_plugins()
    resolved = load_deployment("deployment.yaml", plugins, text=text, env=env)
    gw = resolved.deployment.gateway
    assert gw.host == "0.0.0.0" and gw.port == 8000
    assert check_workers(resolved, gw.workers) == []
    # The pod waits for the drain: grace period > preStop + graceful_shutdown_s.
    pod = _one(objects, "Deployment", "shuniu-gateway")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > pre_stop + gw.graceful_shutdown_s
    # Every engine address names a replica of a StatefulSet behind a headless Service.
    sets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "StatefulSet"}
    headless = {
        o["metadata"]["name"]
        for o in objects
        if o["kind"] == "Service" and o["spec"].get("clusterIP") == "None"
    }
    for model in resolved.deployment.models.values():
        for ep in model.endpoints:
            if ep.discovery is not None:
                _check_discovery(objects, ep.discovery.options)
                continue
            url = ep.options.get("base_url") if ep.kind != "sim" else None
            if url is None:
                continue
            m = re.match(r"http://([a-z0-9-]+)-(\d+)\.([a-z0-9-]+):\d+", url)
            assert m, url
            name, ordinal, service = m.group(1), int(m.group(2)), m.group(3)
            assert name in sets and ordinal < sets[name]["spec"]["replicas"], url
            assert service in headless and sets[name]["spec"]["serviceName"] == service


def _check_discovery(objects: list[dict[str, Any]], options: dict[str, Any]) -> None:
    """A ``kubernetes`` discovery entry names a headless Service with that port, whose
    selector is a StatefulSet's pods, and the gateway may read its slices and pods."""
    service = _one(objects, "Service", options["service"])
    assert service["spec"]["clusterIP"] == "None"
    assert options["port"] in {p["name"] for p in service["spec"]["ports"]}
    selector = service["spec"]["selector"]
    assert any(
        o["kind"] == "StatefulSet" and selector.items() <= o["spec"]["template"]["metadata"]["labels"].items()
        for o in objects
    )
    account = _one(objects, "ServiceAccount", "shuniu")
    assert account["automountServiceAccountToken"] is True
    binding = next(o for o in objects if o["kind"] == "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "shuniu", "namespace": "shuniu"}]
    role = _one(objects, "Role", binding["roleRef"]["name"])
    rules = {
        (g, r): set(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert {"list", "watch"} <= rules[("discovery.k8s.io", "endpointslices")]
    assert "get" in rules[("", "pods")]


def test_the_gateway_pod_runs_unprivileged_and_probes_the_gateway() -> None:
    pod = _one(_render("single"), "Deployment", "shuniu-gateway")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["args"] == ["serve", "/etc/shuniu/deployment.yaml"]
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/etc/shuniu"}
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"


def test_engines_ask_for_their_accelerators_and_are_ready_on_their_health() -> None:
    vllm = _one(_render("nvidia-vllm"), "StatefulSet", "vllm")["spec"]["template"]["spec"]["containers"][0]
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert vllm["readinessProbe"]["httpGet"]["path"] == "/health"
    mindie = _one(_render("ascend-mindie"), "StatefulSet", "mindie")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert mindie["resources"]["limits"]["huawei.com/Ascend910"] == "1"
    assert mindie["readinessProbe"]["httpGet"]["path"].startswith("/v2/health/")


def test_ha_spreads_three_gateways_and_keeps_two() -> None:
    objects = _render("ha")
    spec = _one(objects, "Deployment", "shuniu-gateway")["spec"]
    assert spec["replicas"] == 3
    assert spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert _one(objects, "PodDisruptionBudget", "shuniu-gateway")["spec"]["minAvailable"] == 2
    text = _deployment_file(objects)
    assert "fleet:" in text and "store: redis" in text


def test_the_dockerfile() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+(\S+)\s+AS\s+(\S+)", text, re.M)
    assert [s for _, s in stages] == ["build", "runtime"] and all(b == "${PYTHON_IMAGE}" for b, _ in stages)
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.\d+-slim$", text, re.M)
    assert re.search(r"^ARG EXTRAS=", text, re.M)
    runtime = text.split("AS runtime", 1)[1]
    user = re.findall(r"^USER\s+(\S+)", runtime, re.M)
    assert user and not user[-1].startswith(("0", "root"))
    assert "STOPSIGNAL SIGTERM" in runtime
    assert 'ENTRYPOINT ["shuniu"]' in runtime and 'CMD ["serve", "/etc/shuniu/deployment.yaml"]' in runtime
    # No secrets baked in.
    assert not re.search(r"^(ENV|ARG)\s+\S*(KEY|TOKEN|PASSWORD|SECRET)", text, re.M | re.I)
    # What it copies is what the wheel is built from.
    copied = set(re.findall(r"^COPY (\w+) \1$", text, re.M))
    assert copied == {"core", "plugins", "backends", "hardware"}


# -- the Helm chart, checked offline (no helm binary here: its templates are not rendered) ---

CHART = ROOT / "examples" / "helm" / "shuniu"
_ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", re.S)


def _values_paths(node: Any, prefix: str = "") -> set[str]:
    out = {prefix} if prefix else set()
    if isinstance(node, dict):
        for key, value in node.items():
            out |= _values_paths(value, f"{prefix}.{key}" if prefix else key)
    return out


def test_the_chart_describes_this_version() -> None:
    from shuniu.core.version import __version__

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "shuniu" and chart["appVersion"] == __version__


def test_the_chart_templates_use_only_values_it_has_and_close_every_block() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    known = _values_paths(values)
    for template in sorted((CHART / "templates").iterdir()):
        text = template.read_text()
        actions = _ACTION.findall(text)
        # Every action opened is closed (a bare "}}" may be YAML closing two flow mappings).
        assert text.count("{{") == len(actions), template.name
        depth = 0
        for action in actions:
            word = action.split()[0] if action.split() else ""
            if word in ("if", "with", "range", "define"):
                depth += 1
            elif word == "end":
                depth -= 1
            assert depth >= 0, (template.name, action)
        assert depth == 0, template.name
        for path in re.findall(r"\.Values\.([A-Za-z0-9_.]+)", text):
            assert path.rstrip(".") in known, (template.name, path)
    # Relative references inside `with .Values.engines.<kind>` blocks.
    for kind in ("vllm", "mindie"):
        text = (CHART / "templates" / f"{kind}.yaml").read_text()
        for name in set(re.findall(r"\{\{-?\s*\.([a-zA-Z]+)", text)) - {"Values", "Release"}:
            assert f"engines.{kind}.{name}" in known, (kind, name)


def test_the_chart_has_the_manifests_content_and_documents_its_values() -> None:
    kustomized = {o["kind"] for overlay in OVERLAYS for o in _render(overlay)}
    charted = {
        kind
        for t in (CHART / "templates").glob("*.yaml")
        for kind in re.findall(r"^kind: (\w+)", t.read_text(), re.M)
    }
    # Helm installs into its --namespace, and the admin key comes from a Secret of the user's.
    assert charted == kustomized - {"Namespace", "Secret"}
    doc = (ROOT / "docs" / "kubernetes.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    leaves = {
        p for p in _values_paths(values) if not isinstance(_get(values, p), dict) or not _get(values, p)
    }

    def documented(path: str) -> bool:  # the value, or a whole it is part of (gateway.resources)
        parts = path.split(".")
        return any(f"`{'.'.join(parts[:k])}`" in doc for k in range(min(2, len(parts)), len(parts) + 1))

    missing = sorted(p for p in leaves if not documented(p))
    assert not missing, f"values not described in docs/kubernetes.md: {missing}"


def _get(node: Any, path: str) -> Any:
    for part in path.split("."):
        node = node[part]
    return node
