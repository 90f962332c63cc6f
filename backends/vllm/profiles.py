"""Launch profiles as data, rendered to a vLLM command line by one function."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

from backends.vllm.heads import resolve_heads

VLLM_SERVER = ("-m", "vllm.entrypoints.openai.api_server")


@dataclass(frozen=True)
class Profile:
    name: str
    description: str = ""
    speculative_config: Mapping[str, Any] | None = None
    args: Mapping[str, Any] = field(default_factory=dict)

    @property
    def speculative(self) -> bool:
        return self.speculative_config is not None


def load_profiles(text: str | None = None) -> tuple[str, dict[str, Profile]]:
    """(default model, profiles by name) from profiles.yaml, or from `text`."""
    if text is None:
        text = resources.files("backends.vllm").joinpath("profiles.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    profiles = {name: Profile(name=name, description=spec.get("description", ""),
                              speculative_config=spec.get("speculative_config"), args=spec.get("args") or {})
                for name, spec in data["profiles"].items()}
    return data["default_model"], profiles


def render(profile: Profile, *, model: str, host: str = "127.0.0.1", port: int = 8000,
           served_model_name: str | None = None, spec_config: Mapping[str, Any] | None = None,
           extra_args: Sequence[str] = (), python: str = sys.executable) -> list[str]:
    """The argv that starts vLLM's OpenAI server for `profile`.

    `spec_config` replaces the profile's speculative config keys it names;
    `extra_args` are appended last, so they win over the profile's flags. A
    head named by placeholder (`{shipped-eagle3-head}`) becomes its directory.
    """
    argv = [python, *VLLM_SERVER, "--model", model, "--host", host, "--port", str(port)]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    for flag, value in profile.args.items():
        argv += _flag(flag, value)
    config = dict(profile.speculative_config or {})
    if spec_config:
        config.update(spec_config)
    if config:
        argv += ["--speculative-config", json.dumps(resolve_heads(config), sort_keys=True)]
    return argv + list(extra_args)


def split_args(text: str | None) -> list[str]:
    return shlex.split(text) if text else []


def _flag(name: str, value: Any) -> list[str]:
    option = "--" + name.replace("_", "-")
    if value is True:
        return [option]
    if value is False or value is None:
        return []
    return [option, str(value)]
