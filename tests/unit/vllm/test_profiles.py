"""vLLM launch profiles, the launcher, check-draft and model preparation."""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from backends.model import prepare
from backends.vllm import load_profiles, render
from backends.vllm.check_draft import differences
from backends.vllm.launch import build_argv, vllm_environ

ROOT = Path(__file__).resolve().parents[3]


def test_every_profile_renders_a_vllm_command():
    default_model, profiles = load_profiles()
    assert set(profiles) == {"standard", "speculative-ngram", "speculative-eagle3", "speculative-eagle3-local",
                             "speculative-draft", "dynamic-eagle3", "dynamic-ngram"}
    for profile in profiles.values():
        argv = render(profile, model=default_model, port=8123, served_model_name="m", python="python3")
        assert argv[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
        assert argv[argv.index("--port") + 1] == "8123"
        assert argv[argv.index("--served-model-name") + 1] == "m"
        assert ("--speculative-config" in argv) == profile.speculative


@pytest.mark.slow
def test_speculative_configs_use_vllm_0_32_names():
    from vllm.config.speculative import SpeculativeConfig, SpeculativeMethod

    methods = set(_literal_values(SpeculativeMethod))
    fields = set(getattr(SpeculativeConfig, "__dataclass_fields__", None) or SpeculativeConfig.model_fields)
    _, profiles = load_profiles()
    for profile in profiles.values():
        if profile.speculative_config:
            assert profile.speculative_config["method"] in methods
            assert set(profile.speculative_config) <= fields, profile.name


def _literal_values(tp) -> list:
    values = []
    for arg in typing.get_args(tp):
        values += _literal_values(arg) if typing.get_args(arg) else [arg]
    return values


def test_overrides_merge_and_extra_args_come_last():
    _, profiles = load_profiles()
    argv = render(profiles["speculative-ngram"], model="m", spec_config={"num_speculative_tokens": 7},
                  extra_args=["--dtype", "float32"])
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config == {"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    assert argv[-2:] == ["--dtype", "float32"]


@pytest.mark.slow
def test_launcher_dry_run_reads_the_environment():
    env = {"SPECGATE_VLLM_MODEL": "org/model", "SPECGATE_VLLM_EXTRA_ARGS": "--tensor-parallel-size 2",
           "SPECGATE_VLLM_SPEC_CONFIG": '{"num_speculative_tokens": 5}', "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "backends.vllm.launch", "--profile", "speculative-eagle3",
                          "--port", "9000", "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True).stdout
    assert "--model org/model" in out and "--port 9000" in out
    assert out.strip().endswith("--tensor-parallel-size 2")
    assert '"num_speculative_tokens": 5' in out and '"method": "eagle3"' in out


@pytest.mark.parametrize(("env", "endpoint"), [
    ({}, None),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}, "http://collector:4318/v1/traces"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
      "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4318/v1/traces"}, "http://traces:4318/v1/traces"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "True"}, None),
])
def test_the_launcher_sends_vllms_spans_where_the_gateways_go(env, endpoint):
    argv = build_argv(["--profile", "standard", "--", "--dtype", "float32"], env)
    assert (argv[argv.index("--otlp-traces-endpoint") + 1] if "--otlp-traces-endpoint" in argv else None) == endpoint
    assert argv[-2:] == ["--dtype", "float32"], "the operator's flags still come last"
    assert vllm_environ(env)["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert vllm_environ({**env, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "grpc"


def test_compose_and_kubernetes_call_profiles_that_exist():
    import yaml

    _, profiles = load_profiles()
    compose = (ROOT / "docker-compose.yml").read_text()
    k8s = [yaml.safe_load_all((ROOT / "deploy" / "k8s" / name).read_text())
           for name in ("vllm-speculative.yaml", "vllm-standard.yaml")]
    named = {line.split("SPEC_PROFILE:-")[1].split("}")[0] for line in compose.splitlines() if "SPEC_PROFILE:-" in line}
    for docs in k8s:
        for doc in docs:
            for container in (doc or {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                args = container.get("args", [])
                if "--profile" in args:
                    named.add(args[args.index("--profile") + 1])
    assert named and named <= set(profiles)


@pytest.fixture(scope="module")
def tokenizer_dir() -> Path:
    return prepare()  # cached: converts the packaged GGUF once


@pytest.mark.slow
def test_model_prepare_is_idempotent(tokenizer_dir):
    stamp = (tokenizer_dir / "config.json").stat().st_mtime_ns
    assert prepare() == tokenizer_dir
    assert (tokenizer_dir / "config.json").stat().st_mtime_ns == stamp
    assert (tokenizer_dir / "model.safetensors").stat().st_size > 100_000_000
    config = json.loads((tokenizer_dir / "config.json").read_text())
    assert "quantization_config" not in config


@pytest.mark.slow
def test_check_draft(tokenizer_dir, tmp_path):
    from transformers import AutoTokenizer

    target = AutoTokenizer.from_pretrained(tokenizer_dir)
    assert differences(target, AutoTokenizer.from_pretrained(tokenizer_dir)) == []
    altered = AutoTokenizer.from_pretrained(tokenizer_dir)
    altered.add_special_tokens({"additional_special_tokens": ["<|draft-only|>"]})
    altered.save_pretrained(tmp_path / "altered")
    cli = [sys.executable, "-m", "specgate.cli", "check-draft", str(tokenizer_dir)]
    same = subprocess.run([*cli, str(tokenizer_dir)], cwd=ROOT, capture_output=True, text=True)
    different = subprocess.run([*cli, str(tmp_path / "altered")], cwd=ROOT, capture_output=True, text=True)
    assert same.returncode == 0, same.stdout + same.stderr
    assert different.returncode == 1
    assert "vocabulary size" in different.stdout
