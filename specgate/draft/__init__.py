"""From captured prompts to a draft head for the served model (`specgate draft`, whose
subcommands are in `specgate.commands.draft`).

capture: export the prompts the gateway captured; data: let the target answer
them and tokenize the conversations with their loss masks; train: fit a head.
"""
