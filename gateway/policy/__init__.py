"""The routing policy: its schema, loading and validation, and the vocabulary
every stage reads (pool kinds, traffic classes, priors)."""
