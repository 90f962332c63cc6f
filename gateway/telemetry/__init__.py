"""OpenTelemetry traces: one span per request (docs/tracing.md). `spans` is what the
path calls, a no-op while tracing is off; only `otlp` imports OpenTelemetry."""
