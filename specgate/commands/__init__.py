"""Every `specgate` subcommand, one module each: its argparse wiring and its `run`.

A command module defines `add_arguments(parser)` and `run(args) -> int`; what
the command does lives below it (in `gateway`, `backends`, `specgate.ops`,
`specgate.draft`, `specgate.up`, `specgate.replicas`, `specgate.workers`), and nothing there imports
a command module. Heavy libraries (torch, vLLM, uvicorn) are imported inside
`run`, so building the parser stays instant (`tests/unit/ops/test_cli_imports.py`).

To add a command: a module here, and its row below.
"""

from __future__ import annotations

# (name, module, one-line help), in the order `specgate --help` lists them
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("serve", "specgate.commands.serve", "run the gateway"),
    ("compile", "specgate.commands.compile", "compile the request path with mypyc (serve uses it when fresh)"),
    ("check", "specgate.commands.check", "validate a policy file"),
    ("explain", "specgate.commands.explain", "print the routing decision for a request"),
    ("sim", "specgate.commands.sim", "run a simulated vLLM pool (speculative or standard)"),
    ("engine", "specgate.commands.engine", "run the bundled speculative engine (OpenAI API, vLLM metrics)"),
    ("bench", "specgate.commands.bench", "benchmark OpenAI-compatible URLs (TTFT, TPOT, E2E, throughput)"),
    ("baseline", "specgate.commands.baseline", "record the latency baseline the guard compares against"),
    ("report", "specgate.commands.report", "weekly operations report from Prometheus (acceptance, speedup, fallbacks)"),
    ("plan", "specgate.commands.plan", "recommend how many speculative, standard and dynamic replicas to run"),
    ("tune", "specgate.commands.tune", "sweep a speculative profile's draft length and recommend the fastest"),
    ("up", "specgate.commands.up", "start the bundled backends and the gateway on this machine"),
    ("model", "specgate.commands.model", "prepare the packaged SmolLM2 model for vLLM"),
    ("check-draft", "specgate.commands.check_draft", "check that a draft model's tokenizer matches the target's"),
    ("draft", "specgate.commands.draft", "build a draft head from captured traffic: capture, data, train"),
)
