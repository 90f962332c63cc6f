"""Launch profiles as data, rendered to a vLLM command line by one function."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

import yaml

from backends.speculation import ScheduleError, SpeculationSchedule
from backends.vllm.heads import resolve_heads

VLLM_SERVER = ("-m", "vllm.entrypoints.openai.api_server")
# Every speculating profile reports each answer's acceptance in `metrics.speculative_decoding`.
PER_REQUEST_METRICS = ("--per-request-spec-decode-metrics", "summary")

Kind = Literal["standard", "speculative", "dynamic"]


class ProfileError(ValueError):
    """A profile that cannot start vLLM, with the reason."""


@dataclass(frozen=True)
class Profile:
    """A launch profile. `kind` is the pool kind it serves: standard (no
    speculative config), speculative, or dynamic (a speculative config plus a
    `speculation_schedule`, vLLM's `num_speculative_tokens_per_batch_size`)."""

    name: str
    description: str = ""
    speculative_config: Mapping[str, Any] | None = None
    args: Mapping[str, Any] = field(default_factory=dict)
    speculation_schedule: SpeculationSchedule | None = None

    @property
    def speculative(self) -> bool:
        return self.speculative_config is not None

    @property
    def kind(self) -> Kind:
        if self.speculation_schedule is not None:
            return "dynamic"
        return "speculative" if self.speculative else "standard"


def load_profiles(text: str | None = None) -> tuple[str, dict[str, Profile]]:
    """(default model, profiles by name) from profiles.yaml, or from `text`."""
    if text is None:
        text = resources.files("backends.vllm").joinpath("profiles.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    return data["default_model"], {name: _profile(name, spec) for name, spec in data["profiles"].items()}


def _profile(name: str, spec: Mapping[str, Any]) -> Profile:
    config = spec.get("speculative_config")
    schedule = None
    if spec.get("speculation_schedule") is not None:
        if not config:
            raise ProfileError(f"profile {name}: a speculation_schedule needs a speculative_config")
        try:
            schedule = SpeculationSchedule.parse(spec["speculation_schedule"])
        except ScheduleError as exc:
            raise ProfileError(f"profile {name}: {exc}") from exc
        if schedule.max_tokens() > int(config.get("num_speculative_tokens", 0)):
            raise ProfileError(f"profile {name}: the schedule asks for more draft tokens than "
                               "num_speculative_tokens (vLLM would cap them)")
    return Profile(name=name, description=spec.get("description", ""), speculative_config=config,
                   args=spec.get("args") or {}, speculation_schedule=schedule)


def render(profile: Profile, *, model: str, host: str = "127.0.0.1", port: int = 8000,
           served_model_name: str | None = None, spec_config: Mapping[str, Any] | None = None,
           extra_args: Sequence[str] = (), python: str = sys.executable) -> list[str]:
    """The argv that starts vLLM's OpenAI server for `profile`.

    `spec_config` replaces the profile's speculative config keys it names;
    `extra_args` are appended last, so they win over the profile's flags. A
    head named by placeholder (`{shipped-eagle3-head}`) becomes its directory.
    A speculating profile asks vLLM for per-request acceptance metrics; a
    dynamic one passes its schedule as `num_speculative_tokens_per_batch_size`.
    """
    argv = [python, *VLLM_SERVER, "--model", model, "--host", host, "--port", str(port)]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    for flag, value in profile.args.items():
        argv += _flag(flag, value)
    config = dict(profile.speculative_config or {})
    if profile.speculation_schedule is not None:
        config["num_speculative_tokens_per_batch_size"] = profile.speculation_schedule.as_list()
    if spec_config:
        config.update(spec_config)
    if config:
        argv += ["--speculative-config", json.dumps(resolve_heads(config), sort_keys=True)]
        if PER_REQUEST_METRICS[0] not in (*_flags(profile.args), *extra_args):
            argv += list(PER_REQUEST_METRICS)
    return argv + list(extra_args)


def _flags(args: Mapping[str, Any]) -> list[str]:
    return ["--" + name.replace("_", "-") for name in args]


def split_args(text: str | None) -> list[str]:
    return shlex.split(text) if text else []


def _flag(name: str, value: Any) -> list[str]:
    option = "--" + name.replace("_", "-")
    if value is True:
        return [option]
    if value is False or value is None:
        return []
    return [option, str(value)]
