"""The gateway: an OpenAI-compatible proxy that routes each request to a
speculative-decoding pool or a standard pool, following a YAML policy.

Stages, each importing only the ones below it: `edge` -> `control`, `upstream`
-> `decide` -> the shared base (errors, metrics, settings, flags, logs)."""
