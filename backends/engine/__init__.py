"""The bundled speculative engine: a Hugging Face causal LM on torch, drafting
token trees (prompt lookup or a draft model) and verifying each tree in one
target forward pass with the tree-verify kernels (`backends.kernels`)."""
