"""Dynamic launch profiles: the speculation schedule in vLLM's format, and
per-request acceptance metrics on every speculating profile."""

from __future__ import annotations

import json

import pytest

from backends.speculation import ScheduleError, SpeculationSchedule
from backends.vllm import load_profiles, render
from backends.vllm.profiles import PER_REQUEST_METRICS, ProfileError

SCHEDULES = ([[1, 8, 3], [9, 32, 2], [33, 1024, 0]], [[1, 16, 3], [32, 128, 2]], [[1, 1, 5]], [[1, 4, 0], [5, 9, 2]])


@pytest.mark.parametrize("ranges", SCHEDULES)
def test_the_draft_tokens_at_each_batch_size_are_vllms_lookup(ranges):
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    dense = build_dynamic_sd_schedule_lookup(ranges, vllm_max_batch_size=300, vllm_num_speculative_tokens=3)
    schedule = SpeculationSchedule.parse(ranges)
    assert [schedule.tokens_at(batch, 3) for batch in range(1, 301)] == dense[1:]


@pytest.mark.parametrize("ranges", [[], [[2, 8, 3]], [[1, 8, 3], [8, 16, 2]], [[1, 8, -1]], [[1, 8]], "1-8:3",
                                    [[1, 8, 2.5]]])
def test_a_schedule_vllm_refuses_is_refused_with_a_reason(ranges):
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    with pytest.raises(ScheduleError):
        SpeculationSchedule.parse(ranges)
    if isinstance(ranges, list) and not any(isinstance(v, float) for entry in ranges for v in entry):
        with pytest.raises(ValueError):
            validate_and_normalize_dynamic_sd_schedule(ranges)


def test_every_speculating_profile_asks_for_per_request_metrics_and_standard_does_not():
    _, profiles = load_profiles()
    for profile in profiles.values():
        argv = render(profile, model="m", python="python3")
        flagged = argv[argv.index(PER_REQUEST_METRICS[0]) + 1] if PER_REQUEST_METRICS[0] in argv else None
        assert flagged == ("summary" if profile.speculative else None), profile.name
        assert argv.count(PER_REQUEST_METRICS[0]) <= 1


def test_a_flag_given_by_hand_is_not_doubled():
    _, profiles = load_profiles()
    by_hand = ["--per-request-spec-decode-metrics", "detailed"]
    argv = render(profiles["speculative-ngram"], model="m", extra_args=by_hand)
    assert argv.count("--per-request-spec-decode-metrics") == 1 and argv[-1] == "detailed"


def test_a_dynamic_profile_passes_its_schedule_as_vllms_per_batch_size_field():
    _, profiles = load_profiles()
    profile = profiles["dynamic-eagle3"]
    assert profile.kind == "dynamic" and profiles["speculative-eagle3"].kind == "speculative"
    assert profiles["standard"].kind == "standard"
    argv = render(profile, model="m", python="python3")
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 8, 3], [9, 32, 2], [33, 1024, 0]]
    assert config["method"] == "eagle3" and config["num_speculative_tokens"] == 3


def test_vllm_accepts_every_shipped_schedule():
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    _, profiles = load_profiles()
    dynamic = [p for p in profiles.values() if p.kind == "dynamic"]
    assert dynamic
    for profile in dynamic:
        assert profile.speculation_schedule is not None and profile.speculative_config is not None
        build_dynamic_sd_schedule_lookup(profile.speculation_schedule.as_list(), 256,
                                         profile.speculative_config["num_speculative_tokens"])


@pytest.mark.parametrize("spec,reason", [
    ({"speculation_schedule": [[1, 4, 2]]}, "needs a speculative_config"),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2},
      "speculation_schedule": [[1, 4, 3]]}, "more draft tokens"),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2},
      "speculation_schedule": [[3, 4, 2]]}, "start at 1"),
])
def test_a_bad_dynamic_profile_names_the_profile_and_the_fault(spec, reason):
    text = json.dumps({"default_model": "m", "profiles": {"broken": spec}})
    with pytest.raises(ProfileError, match=f"profile broken: .*{reason}"):
        load_profiles(text)
