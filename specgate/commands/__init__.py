"""One module per `specgate` subcommand (see specgate/cli.py)."""
