"""Prompt domains: the rule-based classifier both the gateway and the simulator use."""
