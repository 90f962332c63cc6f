"""Upstream: pools and their endpoints, the transport, and the exchange with a backend."""
