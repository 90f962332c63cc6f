"""Bundled backends: vLLM launch profiles, the pool simulator, the tree-verify
kernels and the engine that runs them."""
