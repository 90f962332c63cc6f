"""The pool simulator: a fake vLLM whose timing follows a model of speculative
and standard decoding at GPU scale (see `backends.sim.model` and docs/sim.md)."""
