"""Prometheus's HTTP query API (`/api/v1/query`, `/api/v1/query_range`): the one
client the guard's Prometheus source and the operations report both read through."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import httpx

from gateway.control.signals.model import SignalError, finite

Row = tuple[Mapping[str, str], float]  # one series of an instant query: (labels, value)
RangeRow = tuple[Mapping[str, str], list[float]]  # one series of a range query: (labels, values)
Parsed = TypeVar("Parsed")


class PrometheusClient:
    """Prometheus's HTTP query API: instant and range queries. Samples that are
    not finite numbers (NaN, +Inf, -Inf: a 0/0 or x/0 in PromQL) are dropped, as
    if the series had no sample; any failure to get an answer is a SignalError."""

    def __init__(self, url: str, client: httpx.AsyncClient | None = None, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.client = client or httpx.AsyncClient(trust_env=False)
        self.timeout_s = timeout_s  # per request

    async def aclose(self) -> None:
        await self.client.aclose()

    async def query(self, promql: str, at: float | None = None) -> list[Row]:
        """An instant query (at Unix time `at`, else the server's now): (labels, value)
        per series; a scalar answers one unlabelled row."""
        params = {"query": promql} if at is None else {"query": promql, "time": f"{at:.3f}"}
        return await self._answer("/api/v1/query", params, _rows)

    async def query_range(self, promql: str, start: float, end: float, step_s: float) -> list[RangeRow]:
        """A range query from `start` to `end` (Unix times) every `step_s`: each series' values."""
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:.3f}"}
        return await self._answer("/api/v1/query_range", params, _range_rows)

    async def _answer(self, path: str, params: Mapping[str, str],
                      parse: Callable[[Mapping[str, Any]], Parsed]) -> Parsed:
        promql = params["query"]
        try:
            response = await self.client.get(self.url + path, params=params, timeout=self.timeout_s)
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise SignalError(f"prometheus at {self.url} unreachable: {type(exc).__name__}") from None
        if not isinstance(body, dict):
            raise SignalError(f"prometheus answered {type(body).__name__}, not an object: {promql}")
        if response.status_code != 200 or body.get("status") != "success":
            raise SignalError(f"prometheus query failed ({response.status_code}): "
                              f"{body.get('error', 'no error text')}: {promql}")
        try:
            return parse(body["data"])
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise SignalError(f"prometheus answered a malformed result ({type(exc).__name__}: {exc}): "
                              f"{promql}") from None


def _rows(data: Mapping[str, Any]) -> list[Row]:
    answer = [{"value": data["result"]}] if data.get("resultType") == "scalar" else data.get("result") or []
    rows: list[Row] = []
    for one in answer:
        value = finite(float(one["value"][1]))
        if value is not None:
            rows.append((_labels(one), value))
    return rows


def _range_rows(data: Mapping[str, Any]) -> list[RangeRow]:
    rows: list[RangeRow] = []
    for one in data["result"]:
        values = [value for _, sample in one["values"] if (value := finite(float(sample))) is not None]
        rows.append((_labels(one), values))
    return rows


def _labels(one: Mapping[str, Any]) -> Mapping[str, str]:
    return {str(k): str(v) for k, v in (one.get("metric") or {}).items()}
