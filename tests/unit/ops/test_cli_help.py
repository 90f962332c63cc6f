"""`specgate COMMAND --help` opens with what the command does, in whole sentences."""

from __future__ import annotations

import importlib

import pytest

from specgate.cli import build_parser, summary
from specgate.commands import COMMANDS


def test_a_summary_is_the_first_paragraph_on_one_line():
    doc = """Compile the request path (optional: serve uses
    the build while it is fresh).

    More that --help leaves out."""
    assert summary(doc) == "Compile the request path (optional: serve uses the build while it is fresh)."


@pytest.mark.parametrize("name, module_name", [(name, module) for name, module, _ in COMMANDS])
def test_every_command_says_what_it_does_in_a_whole_sentence(name, module_name):
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[name]  # where argparse keeps them
    opening = summary(sub.description)  # a command may give --help its whole docstring (plan does)
    assert opening == summary(importlib.import_module(module_name).__doc__)
    assert opening.endswith(".")
    assert opening.count("(") == opening.count(")")
