"""One module per `specgate` subcommand (see gateway/cli.py)."""
