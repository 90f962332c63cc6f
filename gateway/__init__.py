"""specgate: an OpenAI-compatible gateway that routes each request to a
speculative-decoding pool or a standard pool, following a YAML policy."""

__version__ = "0.1.0"
