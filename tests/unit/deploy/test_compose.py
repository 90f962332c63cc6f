"""docker-compose.yml: validated by docker-compose itself, and checked against
the files, the CLI and the policy it refers to. No Docker engine needed."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.policy.loader import load_policy
from specgate.cli import build_parser
from tests.unit.deploy.conftest import DEPLOY, REPO, require_tool

STACKS = {
    "gpu": {"vllm-speculative", "vllm-standard", "gateway", "state", "prometheus", "grafana"},
    "cpu": {"engine-speculative", "engine-standard", "gateway-cpu", "state", "prometheus", "grafana"},
}
LAUNCH_PROFILES = {"speculative-ngram", "speculative-eagle3", "speculative-draft", "standard"}


def compose(*args: str, env: dict[str, str] | None = None, file: Path = REPO / "docker-compose.yml"):
    """Run docker-compose (v1) in the repository with no environment but PATH and `env`: the
    file needs nothing set (`docker compose up` works as it comes)."""
    binary = require_tool("docker-compose")
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(env or {})}
    return subprocess.run([binary, "--project-directory", str(REPO), "-f", str(file), *args],
                          cwd=REPO, env=clean, capture_output=True, text=True, timeout=60)


def resolved(*profile_args: str, env: dict[str, str] | None = None) -> dict:
    result = compose(*profile_args, "config", env=env)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def dotenv() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (REPO / ".env").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def active_profiles(flag_profiles: list[str]) -> set[str]:
    # Compose v1 (get_profiles_from_options) and v2 (compose-go WithDefaultProfiles)
    # agree: --profile flags replace COMPOSE_PROFILES, which .env may set.
    if flag_profiles:
        return set(flag_profiles)
    return {p for p in dotenv().get("COMPOSE_PROFILES", "").split(",") if p}


def enabled_services(services: dict, profiles: set[str]) -> set[str]:
    # The Compose specification: a service without `profiles` is always enabled.
    return {name for name, svc in services.items()
            if not svc.get("profiles") or profiles & set(svc["profiles"])}


@pytest.mark.slow
@pytest.mark.parametrize("profile_args", [(), ("--profile", "cpu")], ids=["default", "cpu"])
def test_docker_compose_accepts_the_file(profile_args):
    result = compose(*profile_args, "config", "-q")
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_docker_compose_rejects_a_broken_copy(tmp_path):
    """The validation above has teeth: the same file with one bad key fails."""
    text = (REPO / "docker-compose.yml").read_text()
    broken = text.replace("  ipc: host", "  ipc_mode_typo: host", 1)
    assert broken != text
    path = tmp_path / "docker-compose.yml"
    path.write_text(broken)
    result = compose("config", "-q", file=path)
    assert result.returncode != 0
    assert "ipc_mode_typo" in result.stderr


@pytest.mark.parametrize("flags, stack", [([], "gpu"), (["cpu"], "cpu")])
def test_profiles_start_exactly_one_stack(compose_file, flags, stack):
    services = compose_file["services"]
    assert enabled_services(services, active_profiles(flags)) == STACKS[stack]


@pytest.mark.parametrize("stack", STACKS)
def test_dependencies_stay_inside_the_stack_and_wait_for_health(compose_file, stack):
    services = compose_file["services"]
    for name in STACKS[stack]:
        for dep, spec in services[name].get("depends_on", {}).items():
            assert dep in STACKS[stack], f"{name} depends on {dep}, not in the {stack} stack"
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{dep} has no healthcheck"
    gateway = "gateway" if stack == "gpu" else "gateway-cpu"
    backends = {n for n in STACKS[stack] if n.startswith(("vllm-", "engine-"))}
    waits_for = {d for d, s in services[gateway]["depends_on"].items()
                 if s["condition"] == "service_healthy"}
    assert waits_for == backends | {"state"}


def test_healthchecks_probe_the_health_endpoints(compose_file):
    services = compose_file["services"]
    for name in (STACKS["gpu"] | STACKS["cpu"]) - {"grafana"}:
        probe = " ".join(services[name]["healthcheck"]["test"])
        if name.startswith(("vllm-", "engine-")):
            assert "127.0.0.1:8000/health'" in probe
        elif name.startswith("gateway"):
            assert "/healthz" in probe and "/readyz" in probe
        elif name == "state":
            assert probe == "CMD valkey-cli ping"
        else:
            assert "/-/ready" in probe


@pytest.mark.parametrize("stack", STACKS)
def test_every_hostname_the_stack_dials_resolves_inside_it(compose_file, stack):
    """The policy's endpoints and Prometheus' targets are service names or aliases."""
    services = compose_file["services"]
    names: list[str] = []
    for name in STACKS[stack]:
        names.append(name)
        for network in (services[name].get("networks") or {}).values():
            names.extend((network or {}).get("aliases", []))
    assert len(names) == len(set(names)), f"name clash in the {stack} stack: {sorted(names)}"
    policy = load_policy(REPO / "policies" / "examples" / "compose.yaml")
    dialled = {urlsplit(ep.url).hostname for pool in policy.pools.values() for ep in pool.endpoints}
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    for job in scrape["scrape_configs"]:
        for group in job["static_configs"]:
            dialled |= {target.split(":")[0] for target in group["targets"]}
    grafana_source = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    dialled |= {urlsplit(ds["url"]).hostname for ds in grafana_source["datasources"]}
    assert dialled <= set(names)


def test_mounted_and_built_paths_exist(compose_file):
    for name, svc in compose_file["services"].items():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (REPO / source).exists(), f"{name} mounts missing {source}"
        build = svc.get("build")
        if build:
            context = REPO / build["context"]
            dockerfile = context / build["dockerfile"]
            assert dockerfile.is_file(), f"{name} builds from missing {dockerfile}"
            for source in dockerfile_copy_sources(dockerfile):
                assert (context / source).exists(), f"{dockerfile.name} copies missing {source}"


def dockerfile_copy_sources(dockerfile: Path) -> list[str]:
    sources = []
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            sources.extend(shlex.split(line)[1:-1])
    assert sources, "the Dockerfile copies nothing"
    return sources


def test_gpu_backends_reserve_gpus_and_cpu_backends_do_not(compose_file):
    services = compose_file["services"]
    for name in ("vllm-speculative", "vllm-standard"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices and all("gpu" in d["capabilities"] for d in devices)
    for name in STACKS["cpu"]:
        assert "deploy" not in services[name]


def test_vllm_backends_run_the_project_launcher(compose_file):
    services = compose_file["services"]
    for name in ("vllm-speculative", "vllm-standard"):
        svc = services[name]
        assert re.fullmatch(r"[\w./-]*vllm/vllm-openai:v\d+\.\d+\.\d+\}?", svc["image"].split(":-")[-1])
        assert svc["entrypoint"] == ["python3", "-m", "backends.vllm.launch"]
        pythonpath = svc["environment"]["PYTHONPATH"]
        assert f"./backends:{pythonpath}/backends:ro" in svc["volumes"]
        assert "HF_TOKEN" in svc["environment"]
        assert any(v.endswith(":/root/.cache/huggingface") for v in svc["volumes"])
        command = svc["command"]
        profile = command[command.index("--profile") + 1]
        assert re.sub(r"\$\{\w+:-(.*)\}", r"\1", profile) in LAUNCH_PROFILES
        assert command[command.index("--port") + 1] == "8000"
        assert command[command.index("--host") + 1] == "0.0.0.0"
    assert "SPECGATE_VLLM_SPEC_CONFIG" in services["vllm-speculative"]["environment"]


@pytest.mark.slow
def test_both_pools_serve_the_same_model():
    config = resolved(env={"SPECGATE_MODEL": "org/some-model"})
    models = {config["services"][n]["environment"]["SPECGATE_VLLM_MODEL"]
              for n in ("vllm-speculative", "vllm-standard")}
    assert models == {"org/some-model"}
    default = resolved()["services"]["vllm-speculative"]
    assert default["environment"]["SPECGATE_VLLM_MODEL"]
    assert not default["image"].endswith(":latest")


@pytest.mark.parametrize("service", ["gateway", "gateway-cpu"])
def test_gateway_command_is_the_cli_contract(compose_file, service):
    svc = compose_file["services"][service]
    args = build_parser().parse_args(svc["command"])
    assert args.command == "serve" and args.host == "0.0.0.0" and args.port == 8080
    assert f"./policies/examples/compose.yaml:{args.policy}:ro" in svc["volumes"]
    assert svc["environment"]["SPECGATE_PROMETHEUS_URL"] == "http://prometheus:9090"
    assert svc["ports"] == ["${SPECGATE_PORT:-8080}:8080"]
    # more than one worker is refused without a state store
    assert args.workers > 1 and svc["environment"]["SPECGATE_STATE_URL"]


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["gpu", "cpu"])
def test_gateway_shares_state_through_the_stack_store_unless_told_otherwise(profile):
    gateway = "gateway" if profile == "gpu" else "gateway-cpu"
    services = resolved("--profile", profile)["services"]
    url = urlsplit(services[gateway]["environment"]["SPECGATE_STATE_URL"])
    assert (url.scheme, url.hostname, url.port) == ("redis", "state", 6379)
    managed = "rediss://gateway:secret@redis.example.com:6380/0"
    changed = resolved("--profile", profile, env={"SPECGATE_STATE_URL": managed})["services"]
    assert changed[gateway]["environment"]["SPECGATE_STATE_URL"] == managed


def test_state_store_persists_and_stays_inside_the_stack(compose_file):
    state = compose_file["services"]["state"]
    command = state["command"]
    assert command[0] == "valkey-server"
    assert command[command.index("--appendonly") + 1] == "yes"
    data = command[command.index("--dir") + 1]
    assert f"state-data:{data}" in state["volumes"] and "state-data" in compose_file["volumes"]
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert "ports" not in state and "profiles" not in state
    assert state["restart"] == "unless-stopped"


def test_dockerfile_default_command_is_the_cli_contract():
    text = (DEPLOY / "Dockerfile").read_text()
    cmd = yaml.safe_load(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))
    assert re.search(r'^ENTRYPOINT \["specgate"\]$', text, re.M)
    args = build_parser().parse_args(cmd)
    assert (args.command, args.host, args.port) == ("serve", "0.0.0.0", 8080)
    assert re.search(r"^FROM python:3\.11-slim$", text, re.M)


def test_compose_policy_uses_the_prometheus_guard():
    policy = load_policy(REPO / "policies" / "examples" / "compose.yaml")
    assert policy.spec.guard.source == "prometheus"
    assert {p.kind for p in policy.pools.values()} == {"speculative", "standard"}


@pytest.mark.slow
def test_monitoring_ports_listen_on_loopback_only():
    """Prometheus and Grafana publish on 127.0.0.1, never on every interface."""
    services = resolved("--profile", "cpu", env={"PROMETHEUS_PORT": "19090", "GRAFANA_PORT": "13000"})["services"]
    for name, target in (("prometheus", 9090), ("grafana", 3000)):
        ports = services[name]["ports"]
        assert ports, f"{name} publishes no port"
        for port in ports:
            # docker-compose v1 resolves "127.0.0.1:19090:9090" to host_ip/published/target
            # (long form) or keeps the short string, depending on its version.
            if isinstance(port, dict):
                assert (port.get("host_ip"), int(port["target"])) == ("127.0.0.1", target), port
            else:
                assert port.startswith("127.0.0.1:"), port


def test_prometheus_admin_api_and_lifecycle_stay_off(compose_file):
    flags = compose_file["services"]["prometheus"]["command"]
    assert not any(f.startswith(("--web.enable-lifecycle", "--web.enable-admin-api")) for f in flags)


def test_the_file_requires_no_variable():
    """`${VAR:?message}` makes Compose refuse to start while VAR is unset: there is none."""
    text = (REPO / "docker-compose.yml").read_text()
    assert not re.search(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?\?", text)


@pytest.mark.slow
def test_grafana_is_read_only_with_no_login_and_no_admin(compose_file):
    """No admin with a known password: no admin user is created, nobody logs in (no form,
    no basic auth, no sign-up), and the anonymous visitor may only view."""
    env = compose_file["services"]["grafana"]["environment"]
    assert {k: str(v).lower() for k, v in env.items() if k.startswith(("GF_AUTH", "GF_SECURITY", "GF_USERS"))} == {
        "GF_AUTH_ANONYMOUS_ENABLED": "true", "GF_AUTH_ANONYMOUS_ORG_ROLE": "viewer",
        "GF_AUTH_DISABLE_LOGIN_FORM": "true", "GF_AUTH_BASIC_ENABLED": "false",
        "GF_SECURITY_DISABLE_INITIAL_ADMIN_CREATION": "true", "GF_USERS_ALLOW_SIGN_UP": "false"}
