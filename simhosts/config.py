"""Host configs of the simulated hosts: validation, defaults, service times.

Pure functions shared by the server (:mod:`simhosts.server`) and the parent-side
client (:mod:`simhosts.client`); see :mod:`simhosts` for the config keys.
"""

from __future__ import annotations

import math
from typing import Any

CONTROL_PATHS = (b"/_stats", b"/_reset", b"/_config")
KINDS = ("queue", "ratelimit", "unlimited")
SERVICE_DISTS = ("constant", "lognormal", "bimodal", "heavy_tailed")


def validate_service_dist(name: str, dist: Any) -> dict[str, Any]:
    """Return *dist* with defaults filled in; raise ValueError naming the field."""
    if not isinstance(dist, dict):
        raise ValueError(f"host {name!r}: 'service_dist' must be a dict, not {dist!r}")
    dist = dict(dist)
    kind = dist.setdefault("kind", "constant")
    if kind not in SERVICE_DISTS:
        raise ValueError(
            f"host {name!r}: service_dist 'kind' must be one of {SERVICE_DISTS}, "
            f"not {kind!r}"
        )

    def number(field: str, default: float, low: float, high: float) -> None:
        value = dist.setdefault(field, default)
        if not isinstance(value, int | float) or not low <= float(value) <= high:
            raise ValueError(
                f"host {name!r}: service_dist {kind!r} needs {field!r} in "
                f"[{low}, {high}], not {value!r}"
            )

    if kind == "lognormal":
        number("sigma", 0.6, 0.0, 5.0)
    elif kind == "bimodal":
        number("fast", 0.005, 0.0, 3600.0)
        number("slow", 0.08, 0.0, 3600.0)
        number("fast_share", 0.7, 0.0, 1.0)
    elif kind == "heavy_tailed":
        number("share", 0.05, 0.0, 1.0)
        number("low", 10.0, 0.0, 1e6)
        number("high", 50.0, 0.0, 1e6)
        if dist["high"] < dist["low"]:
            raise ValueError(
                f"host {name!r}: service_dist 'high' ({dist['high']!r}) is below "
                f"'low' ({dist['low']!r})"
            )
    return dist


def draw_service(dist: dict[str, Any], base: float, nominal: float, rng: Any) -> float:
    """One request's service time for a validated *dist* around *base*.

    *nominal* is the host's own ``service_time``: bimodal times scale with
    ``base / nominal`` (a slowdown slows hits and misses alike).
    """
    kind = dist["kind"]
    if kind == "lognormal":
        return base * math.exp(rng.gauss(0.0, dist["sigma"]))
    if kind == "bimodal":
        scale = base / nominal if nominal > 0 else 1.0
        value = dist["fast"] if rng.random() < dist["fast_share"] else dist["slow"]
        return float(value) * scale
    if kind == "heavy_tailed":
        if rng.random() < dist["share"]:
            return base * rng.uniform(dist["low"], dist["high"])
        return base
    return base


def validate_host_config(config: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of one host's config with defaults filled in.

    Raises :class:`ValueError` naming the host and the field on a bad value, so
    that a broken test or benchmark config fails before the server starts.
    """
    host = dict(config)
    name = host.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"host config needs a non-empty 'name': {config!r}")
    kind = host.get("kind")
    if kind not in KINDS:
        raise ValueError(f"host {name!r}: 'kind' must be one of {KINDS}, not {kind!r}")
    host.setdefault("service_time", 0.0)
    host.setdefault("retry_after", 1)
    host.setdefault("port", 0)
    if float(host["service_time"]) < 0:
        raise ValueError(f"host {name!r}: negative service_time")
    if kind == "queue":
        host.setdefault("queue_size", 16)
        host.setdefault("schedule", [])
        if int(host.get("workers", 0)) < 1:
            raise ValueError(f"host {name!r}: kind 'queue' needs 'workers' >= 1")
        host["service_dist"] = validate_service_dist(
            name, host.get("service_dist", {"kind": "constant"})
        )
        host.setdefault("seed", 1)
        for entry in host["schedule"]:
            if len(entry) != 3:
                raise ValueError(
                    f"host {name!r}: schedule entries are [t_start, t_end, "
                    f"service_time], not {entry!r}"
                )
    elif kind == "ratelimit" and float(host.get("rate", 0)) <= 0:
        raise ValueError(f"host {name!r}: kind 'ratelimit' needs 'rate' > 0")
    return host


def load_config(data: Any) -> list[dict[str, Any]]:
    """Accept a list of host configs or ``{"hosts": [...]}``; validate them."""
    hosts = data["hosts"] if isinstance(data, dict) else data
    if not isinstance(hosts, list) or not hosts:
        raise ValueError("config must be a non-empty list of hosts")
    validated = [validate_host_config(host) for host in hosts]
    names = [host["name"] for host in validated]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate host names in {names}")
    return validated
