"""The second calibration (a 70B target with a separate 1B draft) and how the
command line picks a calibration and changes its constants."""

from __future__ import annotations

import argparse

import pytest

from backends.sim.model import (
    DEFAULT_PARAMS,
    LARGE_TARGET_PARAMS,
    acceptance,
    speedup,
    step_seconds,
)
from specgate.commands.sim import add_arguments, params_from


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--kind", "speculative", "--port", "1", *argv])


def test_the_default_calibration_is_the_8b_model_unchanged() -> None:
    assert params_from(parsed()) == DEFAULT_PARAMS


def test_a_calibration_is_chosen_and_an_option_given_overrides_it() -> None:
    assert params_from(parsed("--calibration", "70b-4xa100-draft1b")) == LARGE_TARGET_PARAMS
    params = params_from(parsed("--calibration", "70b-4xa100-draft1b", "--num-speculative-tokens", "2"))
    assert params.num_speculative_tokens == 2 and params.weights_read_s == LARGE_TARGET_PARAMS.weights_read_s
    with pytest.raises(SystemExit):
        params_from(parsed("--draft-quality", "0"))


@pytest.mark.parametrize(("domain", "temperature"), [("code", 0.0), ("chat", 0.0), ("chat", 1.0)])
def test_the_large_target_gains_alone_and_loses_in_a_full_batch(domain: str, temperature: float) -> None:
    a = acceptance(domain, temperature, LARGE_TARGET_PARAMS)
    assert speedup(a, 1, LARGE_TARGET_PARAMS) > 1.4
    assert speedup(a, 64, LARGE_TARGET_PARAMS) < 1.0


def crossover(temperature: float, params=DEFAULT_PARAMS) -> int:
    """The smallest batch at which speculation on chat is slower than standard decoding."""
    chat = acceptance("chat", temperature, params)
    return next(b for b in range(1, 300) if speedup(chat, b, params) < 1)


def test_the_large_target_is_slower_per_step_and_crosses_over_at_a_smaller_batch() -> None:
    assert step_seconds("standard", 1, 0, LARGE_TARGET_PARAMS) > 2 * step_seconds("standard", 1)
    assert crossover(0.0, LARGE_TARGET_PARAMS) < crossover(0.0)
    # the dynamic kind's threshold sits between chat's crossovers at T=1 and T=0, as the 8B one does
    threshold = LARGE_TARGET_PARAMS.speculative_max_batch
    assert crossover(1.0, LARGE_TARGET_PARAMS) <= threshold <= crossover(0.0, LARGE_TARGET_PARAMS)
