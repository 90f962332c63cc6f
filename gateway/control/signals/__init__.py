"""Where the guard's numbers come from: Prometheus or the backends' /metrics."""

from gateway.control.signals.model import DIALECTS, PoolSignals, SignalError, Target, address, finite, settle
from gateway.control.signals.prometheus import PrometheusSource
from gateway.control.signals.prometheus_api import PrometheusClient
from gateway.control.signals.scrape import ScrapeSource

__all__ = ["DIALECTS", "PoolSignals", "PrometheusClient", "PrometheusSource", "ScrapeSource", "SignalError", "Target",
           "address", "finite", "settle"]
