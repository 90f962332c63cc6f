"""Operator tools: load measurement (`specgate bench`) and baselines."""
