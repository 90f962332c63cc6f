"""Kubernetes manifests: schema validation (kubernetes-validate, strict) for the
built-in kinds, shape checks for the Prometheus operator's CRDs, and the
references between objects that no schema sees."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from gateway.control.signals import Target
from gateway.control.signals.prometheus import selector
from gateway.policy.loader import parse_policy
from tests.unit.deploy.conftest import DEPLOY, K8S, REPO

# Validated here by shape only: kubernetes-validate ships no schema for them.
NOT_IN_SCHEMAS = {"ServiceMonitor", "PrometheusRule", "Kustomization"}
LAUNCH_PROFILES = {"speculative-ngram", "speculative-eagle3", "speculative-draft", "standard"}


def by_kind(documents, kind):
    return [doc for _, doc in documents if doc["kind"] == kind]


def one(documents, kind, name):
    [doc] = [d for d in by_kind(documents, kind) if d["metadata"]["name"] == name]
    return doc


def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def load_render_module():
    spec = importlib.util.spec_from_file_location("k8s_render", K8S / "render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("version", ["1.29.0", kubernetes_validate.latest_version()])
def test_builtin_kinds_pass_strict_schema_validation(k8s_documents, version):
    validated, skipped = set(), set()
    for filename, document in k8s_documents:
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            skipped.add(document["kind"])
            continue
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{filename}: {document['kind']} {exc.message} at {list(exc.path)}")
        validated.add(document["kind"])
    assert skipped == NOT_IN_SCHEMAS
    assert {"Deployment", "StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget",
            "HorizontalPodAutoscaler", "Namespace", "NetworkPolicy"} <= validated


def test_schema_validation_rejects_a_broken_deployment(k8s_documents):
    broken = yaml.safe_load(yaml.safe_dump(one(k8s_documents, "Deployment", "specgate-gateway")))
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.29.0", strict=True)


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == manifests
    assert [i["name"] for i in kustomization["images"]] == ["specgate"]


@pytest.mark.slow
def test_rendered_copies_are_current():
    result = subprocess.run([sys.executable, str(K8S / "render.py"), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_prometheusrule_carries_exactly_the_compose_rules(k8s_documents):
    rule = one(k8s_documents, "PrometheusRule", "specgate")
    alerts = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == alerts["groups"]


def test_render_reflects_a_changed_source():
    render = load_render_module()
    alerts = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    changed = render.render_prometheus_rule(alerts.replace("for: 10m", "for: 11m"))
    assert changed != (K8S / "prometheusrule.yaml").read_text()
    assert "for: 11m" in changed


def test_configmap_holds_the_compose_policy_and_flags(k8s_documents):
    config = one(k8s_documents, "ConfigMap", "specgate-gateway-config")
    policy_text = (REPO / "policies" / "examples" / "compose.yaml").read_text()
    assert config["data"]["policy.yaml"] == policy_text
    policy = parse_policy(config["data"]["policy.yaml"], "configmap:policy.yaml")
    flags = yaml.safe_load(config["data"]["flags.yaml"])
    assert set(flags) <= set(policy.pools)
    assert all(v["mode"] in {"auto", "force_on", "force_off"} for v in flags.values())
    services = {s["metadata"]["name"]: s for s in by_kind(k8s_documents, "Service")}
    for pool in policy.pools.values():
        for endpoint in pool.endpoints:
            url = urlsplit(endpoint.url)
            service = services[url.hostname]
            assert url.port in {p["port"] for p in service["spec"]["ports"]}


def workloads(k8s_documents) -> dict[str, dict]:
    """Deployments and StatefulSets by name."""
    return {d["metadata"]["name"]: d for kind in ("Deployment", "StatefulSet") for d in by_kind(k8s_documents, kind)}


def gateway_container(k8s_documents):
    deployment = one(k8s_documents, "Deployment", "specgate-gateway")
    return deployment, deployment["spec"]["template"]["spec"]["containers"][0]


def test_gateway_reads_policy_and_flags_from_the_configmap(k8s_documents):
    deployment, container = gateway_container(k8s_documents)
    env = {e["name"]: e for e in container["env"]}
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "config"]
    assert "subPath" not in mount  # subPath mounts never receive ConfigMap updates
    [volume] = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "config"]
    config = one(k8s_documents, "ConfigMap", volume["configMap"]["name"])
    for variable, key in (("SPECGATE_POLICY", "policy.yaml"), ("SPECGATE_FLAGS_FILE", "flags.yaml")):
        assert env[variable]["value"] == f"{mount['mountPath']}/{key}"
        assert key in config["data"]
    assert env["SPECGATE_PROMETHEUS_URL"]["value"].startswith("http://")
    assert env["SPECGATE_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True


def test_gateway_probes_replicas_and_resources(k8s_documents):
    deployment, container = gateway_container(k8s_documents)
    assert deployment["spec"]["replicas"] == 3
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    startup = container["startupProbe"]  # the scrubber's build, with capture on, is not a dead gateway
    assert startup["httpGet"]["path"] == "/healthz" and startup["periodSeconds"] * startup["failureThreshold"] >= 120
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])
    from specgate.cli import build_parser
    args = build_parser().parse_args(container["args"])
    assert (args.command, args.host, args.port) == ("serve", "0.0.0.0", 8080)
    assert container["ports"][0]["containerPort"] == args.port


def test_service_pdb_hpa_and_monitors_point_at_the_right_objects(k8s_documents):
    deployments = workloads(k8s_documents)
    pod_labels = {n: d["spec"]["template"]["metadata"]["labels"] for n, d in deployments.items()}
    for name, deployment in deployments.items():
        assert selects(deployment["spec"]["selector"]["matchLabels"], pod_labels[name])
    services = by_kind(k8s_documents, "Service")
    for service in services:
        backing = [n for n, labels in pod_labels.items() if selects(service["spec"]["selector"], labels)]
        assert len(backing) == 1, service["metadata"]["name"]
        container_ports = {p["name"] for c in deployments[backing[0]]["spec"]["template"]["spec"]["containers"]
                           for p in c["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports
    pdb = one(k8s_documents, "PodDisruptionBudget", "specgate-gateway")
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels["specgate-gateway"])
    hpa = one(k8s_documents, "HorizontalPodAutoscaler", "specgate-gateway")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert (hpa["spec"]["scaleTargetRef"]["kind"], hpa["spec"]["scaleTargetRef"]["name"]) == (
        "Deployment", "specgate-gateway")
    assert hpa["spec"]["minReplicas"] >= 2 and pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]
    monitored = set()
    for monitor in by_kind(k8s_documents, "ServiceMonitor"):
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        chosen = [s for s in services if selects(monitor["spec"]["selector"]["matchLabels"],
                                                 s["metadata"]["labels"])]
        assert chosen, monitor["metadata"]["name"]
        for service in chosen:
            port_names = {p["name"] for p in service["spec"]["ports"]}
            assert {e["port"] for e in monitor["spec"]["endpoints"]} <= port_names
            assert all(e["path"] == "/metrics" for e in monitor["spec"]["endpoints"])
            monitored.add(service["metadata"]["name"])
    assert monitored == {"specgate-gateway", "vllm-speculative", "vllm-standard"}


def test_backend_monitor_labels_series_with_the_service_pool(k8s_documents):
    monitor = one(k8s_documents, "ServiceMonitor", "specgate-vllm")
    [relabel] = monitor["spec"]["endpoints"][0]["relabelings"]
    assert relabel["targetLabel"] == "pool"
    [source] = relabel["sourceLabels"]
    # The operator exposes Service label `specgate.io/pool` under this meta label.
    assert source == "__meta_kubernetes_service_label_specgate_io_pool"
    pools = {s["metadata"]["labels"].get("specgate.io/pool") for s in by_kind(k8s_documents, "Service")}
    assert {"speculative", "standard"} <= pools


def test_guard_selects_each_pool_by_the_label_the_monitor_sets(k8s_documents):
    """`instance` is a pod IP in the cluster: a selector built from the policy's
    Service URLs would never match, and the guard would hold for ever."""
    config = one(k8s_documents, "ConfigMap", "specgate-gateway-config")
    policy = parse_policy(config["data"]["policy.yaml"], "configmap:policy.yaml")
    target = policy.spec.guard.target
    [relabel] = one(k8s_documents, "ServiceMonitor", "specgate-vllm")["spec"]["endpoints"][0]["relabelings"]
    assert policy.spec.guard.source == "prometheus"
    assert target.label == relabel["targetLabel"] == "pool" and "{endpoints}" not in target.value
    services = {s["metadata"]["name"]: s for s in by_kind(k8s_documents, "Service")}
    for name, pool in policy.pools.items():
        matcher = selector(Target(name, pool.dialect, tuple(e.url for e in pool.endpoints)), policy.spec.guard)
        pattern = re.fullmatch(r'pool=~"(.*)"', matcher).group(1).replace("\\\\", "\\")
        for endpoint in pool.endpoints:
            labels = services[urlsplit(endpoint.url).hostname]["metadata"]["labels"]
            assert re.fullmatch(pattern, labels["specgate.io/pool"]), (name, matcher, labels)


@pytest.mark.parametrize("pool, profile", [("speculative", "speculative-eagle3"),
                                           ("standard", "standard")])
def test_vllm_backends_use_the_launcher_with_tensor_parallelism(k8s_documents, pool, profile):
    deployment = one(k8s_documents, "Deployment", f"vllm-{pool}")
    pod = deployment["spec"]["template"]["spec"]
    [vllm] = pod["containers"]
    assert vllm["image"].startswith("vllm/vllm-openai:v")
    assert vllm["command"] == ["python3", "-m", "backends.vllm.launch"]
    args = vllm["args"]
    assert args[args.index("--profile") + 1] == profile in LAUNCH_PROFILES
    assert args[args.index("--port") + 1] == "8000"
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    extra = shlex.split(env["SPECGATE_VLLM_EXTRA_ARGS"])
    assert extra[extra.index("--tensor-parallel-size") + 1] == "2"
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert any(m["mountPath"] == "/dev/shm" for m in vllm["volumeMounts"])
    # The launcher arrives through an init container from the specgate image.
    [init] = pod["initContainers"]
    launcher_mount = {m["name"]: m["mountPath"] for m in vllm["volumeMounts"]}["launcher"]
    assert env["PYTHONPATH"] == launcher_mount
    assert init["image"] == "specgate" and init["command"][-1].rstrip("/") == launcher_mount
    assert deployment["metadata"]["labels"]["specgate.io/pool"] == pool
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert vllm[probe]["httpGet"]["path"] == "/health"
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "WORKDIR /opt/specgate\n" in dockerfile and "COPY backends ./backends\n" in dockerfile
    assert init["command"][-2] == "/opt/specgate/backends"


def test_both_vllm_pools_serve_the_same_model(k8s_documents):
    models = set()
    for pool in ("speculative", "standard"):
        [vllm] = one(k8s_documents, "Deployment", f"vllm-{pool}")["spec"]["template"]["spec"]["containers"]
        models |= {e["value"] for e in vllm["env"] if e["name"] == "SPECGATE_VLLM_MODEL"}
    assert len(models) == 1


def pods(k8s_documents) -> dict[str, dict]:
    return {name: workload["spec"]["template"] for name, workload in workloads(k8s_documents).items()}


@pytest.mark.parametrize("name", ["specgate-gateway", "vllm-speculative", "vllm-standard", "specgate-state"])
def test_every_container_runs_without_privileges(k8s_documents, name):
    """No capabilities, no privilege escalation, the runtime's seccomp profile and no
    API token in any pod. vLLM's image runs as root (its caches live under /root), so
    its container cannot require runAsNonRoot; every other container does."""
    pod = pods(k8s_documents)[name]["spec"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    for container in pod.get("initContainers", []) + pod["containers"]:
        context = {**pod["securityContext"], **container.get("securityContext", {})}
        assert context.get("allowPrivilegeEscalation") is False, container["name"]
        assert context.get("capabilities") == {"drop": ["ALL"]}, container["name"]
        assert not context.get("privileged"), container["name"]
        if not container["image"].startswith("vllm/vllm-openai:"):
            assert context.get("runAsNonRoot") is True and context.get("runAsUser", 0) != 0, container["name"]
            assert context.get("readOnlyRootFilesystem") is True, container["name"]


def peer_selects(peer: dict, namespace_labels: dict, pod_labels: dict) -> bool:
    """Whether a NetworkPolicy `from` entry admits a pod (labels, its namespace's labels)."""
    pod_ok = selects(peer.get("podSelector", {}).get("matchLabels", {}), pod_labels) if "podSelector" in peer else True
    if "namespaceSelector" in peer:
        return pod_ok and selects(peer["namespaceSelector"].get("matchLabels", {}), namespace_labels)
    return pod_ok and namespace_labels.get("kubernetes.io/metadata.name") == "specgate"


def test_only_the_gateway_and_prometheus_reach_the_backends(k8s_documents):
    policy = one(k8s_documents, "NetworkPolicy", "vllm-ingress")
    templates = pods(k8s_documents)
    guarded = {n for n, t in templates.items()
               if selects(policy["spec"]["podSelector"]["matchLabels"], t["metadata"]["labels"])}
    assert guarded == {"vllm-speculative", "vllm-standard"}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    [rule] = policy["spec"]["ingress"]
    assert rule.get("from"), "an ingress rule without `from` admits everyone"
    assert [p["port"] for p in rule["ports"]] == ["http"]
    container_ports = {p["name"]: p["containerPort"] for n in guarded
                       for c in templates[n]["spec"]["containers"] for p in c["ports"]}
    assert container_ports == {"http": 8000}
    here, monitoring = {"kubernetes.io/metadata.name": "specgate"}, {"kubernetes.io/metadata.name": "monitoring"}
    gateway = templates["specgate-gateway"]["metadata"]["labels"]
    prometheus = {"app.kubernetes.io/name": "prometheus", "prometheus": "k8s"}
    admitted = {(who, ns) for who, labels in (("gateway", gateway), ("prometheus", prometheus),
                                              ("other", {"app": "debug"}))
                for ns, ns_labels in (("specgate", here), ("monitoring", monitoring))
                if any(peer_selects(peer, ns_labels, labels) for peer in rule["from"])}
    assert admitted == {("gateway", "specgate"), ("prometheus", "monitoring")}


def test_replicas_share_a_persistent_state_store_only_they_reach(k8s_documents):
    _, container = gateway_container(k8s_documents)
    url = urlsplit({e["name"]: e.get("value") for e in container["env"]}["SPECGATE_STATE_URL"])
    store = one(k8s_documents, "StatefulSet", "specgate-state")
    service = one(k8s_documents, "Service", store["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"  # headless: a stable name for the pod
    assert (url.scheme, url.hostname) == ("redis", f"{store['metadata']['name']}-0.{service['metadata']['name']}")
    assert url.port in {p["port"] for p in service["spec"]["ports"]}
    pod = store["spec"]["template"]
    assert selects(service["spec"]["selector"], pod["metadata"]["labels"])
    [valkey] = pod["spec"]["containers"]
    args = valkey["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    [claim] = store["spec"]["volumeClaimTemplates"]
    assert {m["name"]: m["mountPath"] for m in valkey["volumeMounts"]}[claim["metadata"]["name"]] == (
        args[args.index("--dir") + 1])
    assert claim["spec"]["resources"]["requests"]["storage"]
    assert {"cpu", "memory"} <= set(valkey["resources"]["requests"]) & set(valkey["resources"]["limits"])
    policy = one(k8s_documents, "NetworkPolicy", "state-ingress")
    templates = pods(k8s_documents)
    guarded = {n for n, t in templates.items()
               if selects(policy["spec"]["podSelector"]["matchLabels"], t["metadata"]["labels"])}
    assert guarded == {"specgate-state"} and policy["spec"]["policyTypes"] == ["Ingress"]
    [rule] = policy["spec"]["ingress"]
    assert [p["port"] for p in rule["ports"]] == [p["targetPort"] for p in service["spec"]["ports"]]
    here = {"kubernetes.io/metadata.name": "specgate"}
    admitted = {n for n, t in templates.items()
                if any(peer_selects(peer, here, t["metadata"]["labels"]) for peer in rule["from"])}
    assert admitted == {"specgate-gateway"}
    assert not any(peer_selects(peer, {"kubernetes.io/metadata.name": "monitoring"},
                                {"app.kubernetes.io/name": "prometheus"}) for peer in rule["from"])
