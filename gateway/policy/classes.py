"""Traffic classes: a request's domain and its temperature band, written `domain/band`.

The one place a class is computed. The bands are fixed, by how a draft's
acceptance behaves: greedy decoding accepts most, acceptance falls with the
temperature, and above 1.0 it collapses (the speculative-decoding playbook's
decision matrix).
"""

from __future__ import annotations

from collections.abc import Collection

TEMPERATURE_BANDS = ((0.0, "greedy"), (0.5, "low"), (1.0, "mid"))  # upper bound (inclusive), name
HOT = "hot"
BANDS = (*(name for _, name in TEMPERATURE_BANDS), HOT)


def temperature_band(temperature: float) -> str:
    for bound, name in TEMPERATURE_BANDS:
        if temperature <= bound:
            return name
    return HOT


def traffic_class(domain: str, temperature: float, domains: Collection[str] | None = None,
                  default_domain: str = "chat") -> str:
    """`domain/band`. With `domains` given, a domain outside them (an
    x-specgate-domain header's) counts as `default_domain`."""
    if domains is not None and domain not in domains:
        domain = default_domain
    return f"{domain}/{temperature_band(temperature)}"


def split_class(cls: str) -> tuple[str, str]:
    """(domain, band) of a class; a class without a band is read as greedy."""
    domain, _, band = cls.rpartition("/")
    return (domain, band) if domain else (cls, BANDS[0])
