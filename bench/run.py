"""Benchmark runner: ``python -m bench.run [--scenario NAME] [--quick] ...``.

Reproduces the scenario of the guide "Adapting Crawl Rate to Host Latency"
(``shared/reference/000_*``) for the figures of SPEC.md section 4: simulated
hosts (:mod:`simhosts`) crawled by Scrapy under several configurations,
each compared with the host's capacity as actually measured on this machine by
a raw client (the ``probe`` configuration, :mod:`bench.probe`): with 2 cores
shared by the server and the crawler, the nominal capacity (workers / service
time) is not reachable, so ratios are taken to the probed one.

Every configuration run gets a fresh server and a fresh crawl process
(:mod:`bench.crawl`), and runs alone: on 2 cores, parallel runs would measure
each other. A run whose crawl fails (e.g. the plugin is half-written) is
reported as ``FAILED: <last lines of stderr>`` and the benchmark goes on;
requests that end in errors (lost pages) are listed under the table.

Scenarios (``--scenario``, default ``all``): ``two-hosts`` (A = 8 workers x
20 ms and B = 2 x 50 ms, queue 16, 503 + Retry-After: 1 when full; 2000 + 300
pages), ``slowdown`` (A at 80 ms during host-seconds 3-6; throughput during
the slowdown over the capacity probed at 80 ms, and the time after t=6 until a
0.25 s bucket is back to 0.9 of full capacity), ``slowdown-small`` (a 2-worker
noisy host four times slower from host-second 5 on, for good; throughput
during [10, 30) over the capacity probed at 400 ms), ``unthrottled`` (a fast
unlimited host, plain Scrapy vs the plugin at CONCURRENT_REQUESTS=16 and
CONCURRENT_REQUESTS_PER_DOMAIN=16), ``ratelimit`` (429 + Retry-After past 50
requests/s; 429s per 2 s window; ``bench/ratelimit.py`` runs longer crawls of
such an API), ``many-hosts`` (200 queue hosts of mixed capacities, 50 pages
each, CONCURRENT_REQUESTS 64: every configuration as one row, over plain
Scrapy's pages/s in the same repeat, with the crawl's CPU time per page),
and the noisy hosts ``noisy-lognormal-0.3``, ``-0.6``, ``-1.0``,
``noisy-bimodal`` and ``noisy-heavy-tailed`` (host A's workers with a random
service time). ``--scenario`` takes several, comma-separated.

Choices worth knowing:

* every crawl is capped in time (CLOSESPIDER_TIMEOUT: ``max_seconds``, or
  ``quick_max_seconds`` with ``--quick``); a capped run reports pages/s over
  the pages it fetched, and says so under the table;
* ``autothrottle`` uses Scrapy's defaults except AUTOTHROTTLE_START_DELAY =
  0.05 s (the default 5 s would take most of a short run to converge);
* without the plugin, each host gets its own Scrapy download slot
  (``download_slot`` = host:port), as distinct sites would: Scrapy keys slots
  by hostname and all simulated hosts are 127.0.0.1;
* fixed limits go through the plugin, since Scrapy 2.19 on the asyncio
  reactor does not enforce CONCURRENT_REQUESTS_PER_DOMAIN.

Output: one table per scenario on stdout (progress on stderr),
``<out>/results-<scenario>.json`` (every run, with timelines and the servers'
records) and ``<out>/<scenario>.png`` (per host: concurrency limit and pages/s
over host-time, one line per configuration). Rows are named by what they are
("AutoThrottle (Scrapy default)", "this plugin (add-on defaults)"); a verdict
line per scenario sets this plugin against the fastest other configuration of
the same run that drew no more 503/429s. This plugin's own crawls also write
their ``THROTTLING_TIMELINE_FILE`` (``<out>/timeline-<scenario>-<config>.jsonl``),
drawn by ``python -m scrapy_adaptive_throttle.plot`` as ``.png`` beside it,
as a user would chart their own crawl.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import scrapy
import twisted

from bench.crawl import run_in_subprocess
from bench.probe import probe_async
from simhosts import SimHosts

OUT_DIR = Path(__file__).resolve().parent / "out"
PROJECT_ROOT = Path(__file__).resolve().parent.parent

BUCKET_SECONDS = 0.25
SETTLED_FRACTION = 0.3  # settled limit: median over the last 30% of a host's crawl
PROBE_SECONDS = 2.5  # how long each probe runs (1.5 s with --quick)
PROBE_UNLIMITED_CONCURRENCY = 32

# --------------------------------------------------------------------------
# Configurations: Scrapy settings over bench.crawl.CRAWL_BASE_SETTINGS.
# --------------------------------------------------------------------------

ADDON = {"scrapy_adaptive_throttle.Addon": 500}
PLAIN_SCOPE_MANAGER = "scrapy_adaptive_throttle.ThrottlingScopeManager"
LATENCY_SCOPE_MANAGER = "scrapy_adaptive_throttle.LatencyScopeManager"

Settings = dict[str, Any]
# A configuration is its settings, or a function of the hosts' netlocs
# ({name: "127.0.0.1:PORT"}) for settings that name scopes.
ConfigSpec = Settings | Callable[[dict[str, str]], Settings]


def _fixed(limit: int) -> Settings:
    return {
        "ADDONS": ADDON,
        "THROTTLING_SCOPE_MANAGER": PLAIN_SCOPE_MANAGER,
        "CONCURRENT_REQUESTS_PER_DOMAIN": limit,
    }


def _latency(tolerance: float) -> Settings:
    return {
        "ADDONS": ADDON,
        "THROTTLING_SCOPE_MANAGER": LATENCY_SCOPE_MANAGER,
        "THROTTLING_LATENCY_TOLERANCE": tolerance,
        # The ceiling the adaptive limit may grow to.
        "CONCURRENT_REQUESTS_PER_DOMAIN": 64,
    }


def _rampup(netlocs: dict[str, str]) -> Settings:
    return {
        "ADDONS": ADDON,
        "THROTTLING_SCOPES": {netloc: {"rampup": True} for netloc in netlocs.values()},
        "BACKOFF_WINDOW": 2.0,
    }


def _autothrottle(target: float) -> Settings:
    return {
        "AUTOTHROTTLE_ENABLED": True,
        "AUTOTHROTTLE_START_DELAY": 0.05,
        "AUTOTHROTTLE_TARGET_CONCURRENCY": target,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 32,
    }


CONFIGS: dict[str, ConfigSpec] = {
    # Fixed limits go through the plugin: Scrapy 2.19 on the asyncio reactor
    # does not enforce CONCURRENT_REQUESTS_PER_DOMAIN (its download slots let
    # every queued request through at once).
    "fixed-2": _fixed(2),
    "fixed-32": _fixed(32),
    # Not in any scenario's list: a fixed limit near host A's best, to show
    # what Scrapy itself reaches (--configs probe,fixed-16,latency-1.5).
    "fixed-16": _fixed(16),
    "fixed-8": _fixed(8),
    # Scrapy's AutoThrottle with its defaults (target concurrency 1.0), except
    # the start delay: the default 5 s would spend most of a short benchmark
    # converging; 0.05 s (host B's service time) starts polite without a burst.
    "autothrottle": {
        "AUTOTHROTTLE_ENABLED": True,
        "AUTOTHROTTLE_START_DELAY": 0.05,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 32,
    },
    # The add-on and the plain scope manager as in issue 9's noisy hosts.
    "addon-32": {"ADDONS": ADDON, "CONCURRENT_REQUESTS_PER_DOMAIN": 32},
    "plain-scope-manager-32": {
        "ADDONS": ADDON,
        "THROTTLING_SCOPE_MANAGER": PLAIN_SCOPE_MANAGER,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 32,
    },
    "autothrottle-1": _autothrottle(1.0),
    "autothrottle-8": _autothrottle(8.0),
    "plain-scope-manager": {
        "ADDONS": ADDON,
        "THROTTLING_SCOPE_MANAGER": PLAIN_SCOPE_MANAGER,
    },
    # The add-on with its defaults: LatencyScopeManager, whose ceiling is the
    # scenario's CONCURRENT_REQUESTS_PER_DOMAIN.
    "addon-default": {"ADDONS": ADDON},
    "latency-1.5": _latency(1.5),
    "latency-2.0": _latency(2.0),
    "plain-scrapy": {},
    "rampup": _rampup,
    "probe": {},  # not a crawl: see run_probe()
}


#: What each configuration is, as the tables name it: a reader of the demo
#: should not have to know the configuration names.
CONFIG_LABELS: dict[str, str] = {
    "probe": "capacity (raw client)",
    "plain-scrapy": "plain Scrapy (no plugin)",
    "autothrottle": "AutoThrottle (Scrapy default)",
    "plain-scope-manager": "plugin, fixed scope limit",
    "addon-default": "this plugin (add-on defaults)",
    "addon-32": "this plugin (add-on defaults)",
    "plain-scope-manager-32": "plugin, fixed scope limit 32",
    "rampup": "this plugin, rampup",
}

#: The configurations that are this plugin's answer in a scenario, in order of
#: preference: the verdict line compares the first one present with the best
#: other configuration of the same run.
OURS = ("addon-default", "addon-32", "latency-1.5", "rampup")


def config_label(name: str) -> str:
    """A configuration's name as a reader says it (``fixed-2``: "fixed limit 2")."""
    if name in CONFIG_LABELS:
        return CONFIG_LABELS[name]
    kind, _, value = name.rpartition("-")
    if kind == "fixed":
        return f"fixed limit {value} (plugin)"
    if kind == "autothrottle":
        return f"AutoThrottle target {value}"
    if kind == "latency":
        return f"this plugin, tolerance {value}"
    return name


#: Scrapy settings given with ``--set NAME=VALUE``, applied over every crawl's.
EXTRA_SETTINGS: Settings = {}

#: Where this plugin's own configurations (:data:`OURS`) write their
#: THROTTLING_TIMELINE_FILE, to be drawn by ``scrapy_adaptive_throttle.plot``
#: as a user would draw their own crawl (None: no timeline).
TIMELINE_DIR: Path | None = None
#: Seconds between timeline samples: the benchmark crawls last seconds.
TIMELINE_INTERVAL = 0.25


def uses_plugin(settings: Settings) -> bool:
    return any(
        "scrapy_adaptive_throttle" in str(key) for key in settings.get("ADDONS", {})
    )


# --------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------

HOST_A = {
    "name": "A",
    "kind": "queue",
    "workers": 8,
    "service_time": 0.02,
    "queue_size": 16,
}
HOST_B = {
    "name": "B",
    "kind": "queue",
    "workers": 2,
    "service_time": 0.05,
    "queue_size": 16,
}

#: A small noisy host that gets four times slower for good (``slowdown-small``):
#: the adaptive limit reaches its floor of 1 before it takes the slower host
#: as its baseline.
SLOW_SMALL = {
    "name": "S",
    "kind": "queue",
    "workers": 2,
    "service_time": 0.1,
    "queue_size": 16,
    "service_dist": {"kind": "lognormal", "sigma": 0.6},
    "schedule": [[5.0, 100000.0, 0.4]],
}


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    hosts: list[dict[str, Any]]
    pages: dict[str, int]
    quick_pages: dict[str, int]
    configs: list[str]
    #: configurations of --quick runs (default: the same as ``configs``)
    quick_configs: list[str] | None = None
    #: Settings over every configuration's, e.g. the latency window.
    settings: Settings = field(default_factory=dict)
    #: Each crawl is closed after this long (CLOSESPIDER_TIMEOUT): a safety cap
    #: for slow configurations, and the scenario length for time-based ones.
    max_seconds: float = 120.0
    quick_max_seconds: float = 8.0
    #: Extra capacities to probe: label -> host config (probed alone).
    probe_variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: What the "ratio" column divides by: "capacity" or a configuration name.
    ratio_to: str = "capacity"
    #: Host-time interval of a slowdown, and the probe label of the capacity
    #: during it: adds the throughput during it and the recovery time after.
    slowdown: tuple[float, float] | None = None
    slowdown_capacity: str | None = None
    #: Count 429 answers per window of this many seconds (rate-limit scenario).
    count_429_window: float | None = None
    #: Printed under the table.
    note: str = ""
    #: Settings under every configuration's (a configuration's own win),
    #: e.g. a CONCURRENT_REQUESTS_PER_DOMAIN that fixed limits replace.
    base_settings: Settings = field(default_factory=dict)
    #: One row (host "all") for all the hosts together instead of one per
    #: host: pages/s from the first request to the last page of any host.
    aggregate: bool = False
    #: Seconds between samples of each scope's state in the crawl process.
    #: Sampling costs the crawler CPU time (only with the plugin, which has
    #: a state to sample): many hosts need a longer interval.
    sample_interval: float = 0.1


def many_hosts(count: int, seed: int = 9) -> list[dict[str, Any]]:
    """*count* queue hosts of mixed capacities: 1-8 workers, 10-100 ms."""
    import random

    rng = random.Random(seed)
    return [
        {
            "name": f"H{index:03d}",
            "kind": "queue",
            "workers": rng.randint(1, 8),
            "service_time": round(rng.uniform(0.01, 0.1), 3),
            "queue_size": 16,
        }
        for index in range(count)
    ]


MANY_HOSTS = many_hosts(200)


#: The noisy hosts of issue 9: host A's 8 workers, median 20 ms, queue 16,
#: with a random service time; crawled as a new user would (add-on
#: defaults, CONCURRENT_REQUESTS_PER_DOMAIN 32, CONCURRENT_REQUESTS 64).
NOISY_CONFIGS = [
    "probe",
    "fixed-2",
    "fixed-8",
    "autothrottle-1",
    "autothrottle-8",
    "plain-scope-manager-32",
    "addon-32",
]
NOISY_DISTS: dict[str, dict[str, Any]] = {
    "noisy-lognormal-0.3": {"kind": "lognormal", "sigma": 0.3},
    "noisy-lognormal-0.6": {"kind": "lognormal", "sigma": 0.6},
    "noisy-lognormal-1.0": {"kind": "lognormal", "sigma": 1.0},
    "noisy-bimodal": {
        "kind": "bimodal",
        "fast": 0.005,
        "slow": 0.08,
        "fast_share": 0.7,
    },
    "noisy-heavy-tailed": {"kind": "heavy_tailed", "share": 0.05},
}


def _noisy_scenario(name: str, dist: dict[str, Any]) -> Scenario:
    return Scenario(
        name=name,
        description=f"8 workers, service time {dist}, queue 16",
        hosts=[{**HOST_A, "service_dist": dist}],
        pages={"A": 2000},
        quick_pages={"A": 600},
        configs=NOISY_CONFIGS,
        # Each configuration sets CONCURRENT_REQUESTS_PER_DOMAIN (32, or its
        # fixed limit).
        settings={"CONCURRENT_REQUESTS": 64},
        max_seconds=40.0,
        quick_max_seconds=10.0,
    )


def slower_host(host: dict[str, Any], factor: float) -> dict[str, Any]:
    """*host* with every service time multiplied by *factor*: the base time,
    a bimodal host's hit and miss times and a schedule's slow times (a
    lognormal or heavy-tailed spread is relative to the base already)."""
    scaled = {**host}
    if "service_time" in scaled:
        scaled["service_time"] = scaled["service_time"] * factor
    if "schedule" in scaled:
        scaled["schedule"] = [
            [start, end, service * factor] for start, end, service in scaled["schedule"]
        ]
    dist = scaled.get("service_dist")
    if dist is not None and dist.get("kind") == "bimodal":
        scaled["service_dist"] = {
            **dist,
            "fast": dist["fast"] * factor,
            "slow": dist["slow"] * factor,
        }
    return scaled


def slower_scenario(scenario: Scenario, factor: float) -> Scenario:
    """*scenario* on hosts *factor* times slower (``--slower``): the same
    noise and queues at 1/*factor* of the capacity, so that the crawler's own
    CPU is not what bounds pages/s; its crawls may last *factor* times longer."""
    if factor == 1:
        return scenario
    return replace(
        scenario,
        description=f"{scenario.description}; service times x{factor:g}",
        hosts=[slower_host(host, factor) for host in scenario.hosts],
        probe_variants={
            label: slower_host(host, factor)
            for label, host in scenario.probe_variants.items()
        },
        max_seconds=scenario.max_seconds * factor,
        quick_max_seconds=scenario.quick_max_seconds * factor,
    )


SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in [
        Scenario(
            name="two-hosts",
            description="A (8 workers x 20 ms) and B (2 x 50 ms) crawled together",
            hosts=[HOST_A, HOST_B],
            pages={"A": 2000, "B": 300},
            quick_pages={"A": 600, "B": 100},
            configs=[
                "probe",
                "fixed-2",
                "fixed-32",
                "autothrottle",
                "plain-scope-manager",
                "latency-1.5",
                "latency-2.0",
            ],
        ),
        Scenario(
            name="slowdown",
            description="A slows from 20 to 80 ms per page for host-seconds 3-6",
            hosts=[{**HOST_A, "schedule": [[3.0, 6.0, 0.08]]}],
            # ~12 s at capacity: 3 s x 400 + 3 s x 100 + 6 s x 400.
            pages={"A": 3900},
            quick_pages={"A": 2600},
            configs=["probe", "fixed-32", "autothrottle", "latency-1.5", "latency-2.0"],
            quick_configs=["probe", "fixed-32", "latency-1.5"],
            # A short window, as in the guide, so the baseline can follow the
            # slowdown within the 3-second episode.
            settings={"THROTTLING_LATENCY_WINDOW": 1.0},
            max_seconds=20.0,
            quick_max_seconds=10.0,
            probe_variants={"A@80ms": {**HOST_A, "service_time": 0.08}},
            slowdown=(3.0, 6.0),
            slowdown_capacity="A@80ms",
        ),
        Scenario(
            name="slowdown-small",
            description=(
                "S (2 workers, lognormal 0.6 around 100 ms) slows to 400 ms from"
                " host-second 5 on, for good"
            ),
            hosts=[SLOW_SMALL],
            # More than any configuration fetches in 30 s: the run is the time.
            pages={"S": 2000},
            quick_pages={"S": 2000},
            # No AutoThrottle by default: its crawl of this host lasted 116 s
            # in all against the 30-s cap (2026-12-05), past the runner's 90-s
            # hard timeout; run it with --configs autothrottle --timeout 600.
            configs=["probe", "fixed-2", "addon-32"],
            quick_configs=["probe", "fixed-2", "addon-32"],
            max_seconds=30.0,
            quick_max_seconds=30.0,
            probe_variants={
                "S@400ms": {**SLOW_SMALL, "service_time": 0.4, "schedule": []}
            },
            # From 5 s past the change to the end: what the limit holds once it
            # has had time to see the slower host.
            slowdown=(10.0, 30.0),
            slowdown_capacity="S@400ms",
            note=(
                "The slowdown does not end: 'back to 0.9 of full capacity' is"
                " never expected here; the figure is the rate during [10, 30)."
            ),
        ),
        Scenario(
            name="unthrottled",
            description="one fast unlimited host: plugin overhead at equal concurrency",
            hosts=[{"name": "U", "kind": "unlimited", "service_time": 0.001}],
            pages={"U": 3000},
            quick_pages={"U": 1000},
            configs=["probe", "plain-scrapy", "plain-scope-manager", "addon-default"],
            quick_configs=[
                "probe",
                "plain-scrapy",
                "plain-scope-manager",
                "addon-default",
            ],
            settings={"CONCURRENT_REQUESTS": 16, "CONCURRENT_REQUESTS_PER_DOMAIN": 16},
            ratio_to="plain-scrapy",
        ),
        Scenario(
            name="ratelimit",
            description="an API answering 429 + Retry-After past 50 requests/s",
            hosts=[
                {
                    "name": "R",
                    "kind": "ratelimit",
                    "rate": 50,
                    "service_time": 0.01,
                    "retry_after": 1,
                }
            ],
            pages={"R": 600},
            quick_pages={"R": 200},
            configs=["fixed-2", "fixed-32", "autothrottle", "rampup"],
            quick_configs=["fixed-2", "fixed-32", "autothrottle", "rampup"],
            max_seconds=60.0,
            quick_max_seconds=8.0,
            # The rampup configuration's BACKOFF_WINDOW.
            count_429_window=2.0,
            note="NB: a sliding 1-s window admits a burst of N at the start, so "
            "short runs can exceed N pages/s (by up to N/duration).",
        ),
        *(_noisy_scenario(name, dist) for name, dist in NOISY_DISTS.items()),
        Scenario(
            name="many-hosts",
            description="200 hosts (1-8 workers, 10-100 ms, 50 pages each), "
            "CONCURRENT_REQUESTS 64",
            hosts=MANY_HOSTS,
            pages={host["name"]: 50 for host in MANY_HOSTS},
            quick_pages={host["name"]: 20 for host in MANY_HOSTS},
            configs=[
                "plain-scrapy",
                "fixed-2",
                "fixed-8",
                "autothrottle",
                "autothrottle-8",
                "plain-scope-manager",
                "addon-default",
            ],
            base_settings={
                "CONCURRENT_REQUESTS": 64,
                "CONCURRENT_REQUESTS_PER_DOMAIN": 32,
            },
            ratio_to="plain-scrapy",
            aggregate=True,
            # 200 scopes sampled every 0.1 s would cost the plugin's crawls
            # a few percent of CPU that plain Scrapy does not pay.
            sample_interval=2.0,
            max_seconds=90.0,
            quick_max_seconds=30.0,
        ),
    ]
}


# --------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------


def nominal_capacity(host: dict[str, Any]) -> float | None:
    if host["kind"] == "queue":
        return float(host["workers"]) / float(host["service_time"])
    if host["kind"] == "ratelimit":
        return float(host["rate"])
    return None


def throughput_series(
    epochs: list[float], t0: float, bucket: float = BUCKET_SECONDS
) -> list[list[float]]:
    """Pages/s per ``bucket``-second bucket, as ``[bucket_start, rate]``."""
    if not epochs:
        return []
    counts: dict[int, int] = {}
    for epoch in epochs:
        index = int((epoch - t0) // bucket)
        counts[index] = counts.get(index, 0) + 1
    first, last = min(counts), max(counts)
    return [
        [round(index * bucket, 3), counts.get(index, 0) / bucket]
        for index in range(first, last + 1)
    ]


def settled_limit(
    samples: list[dict[str, Any]], start: float | None, end: float | None
) -> float | None:
    """Median limit over the last 30% of the host's crawl (epoch times)."""
    if not samples or start is None or end is None or end <= start:
        return None
    since = end - SETTLED_FRACTION * (end - start)
    limits = [
        s["limit"]
        for s in samples
        if since <= s["t"] <= end and isinstance(s.get("limit"), int | float)
    ]
    return statistics.median(limits) if limits else None


def recovery_seconds(
    series: list[list[float]], full_capacity: float, after: float
) -> float | None:
    """Seconds after ``after`` until a bucket reaches 0.9 of full capacity.

    The last bucket is left out: the crawl ends inside it, so it is partial.
    """
    for start, rate in series[:-1]:
        if start >= after and rate >= 0.9 * full_capacity:
            return round(start + BUCKET_SECONDS - after, 3)
    return None


def windowed_counts(arrivals: list[list[Any]], status: int, window: float) -> list[int]:
    """Number of ``status`` answers per ``window`` seconds of host-time."""
    if not arrivals:
        return []
    last = max(arrival[0] for arrival in arrivals)
    counts = [0] * (int(last // window) + 1)
    for arrival in arrivals:
        if arrival[3] == status:
            counts[int(arrival[0] // window)] += 1
    return counts


# --------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------


def run_probe(scenario: Scenario, quick: bool) -> dict[str, Any]:
    """Measure each host's reachable capacity with the raw client.

    The scenario's hosts are probed together, as they are crawled together
    (they share the CPU); variants (e.g. A at 80 ms) are probed alone.
    """
    seconds = 1.5 if quick else PROBE_SECONDS
    base_hosts = [
        {key: value for key, value in host.items() if key != "schedule"}
        for host in scenario.hosts
    ]
    variants = [
        {**host, "name": label} for label, host in scenario.probe_variants.items()
    ]
    results: dict[str, Any] = {}
    started = time.time()
    with SimHosts(base_hosts + variants) as hosts:

        def plan(host: dict[str, Any]) -> tuple[int, int] | None:
            capacity = nominal_capacity(host)
            if host["kind"] == "queue":
                assert capacity is not None
                return int(host["workers"]), max(50, int(capacity * seconds))
            if host["kind"] == "unlimited":
                pages = (scenario.quick_pages if quick else scenario.pages)[
                    host["name"]
                ]
                return PROBE_UNLIMITED_CONCURRENCY, pages
            return None  # a rate limit's capacity is its rate: nothing to probe

        def probe_group(group: list[dict[str, Any]]) -> None:
            planned = [(host, plan(host)) for host in group]
            jobs = [(host, p) for host, p in planned if p is not None]

            async def together() -> list[dict[str, Any]]:
                return await asyncio.gather(
                    *(
                        probe_async(hosts.url(host["name"]), conc, pages)
                        for host, (conc, pages) in jobs
                    )
                )

            for (host, _), result in zip(jobs, asyncio.run(together()), strict=True):
                t0 = (
                    hosts.stats(host["name"])["first_arrival_epoch"]
                    or result["first_sent_epoch"]
                )
                results[host["name"]] = {
                    "pages": result["pages"],
                    "pages_per_second": result["pages_per_second"],
                    "concurrency": result["concurrency"],
                    "elapsed": result["elapsed"],
                    "status_counts": result["status_counts"],
                    "timeline": throughput_series(result["done_epochs"], t0),
                }
            for host, p in planned:
                if p is None:
                    results[host["name"]] = {
                        "pages_per_second": nominal_capacity(host),
                        "nominal": True,
                    }

        probe_group(base_hosts)
        for variant in variants:
            probe_group([variant])
    return {"status": "ok", "hosts": results, "wall": time.time() - started}


def _stderr_tail(text: str, lines: int = 2, width: int = 240) -> str:
    """The last lines of a crawl's stderr, where the cause of a failure is."""
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()]
    clipped = [
        line if len(line) <= width else line[: width - 3] + "..." for line in kept
    ]
    return " | ".join(clipped[-lines:]) or "(no stderr)"


def run_crawl_config(
    scenario: Scenario, config_name: str, quick: bool, timeout: float | None
) -> dict[str, Any]:
    """One configuration: fresh server, crawl subprocess, server stats."""
    pages = scenario.quick_pages if quick else scenario.pages
    max_seconds = scenario.quick_max_seconds if quick else scenario.max_seconds
    hard_timeout = timeout or (max_seconds + 60)
    with SimHosts(scenario.hosts) as hosts:
        netlocs = {host["name"]: hosts.netloc(host["name"]) for host in scenario.hosts}
        spec = CONFIGS[config_name]
        settings = dict(scenario.base_settings)
        settings.update(spec(netlocs) if callable(spec) else spec)
        settings.update(scenario.settings)
        settings.update(EXTRA_SETTINGS)
        plugin = uses_plugin(settings)
        timeline: Path | None = None
        if plugin and TIMELINE_DIR is not None and config_name in OURS:
            timeline = TIMELINE_DIR / f"timeline-{scenario.name}-{config_name}.jsonl"
            timeline.unlink(missing_ok=True)
            settings.setdefault("THROTTLING_TIMELINE_FILE", str(timeline))
            settings.setdefault("THROTTLING_TIMELINE_INTERVAL", TIMELINE_INTERVAL)
        crawl_config = {
            "hosts": [
                {
                    "name": host["name"],
                    "url": hosts.url(host["name"], "").rstrip("/"),
                    "pages": pages[host["name"]],
                }
                for host in scenario.hosts
            ],
            "settings": settings,
            "sample_interval": scenario.sample_interval,
            # Scrapy keys its download slots (and AutoThrottle its delays) by
            # hostname, and every simulated host is 127.0.0.1: without a slot
            # per host:port, AutoThrottle would treat A and B as one site. The
            # plugin uses its own scopes (host:port) and deprecates the
            # download_slot meta key, so it is only set without the plugin.
            "per_host_slots": not plugin,
            "max_seconds": max_seconds,
        }
        record: dict[str, Any] = {
            "settings": settings,
            "plugin": plugin,
            "max_seconds": max_seconds,
        }
        started = time.time()
        try:
            process, crawl = run_in_subprocess(crawl_config, timeout=hard_timeout)
        except subprocess.TimeoutExpired as exc:
            stderr = exc.stderr or b""
            text = (
                stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
            )
            record.update(
                status="failed",
                error=f"timeout after {hard_timeout:.0f} s; {_stderr_tail(text)}",
            )
            return record
        record["wall"] = time.time() - started
        record["stderr_tail"] = _stderr_tail(process.stderr, 20, 1000)
        if crawl is None:
            record.update(
                status="failed",
                error=f"exit {process.returncode}: {_stderr_tail(process.stderr)}",
            )
            return record
        record.update(status="ok", crawl=crawl)
        if timeline is not None and timeline.exists():
            record["timeline_file"] = str(timeline)
        record["server"] = {name: hosts.stats(name) for name in netlocs}
        record["server_cpu_seconds"] = hosts.cpu_seconds()
    if scenario.aggregate:
        crawl["hosts"] = {AGGREGATE_HOST: aggregate_hosts(crawl["hosts"])}
        record["server"] = {AGGREGATE_HOST: aggregate_servers(record["server"])}
    return record


#: The name of the one row of an ``aggregate`` scenario.
AGGREGATE_HOST = "all"


def aggregate_hosts(hosts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One crawl record (as :mod:`bench.crawl` makes) for all *hosts*.

    pages/s runs from the first request to any host to the last page of any
    host; ``latency_p50``/``p90`` are the medians of the hosts' own (the
    crawl process does not keep every latency); state samples, taken for
    every host at once, become the mean limit and the total in flight.
    """
    records = list(hosts.values())
    firsts = [r["first_sent_epoch"] for r in records if r["first_sent_epoch"]]
    lasts = [r["last_page_epoch"] for r in records if r["last_page_epoch"]]
    first = min(firsts) if firsts else None
    last = max(lasts) if lasts else None
    pages = sum(r["pages"] for r in records)
    elapsed = last - first if first is not None and last is not None else 0.0
    status_counts: dict[str, int] = {}
    failures: dict[str, int] = {}
    examples: dict[str, str] = {}
    for r in records:
        for key, value in r["status_counts"].items():
            status_counts[key] = status_counts.get(key, 0) + value
        for key, value in r["failures"].items():
            failures[key] = failures.get(key, 0) + value
        for key, value in r["failure_examples"].items():
            examples.setdefault(key, value)
    inflight: dict[float, list[float]] = {}
    for r in records:
        for t, on_wire, in_downloader in r["inflight_samples"]:
            total = inflight.setdefault(t, [0, 0])
            total[0] += on_wire
            total[1] += in_downloader
    limits: dict[float, list[float]] = {}
    for r in records:
        for sample in r["state_samples"]:
            if isinstance(sample.get("limit"), int | float):
                limits.setdefault(sample["t"], []).append(sample["limit"])

    def medians(key: str) -> float | None:
        values = [r[key] for r in records if r[key] is not None]
        return statistics.median(values) if values else None

    return {
        "netloc": f"{len(records)} hosts",
        "pages_requested": sum(r["pages_requested"] for r in records),
        "pages": pages,
        "pages_per_second": pages / elapsed if elapsed > 0 else 0.0,
        "elapsed": elapsed,
        "first_sent_epoch": first,
        "last_page_epoch": last,
        "count_503": sum(r["count_503"] for r in records),
        "count_429": sum(r["count_429"] for r in records),
        "status_counts": status_counts,
        "download_errors": sum(r["download_errors"] for r in records),
        "failures": failures,
        "failure_examples": examples,
        "latency_p50": medians("latency_p50"),
        "latency_p90": medians("latency_p90"),
        "done_epochs": sorted(e for r in records for e in r["done_epochs"]),
        "inflight_samples": [[t, *v] for t, v in sorted(inflight.items())],
        "state_samples": [
            {"t": t, "limit": statistics.mean(values)}
            for t, values in sorted(limits.items())
        ],
    }


def aggregate_servers(servers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The hosts' server records as one: arrivals on a common host-time
    (0 = the first arrival at any host), ``max_concurrency`` the most any
    one host held."""
    starts = [s["first_arrival_epoch"] for s in servers.values()]
    known = [start for start in starts if start]
    origin = min(known) if known else None
    arrivals: list[list[Any]] = []
    status_counts: dict[str, int] = {}
    for server in servers.values():
        shift = (
            server["first_arrival_epoch"] - origin
            if origin is not None and server["first_arrival_epoch"]
            else 0.0
        )
        arrivals += [[a[0] + shift, *a[1:]] for a in server["arrivals"]]
        for key, value in server["status_counts"].items():
            status_counts[key] = status_counts.get(key, 0) + value
    arrivals.sort(key=lambda a: a[0])
    return {
        "first_arrival_epoch": origin,
        "arrivals": arrivals,
        "max_concurrency": max(
            (s["max_concurrency"] for s in servers.values()), default=0
        ),
        "status_counts": status_counts,
    }


def analyse_run(
    scenario: Scenario,
    record: dict[str, Any],
    capacity: dict[str, float],
) -> None:
    """Add per-host metrics and timelines (host-time) to a crawl record."""
    metrics: dict[str, Any] = {}
    for name, host in record["crawl"]["hosts"].items():
        server = record["server"][name]
        t0 = server["first_arrival_epoch"] or host["first_sent_epoch"] or 0.0
        series = throughput_series(host["done_epochs"], t0)
        limits = [
            [round(s["t"] - t0, 3), s["limit"]]
            for s in host["state_samples"]
            if isinstance(s.get("limit"), int | float)
        ]
        entry = {
            "pages": host["pages"],
            "pages_requested": host["pages_requested"],
            "pages_per_second": host["pages_per_second"],
            "count_503": host["count_503"],
            "count_429": host["count_429"],
            "download_errors": host["download_errors"],
            "failures": host["failures"],
            "failure_examples": host.get("failure_examples", {}),
            "latency_p50": host["latency_p50"],
            "latency_p90": host["latency_p90"],
            # What the host saw: arrival to answer, for the pages it served.
            "server_latency_p50": _median(
                [a[4] for a in server["arrivals"] if a[3] == 200 and a[4] is not None]
            ),
            "settled_limit": settled_limit(
                host["state_samples"], host["first_sent_epoch"], host["last_page_epoch"]
            ),
            "max_held": server["max_concurrency"],
            "server_status_counts": server["status_counts"],
            "timeline": series,
            "limit_timeline": limits,
            "inflight_timeline": [
                [round(t - t0, 3), on_wire]
                for t, on_wire, _ in host["inflight_samples"]
            ],
        }
        cap = capacity.get(name)
        entry["capacity"] = cap
        entry["ratio"] = host["pages_per_second"] / cap if cap else None
        if scenario.slowdown is not None:
            start, end = scenario.slowdown
            slow_pages = sum(
                1 for epoch in host["done_epochs"] if start <= epoch - t0 < end
            )
            slow_rate = slow_pages / (end - start)
            reduced = capacity.get(scenario.slowdown_capacity or "")
            entry["slowdown_pages_per_second"] = slow_rate
            entry["slowdown_capacity"] = reduced
            entry["slowdown_ratio"] = slow_rate / reduced if reduced else None
            entry["recovery_seconds"] = (
                recovery_seconds(series, cap, end) if cap else None
            )
        if scenario.count_429_window is not None:
            per_window = windowed_counts(
                server["arrivals"], 429, scenario.count_429_window
            )
            entry["count_429_per_window"] = per_window
            entry["max_429_per_window"] = max(per_window, default=0)
        metrics[name] = entry
    record["metrics"] = metrics


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------


def _fmt(value: Any, spec: str = ".0f", missing: str = "-") -> str:
    if value is None:
        return missing
    return format(value, spec)


#: Column widths of the table; the first two columns are left-aligned.
COLUMN_WIDTHS = (30, 4, 10, 8, 8, 5, 5, 7, 7, 7, 6, 5, 6)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _row(*cells: Any) -> str:
    return " ".join(
        f"{cell!s:<{width}}" if index < 2 else f"{cell!s:>{width}}"
        for index, (cell, width) in enumerate(zip(cells, COLUMN_WIDTHS, strict=True))
    )


def format_table(scenario: Scenario, result: dict[str, Any]) -> str:
    capacity = result["capacity"]
    lines = [
        f"== {scenario.name}: {scenario.description}"
        + (" (quick)" if result["quick"] else ""),
        "capacity: "
        + ", ".join(
            f"{name} {value:.1f}/s ({result['capacity_source'].get(name, '?')})"
            for name, value in capacity.items()
            if value
        ),
    ]
    # The footer says what the ratio is over (capacity or a reference config).
    ratio_label = "ratio" if scenario.ratio_to == "capacity" else "ratio*"
    header = _row(
        "config",
        "host",
        "pages",
        "pages/s",
        ratio_label,
        "503",
        "429",
        "p50 ms",
        "p90 ms",
        "srv p50",
        "limit",
        "held",
        "time s",
    )
    lines += [header, "-" * len(header)]
    extras: list[str] = []
    for run in result["runs"]:
        label = config_label(run["config"]) + (
            f" #{run['repeat'] + 1}" if result["repeat"] > 1 else ""
        )
        if run["status"] != "ok":
            lines.append(f"{label:<30} FAILED: {run.get('error', '?')}")
            continue
        if run["config"] == "probe":
            for name, host in run["probe"]["hosts"].items():
                if host.get("nominal"):
                    continue
                # A probe's ratio only makes sense against a capacity.
                cap = capacity.get(name) if scenario.ratio_to == "capacity" else None
                lines.append(
                    _row(
                        label,
                        name,
                        host["pages"],
                        f"{host['pages_per_second']:.1f}",
                        _fmt(host["pages_per_second"] / cap if cap else None, ".3f"),
                        host["status_counts"].get("503", 0),
                        "-",
                        "-",
                        "-",
                        "-",
                        host["concurrency"],
                        "-",
                        f"{host['elapsed']:.1f}",
                    )
                )
            continue
        for name, m in run["metrics"].items():
            p50 = m["latency_p50"] * 1000 if m["latency_p50"] is not None else None
            p90 = m["latency_p90"] * 1000 if m["latency_p90"] is not None else None
            lines.append(
                _row(
                    label,
                    name,
                    f"{m['pages']}/{m['pages_requested']}",
                    f"{m['pages_per_second']:.1f}",
                    _fmt(m["ratio"], ".3f"),
                    m["count_503"],
                    m["count_429"],
                    _fmt(p50, ".1f"),
                    _fmt(p90, ".1f"),
                    _fmt(
                        m["server_latency_p50"] * 1000
                        if m["server_latency_p50"] is not None
                        else None,
                        ".1f",
                    ),
                    _fmt(m["settled_limit"], ".1f"),
                    m["max_held"],
                    f"{run['crawl']['hosts'][name]['elapsed']:.1f}",
                )
            )
            if m["download_errors"]:
                extras.append(
                    f"  {label} {name}: {m['download_errors']} download errors "
                    "(retried)"
                )
            if m["failures"]:
                extras.append(
                    f"  {label} {name}: requests FAILED (lost pages): "
                    + ", ".join(
                        f"{count} x {error}: {m['failure_examples'].get(error, '')}"
                        for error, count in m["failures"].items()
                    )
                )
            if scenario.slowdown is not None:
                start, end = scenario.slowdown
                recovery = m["recovery_seconds"]
                extras.append(
                    f"  {label} {name}: during [{start:g},{end:g}) "
                    f"{m['slowdown_pages_per_second']:.1f} pages/s = "
                    f"{_fmt(m['slowdown_ratio'], '.3f')} of the reduced capacity "
                    f"{_fmt(m['slowdown_capacity'], '.1f')}/s; back to >= 0.9 of full "
                    "capacity "
                    + (
                        f"{recovery:.2f} s after t={end:g}"
                        if recovery is not None
                        else "not within the run"
                    )
                )
            if scenario.count_429_window is not None:
                extras.append(
                    f"  {label} {name}: 429s per {scenario.count_429_window:g} s "
                    f"window: max {m['max_429_per_window']}, all "
                    f"{m['count_429_per_window']}"
                )
        cpu = cpu_per_page(run)
        if cpu is not None:
            extras.append(
                f"  {label}: crawl CPU {run['crawl']['crawl_cpu_seconds']:.2f} s, "
                f"{cpu:.0f} us per page"
            )
        reason = run["crawl"].get("finish_reason")
        if reason == "closespider_timeout":
            extras.append(
                f"  {label}: stopped by the time cap ({run['max_seconds']:g} s), "
                "pages/s is over the pages fetched by then"
            )
        elif reason not in (None, "finished"):
            extras.append(f"  {label}: crawl ended early: {reason}")
        if run["plugin"] and not any(
            m["limit_timeline"] for m in run["metrics"].values()
        ):
            extras.append(
                f"  {label}: no limit samples ({run['crawl'].get('sampler')})"
            )
    if extras:
        lines += ["", *extras]
    if result["repeat"] > 1:
        lines += ["", *format_medians(result)]
    verdict = format_verdict(result)
    if verdict:
        lines += ["", verdict]
    lines.append(
        (
            "ratio: pages/s over the capacity (probed, else nominal)"
            if scenario.ratio_to == "capacity"
            else f"ratio*: pages/s over {scenario.ratio_to}'s (same repeat)"
        )
        + "; p50/p90: download_latency seen by Scrapy; srv p50: median "
        "arrival-to-answer time at the host; limit: settled limit (median over "
        "the last 30% of the host's crawl); held: max requests the host held at "
        "once"
    )
    if scenario.note:
        lines.append(scenario.note)
    return "\n".join(lines)


def _totals(run: dict[str, Any]) -> tuple[float, int, int]:
    """A crawl's pages/s over all its hosts (pages over the longest host's
    time), and its 503 and 429 counts."""
    metrics = run["metrics"].values()
    pages = sum(m["pages"] for m in metrics)
    elapsed = max(
        (run["crawl"]["hosts"][name]["elapsed"] for name in run["metrics"]),
        default=0.0,
    )
    return (
        pages / elapsed if elapsed > 0 else 0.0,
        sum(m["count_503"] for m in metrics),
        sum(m["count_429"] for m in metrics),
    )


def format_verdict(result: dict[str, Any]) -> str:
    """One line: this plugin against the fastest other configuration of the run.

    "Fastest" counts only configurations that drew no more 503/429 answers
    than ours, when any did: a faster crawl that the host had to refuse is not
    a better one. With repeats, each configuration's median pages/s counts.
    """
    per_config: dict[str, list[tuple[float, int, int]]] = {}
    for run in result["runs"]:
        if run["status"] == "ok" and run["config"] != "probe":
            per_config.setdefault(run["config"], []).append(_totals(run))
    ours = next((name for name in OURS if name in per_config), None)
    if ours is None:
        return ""

    def summary(name: str) -> tuple[float, int, int]:
        rows = per_config[name]
        return (
            statistics.median(row[0] for row in rows),
            round(statistics.median(row[1] for row in rows)),
            round(statistics.median(row[2] for row in rows)),
        )

    rate, count_503, count_429 = summary(ours)
    refused = count_503 + count_429
    others = {name: summary(name) for name in per_config if name != ours}
    polite = {n: s for n, s in others.items() if s[1] + s[2] <= refused}
    pool = polite or others
    ratios: dict[str, list[float]] = {}
    for run in result["runs"]:
        if run["status"] == "ok" and run["config"] == ours:
            for host, m in run["metrics"].items():
                if m["ratio"] is not None:
                    ratios.setdefault(host, []).append(m["ratio"])
    of = "capacity" if result.get("ratio_to", "capacity") == "capacity" else "ref."
    per_host = ", ".join(
        f"{host} {statistics.median(values):.2f}" for host, values in ratios.items()
    )
    text = (
        f"verdict: {config_label(ours)} {rate:.1f} pages/s"
        + (f" ({per_host} of {of})" if per_host else "")
        + f", {count_503} 503s, {count_429} 429s"
    )
    if not pool:
        return text
    best = max(pool, key=lambda name: pool[name][0])
    best_rate, best_503, best_429 = pool[best]
    ratio = rate / best_rate if best_rate else float("nan")
    return (
        f"{text}; best alternative in this run: {config_label(best)} "
        f"{best_rate:.1f} pages/s, {best_503} 503s, {best_429} 429s "
        f"(ours = {ratio:.2f} x"
        + ("" if polite else "; every alternative drew more refusals")
        + ")"
    )


def cpu_per_page(run: dict[str, Any]) -> float | None:
    """The crawl process's CPU microseconds (spider open to close) per page."""
    crawl = run.get("crawl") or {}
    seconds = crawl.get("crawl_cpu_seconds")
    pages = sum(host["pages"] for host in crawl.get("hosts", {}).values())
    if seconds is None or not pages:
        return None
    return float(seconds) / pages * 1e6


def format_medians(result: dict[str, Any]) -> list[str]:
    """Median (min-max) of pages/s and ratio over the repeats of each config,
    and of the crawl's CPU time per page."""
    rates: dict[tuple[str, str], list[float]] = {}
    ratios: dict[tuple[str, str], list[float]] = {}
    cpus: dict[str, list[float]] = {}
    for run in result["runs"]:
        if run["status"] != "ok" or run["config"] == "probe":
            continue
        cpu = cpu_per_page(run)
        if cpu is not None:
            cpus.setdefault(run["config"], []).append(cpu)
        for name, m in run["metrics"].items():
            rates.setdefault((run["config"], name), []).append(m["pages_per_second"])
            if m["ratio"] is not None:
                ratios.setdefault((run["config"], name), []).append(m["ratio"])
    lines = [f"medians over {result['repeat']} repeats (min-max):"]
    for key, values in rates.items():
        config, name = key
        ratio = ratios.get(key, [])
        lines.append(
            f"  {config_label(config):<30} {name:<4} "
            f"{statistics.median(values):8.1f} pages/s "
            f"({min(values):.1f}-{max(values):.1f})"
            + (
                f"  ratio {statistics.median(ratio):.3f} "
                f"({min(ratio):.3f}-{max(ratio):.3f})"
                if ratio
                else ""
            )
        )
    if cpus:
        lines.append("crawl CPU us per page, medians (min-max):")
        lines += [
            f"  {config:<21} {statistics.median(values):8.0f} "
            f"({min(values):.0f}-{max(values):.0f})"
            for config, values in cpus.items()
        ]
    return lines


def plot(scenario: Scenario, result: dict[str, Any], path: Path) -> None:
    """Per host: limit over time (plugin configs) and pages/s over time."""
    # Imported here so that --no-plot works without matplotlib.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    host_names = (
        [AGGREGATE_HOST]
        if scenario.aggregate
        else [host["name"] for host in scenario.hosts]
    )
    figure, axes = plt.subplots(
        len(host_names), 2, figsize=(13, 3.6 * len(host_names)), squeeze=False
    )
    colors: dict[str, Any] = {}
    palette = plt.get_cmap("tab10")
    for run in result["runs"]:
        if run["status"] != "ok" or run["repeat"] != 0:
            continue
        color = colors.setdefault(run["config"], palette(len(colors) % 10))
        for row, name in enumerate(host_names):
            limit_axis, rate_axis = axes[row]
            if run["config"] == "probe":
                host = run["probe"]["hosts"].get(name, {})
                series = host.get("timeline", [])
                style = "--"
            else:
                metrics = run["metrics"][name]
                series = metrics["timeline"]
                style = "-"
                if metrics["limit_timeline"]:
                    xs, ys = zip(*metrics["limit_timeline"], strict=True)
                    limit_axis.plot(xs, ys, label=run["config"], color=color)
                elif metrics["inflight_timeline"]:
                    # No limit to show: what the crawler had in flight instead.
                    xs, ys = zip(*metrics["inflight_timeline"], strict=True)
                    limit_axis.plot(
                        xs,
                        ys,
                        label=f"{run['config']} (in flight)",
                        color=color,
                        linestyle=":",
                        linewidth=0.9,
                    )
            if series:
                xs, ys = zip(*series, strict=True)
                rate_axis.step(
                    xs,
                    ys,
                    where="post",
                    linestyle=style,
                    label=run["config"],
                    color=color,
                )
    for row, name in enumerate(host_names):
        limit_axis, rate_axis = axes[row]
        limit_axis.set_title(
            f"host {name}: concurrency limit (dotted: in flight, no limit samples)"
        )
        rate_axis.set_title(f"host {name}: pages/s ({BUCKET_SECONDS} s buckets)")
        for axis in (limit_axis, rate_axis):
            axis.set_xlabel("host-time (s)")
            axis.grid(alpha=0.3)
            if scenario.slowdown is not None:
                axis.axvspan(*scenario.slowdown, color="grey", alpha=0.15)
            if axis.get_legend_handles_labels()[0]:
                axis.legend(fontsize="small")
        cap = result["capacity"].get(name)
        if cap:
            rate_axis.axhline(cap, color="black", linewidth=0.8, linestyle=":")
    figure.suptitle(f"{scenario.name}: {scenario.description}")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------


def draw_charts(
    scenario: Scenario,
    result: dict[str, Any],
    out: Path,
    log: Callable[[str], None],
) -> list[Path]:
    """The scenario's comparison chart, and each timeline our crawls wrote
    drawn by ``python -m scrapy_adaptive_throttle.plot``'s own code."""
    from scrapy_adaptive_throttle.plot import plot_timeline, read_timeline

    charts: list[Path] = []
    try:
        plot(scenario, result, out / f"{scenario.name}.png")
    except Exception as exc:
        log(f"[{scenario.name}] plot failed: {exc!r}")
    else:
        charts.append(out / f"{scenario.name}.png")
    for run in result["runs"]:
        path = run.get("timeline_file")
        if not path or run["repeat"] != 0:
            continue
        chart = Path(path).with_suffix(".png")
        try:
            plot_timeline(
                read_timeline(path),
                chart,
                title=f"{scenario.name}: {config_label(run['config'])} "
                "(its THROTTLING_TIMELINE_FILE)",
            )
        except Exception as exc:
            log(f"[{scenario.name}] timeline chart failed: {exc!r}")
        else:
            charts.append(chart)
    return charts


def run_scenario(
    scenario: Scenario,
    *,
    configs: list[str] | None,
    quick: bool,
    repeat: int,
    timeout: float | None,
    log: Callable[[str], None],
) -> dict[str, Any]:
    selected = configs or (
        (scenario.quick_configs or scenario.configs) if quick else scenario.configs
    )
    # The probe runs first in each repeat: the other rows are ratios to it.
    selected = sorted(selected, key=lambda name: name != "probe")
    runs: list[dict[str, Any]] = []
    probed: dict[str, list[float]] = {}
    for index in range(repeat):
        for config_name in selected:
            log(f"[{scenario.name}] {config_name} (run {index + 1}/{repeat}) ...")
            record: dict[str, Any]
            if config_name == "probe":
                try:
                    record = {"probe": run_probe(scenario, quick), "status": "ok"}
                except Exception as exc:
                    record = {"status": "failed", "error": repr(exc)}
                else:
                    for name, host in record["probe"]["hosts"].items():
                        if not host.get("nominal"):
                            probed.setdefault(name, []).append(host["pages_per_second"])
            else:
                record = run_crawl_config(scenario, config_name, quick, timeout)
            record.update(
                config=config_name, repeat=index, plugin=record.get("plugin", False)
            )
            runs.append(record)

    # Ratios use the median probed capacity, else the nominal one.
    capacity: dict[str, float] = {}
    source: dict[str, str] = {}
    for host in [
        *scenario.hosts,
        *({**h, "name": label} for label, h in scenario.probe_variants.items()),
    ]:
        name = host["name"]
        if probed.get(name):
            capacity[name], source[name] = statistics.median(probed[name]), "probed"
        elif (nominal := nominal_capacity(host)) is not None:
            capacity[name], source[name] = nominal, "nominal"
    for run in runs:
        if run["status"] == "ok" and run["config"] != "probe":
            analyse_run(scenario, run, capacity)
    if scenario.ratio_to != "capacity":
        reference = {
            run["repeat"]: run
            for run in runs
            if run["config"] == scenario.ratio_to and run["status"] == "ok"
        }
        for run in runs:
            base = reference.get(run["repeat"])
            if run["status"] != "ok" or run["config"] == "probe" or base is None:
                continue
            for name, m in run["metrics"].items():
                base_rate = base["metrics"][name]["pages_per_second"]
                m["ratio"] = m["pages_per_second"] / base_rate if base_rate else None
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "ratio_to": scenario.ratio_to,
        "quick": quick,
        "repeat": repeat,
        "capacity": capacity,
        "capacity_source": source,
        "hosts": scenario.hosts,
        "pages": scenario.quick_pages if quick else scenario.pages,
        "runs": runs,
    }


def environment() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "scrapy": scrapy.__version__,
        "twisted": twisted.__version__,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--scenario",
        default="all",
        help="scenario(s) to run, comma-separated, or all (the default); "
        f"known: {', '.join(SCENARIOS)}",
    )
    parser.add_argument("--quick", action="store_true", help="short runs (~1-2 min)")
    parser.add_argument(
        "--configs",
        help="comma-separated configurations, run in every selected scenario "
        f"(default: each scenario's own list); known: {', '.join(CONFIGS)},"
        " and fixed-N for any limit N",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per configuration")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output directory")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG charts")
    parser.add_argument(
        "--timeout", type=float, help="hard timeout per crawl process, seconds"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a Scrapy setting for every crawl (VALUE read as JSON if it "
        "parses, else a string), e.g. --set CONCURRENT_ITEMS=1; repeatable",
    )
    parser.add_argument(
        "--slower",
        type=float,
        default=1.0,
        metavar="FACTOR",
        help="multiply every host's service times by FACTOR (e.g. 2: the same "
        "noise and queues at half the capacity, where the crawler's own CPU "
        "does not bound pages/s on a small machine)",
    )
    args = parser.parse_args(argv)
    if args.slower <= 0:
        parser.error("--slower must be > 0")
    for item in args.set:
        setting, sep, raw = item.partition("=")
        if not sep or not setting:
            parser.error(f"--set expects NAME=VALUE, got {item!r}")
        try:
            EXTRA_SETTINGS[setting] = json.loads(raw)
        except ValueError:
            EXTRA_SETTINGS[setting] = raw

    configs = None
    if args.configs:
        configs = [name.strip() for name in args.configs.split(",") if name.strip()]
        for name in configs:
            # Any fixed limit: fixed-N (e.g. to trace the rate a fixed limit
            # reaches against the latency it costs).
            prefix, _, number = name.partition("-")
            if name not in CONFIGS and prefix == "fixed" and number.isdigit():
                CONFIGS[name] = _fixed(int(number))
        unknown = [name for name in configs if name not in CONFIGS]
        if unknown:
            parser.error(f"unknown configurations {unknown}; known: {list(CONFIGS)}")
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    names = (
        list(SCENARIOS)
        if args.scenario == "all"
        else [name.strip() for name in args.scenario.split(",") if name.strip()]
    )
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown or not names:
        parser.error(f"unknown scenarios {unknown}; known: {list(SCENARIOS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    global TIMELINE_DIR
    TIMELINE_DIR = None if args.no_plot else args.out

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.time()
    for name in names:
        scenario = slower_scenario(SCENARIOS[name], args.slower)
        result = run_scenario(
            scenario,
            configs=configs,
            quick=args.quick,
            repeat=args.repeat,
            timeout=args.timeout,
            log=log,
        )
        result["environment"] = environment()
        result["extra_settings"] = EXTRA_SETTINGS
        if EXTRA_SETTINGS:
            print(f"settings over every crawl (--set): {EXTRA_SETTINGS}")
        print(format_table(scenario, result), flush=True)
        print(flush=True)
        (args.out / f"results-{name}.json").write_text(json.dumps(result))
        if not args.no_plot:
            charts = draw_charts(scenario, result, args.out, log)
            if charts:
                print(f"charts of {name}: " + ", ".join(map(str, charts)), flush=True)
                print(flush=True)
    log(f"done in {time.time() - started:.0f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
