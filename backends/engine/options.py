"""The bundled engine's options that its command line and its code share: the drafter
spec and the drain on SIGTERM. No torch here, so the command line parses without it."""

from __future__ import annotations

import argparse

from backends.speculation import ScheduleError, SpeculationSchedule

MAX_NUM_SEQS = 8  # requests decoded at once, taking turns; more wait in the engine's queue
DRAIN_S = 10  # on SIGTERM, requests in flight get this long; then the server exits (within up's and compose's grace)


def positive_int(text: str) -> int:
    value = int(text) if text.isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


DRAFTER_CHOICES = "'ngram', 'model:PATH', 'eagle3' or 'eagle3:PATH'"


def drafter_spec(text: str) -> str:
    """Checked before the model loads, so a typo costs no wait."""
    kind, _, path = text.partition(":")
    if text in ("ngram", "eagle3") or (kind in ("model", "eagle3") and path):
        return text
    raise argparse.ArgumentTypeError(f"unknown drafter {text!r}: use {DRAFTER_CHOICES}")


def schedule_arg(text: str) -> SpeculationSchedule:
    """`--speculation-schedule`, checked as vLLM checks it before the model loads."""
    try:
        return SpeculationSchedule.from_json(text)
    except ScheduleError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
