"""Faults of the shared state (issue 13): ``python -m bench.shared_faults``.

Four processes crawl host A (8 workers x 20 ms, a 16-request queue, 503
when full) with one shared limit through a real ``redis-server`` (started
on a free port, persistence off), and a fault is made mid-crawl:

``kill``
    One process is killed with SIGKILL ``--at`` seconds after the first
    arrival. Its leases (its requests in flight then) live their TTL
    (:setting:`DOWNLOAD_TIMEOUT` plus the margin, ``--timeout`` + 5 s) and
    still count; then the others use the whole limit.
``restart``
    Redis is killed ``--at`` seconds after the first arrival and started
    again (empty, on the same port) ``--down`` seconds later. The processes
    fall back to in-process limits (the limit divided by the process count),
    reconnect, lease again what they have in flight and share again.

Printed, from the server's records (seconds from the first arrival): pages/s
of 200 answers per phase (before the fault, during it, after it), the mean
and the most requests in service per phase against the shared limit, 503s, whether every
page of every surviving process was fetched exactly once, and the log lines
of the fallback and the recovery. ``--limit N`` is the scope's fixed
concurrency (default 16: A's workers plus room for Scrapy's turnaround);
``--adaptive`` uses the add-on's latency-adaptive limit instead.

Ratios only mean something within one run (2 shared cores); note ``uptime``
with the figures.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.crawl import start_in_subprocess
from bench.run import ADDON, HOST_A, PLAIN_SCOPE_MANAGER
from bench.shared_state import ADAPTIVE_CEILING, Redis
from simhosts import SimHosts

ROOT = Path(__file__).resolve().parent.parent
#: The lease margin of the shared state (``LEASE_MARGIN``), in seconds.
LEASE_MARGIN = 5.0
#: Log lines of the fallback and the recovery (see _shared_connection.py).
FAULT_LOG_MARKERS = ("THROTTLING_STATE_URL", "Reconnected to the shared")


def _first_arrival(hosts: SimHosts, deadline: float) -> float:
    """The epoch of the host's first arrival, once there is one."""
    while time.time() < deadline:
        first = hosts.stats("A").get("first_arrival_epoch")
        if first is not None:
            return float(first)
        time.sleep(0.02)
    raise SystemExit("no request reached the host")


def run(
    part: str,
    *,
    processes: int,
    pages: int,
    limit: int | None,
    at: float,
    down: float,
    timeout: float,
) -> dict[str, Any]:
    """One crawl with one fault; the figures of :func:`report`."""
    redis = Redis()
    try:
        with SimHosts([HOST_A]) as hosts, tempfile.TemporaryDirectory() as tmp:
            base = hosts.url("A", "").rstrip("/")
            settings: dict[str, Any] = {
                "ADDONS": ADDON,
                "THROTTLING_STATE_URL": redis.url,
                "THROTTLING_STATE_PROCESSES": processes,
                "DOWNLOAD_TIMEOUT": timeout,
                "LOG_LEVEL": "INFO",
            }
            if limit is None:
                settings["CONCURRENT_REQUESTS_PER_DOMAIN"] = ADAPTIVE_CEILING
            else:
                settings["THROTTLING_SCOPE_MANAGER"] = PLAIN_SCOPE_MANAGER
                settings["THROTTLING_SCOPES"] = {
                    hosts.netloc("A"): {"concurrency": limit}
                }
            running = []
            for index in range(processes):
                output = Path(tmp) / f"{index}.json"
                config = {
                    "hosts": [{"name": "A", "url": f"{base}/p{index}", "pages": pages}],
                    "settings": settings,
                    "per_host_slots": False,
                    "max_seconds": 180,
                }
                running.append((start_in_subprocess(config, output), output))
            origin = _first_arrival(hosts, time.time() + 60)
            time.sleep(max(0.0, origin + at - time.time()))
            fault_at = time.time() - origin
            recovered_at = None
            if part == "kill":
                running[0][0].send_signal(signal.SIGKILL)
            else:
                redis.server.stop()
                time.sleep(down)
                redis.server.start()
                recovered_at = time.time() - origin
            logs = []
            for index, (process, _) in enumerate(running):
                assert process.stderr is not None
                stderr = process.stderr.read()
                process.wait(240)
                killed = part == "kill" and index == 0
                if not killed and process.returncode != 0:
                    raise SystemExit(stderr[-3000:])
                logs += [
                    f"process {index}: {line.strip()[:200]}"
                    for line in stderr.splitlines()
                    if any(marker in line for marker in FAULT_LOG_MARKERS)
                ]
            stats = hosts.stats("A")
    finally:
        redis.close()
    return {
        "part": part,
        "stats": stats,
        "fault_at": fault_at,
        "recovered_at": recovered_at,
        "logs": logs,
        "survivors": range(1, processes) if part == "kill" else range(processes),
        "pages": pages,
        "limit": limit,
        "ttl": timeout + LEASE_MARGIN,
    }


def _phase(
    records: list[list[Any]], start: float, end: float
) -> tuple[float, float, int, int]:
    """``(pages/s of 200 answers, mean and most in service, 503s)`` in
    ``[start, end)`` (server seconds): answers that came then, the requests
    held then (time-weighted mean, and the most at once), 503s of the
    requests that arrived then."""
    answered = sum(
        1
        for record in records
        if record[3] == 200 and start <= record[0] + record[4] < end
    )
    # Arrivals (+1) and answers (-1) of every request, an answer before an
    # arrival at the same time.
    events = sorted(
        [(record[0], 1) for record in records]
        + [(record[0] + record[4], -1) for record in records]
    )
    level = most = 0
    held = 0.0  # request-seconds in service within the phase
    previous = start
    for when, step in events:
        if when > start:
            inside_until = min(when, end)
            if inside_until > previous:
                held += level * (inside_until - previous)
                previous = inside_until
        level += step
        if start <= when < end:
            most = max(most, level)
    span = end - start
    return (
        answered / span if span > 0 else 0.0,
        held / span if span > 0 else 0.0,
        most,
        sum(1 for record in records if start <= record[0] < end and record[3] == 503),
    )


def report(result: dict[str, Any]) -> None:
    stats = result["stats"]
    records = stats["arrivals"]
    last = max(record[0] + record[4] for record in records)
    fault = result["fault_at"]
    if result["part"] == "kill":
        back = fault + result["ttl"]
        phases = [
            ("before the kill", 1.0, fault),
            ("kill -> lease TTL", fault, back),
            ("after the TTL", back, last),
        ]
    else:
        back = result["recovered_at"]
        phases = [
            ("before Redis stops", 1.0, fault),
            ("Redis down", fault, back),
            ("after the restart", back, last),
        ]
    limit = result["limit"]
    print(
        f"## {result['part']}: {len(result['survivors'])} surviving processes, "
        f"fault at {fault:.1f} s"
        + (f", Redis back at {back:.1f} s" if result["part"] == "restart" else "")
        + f", lease TTL {result['ttl']:g} s, shared limit "
        + ("adaptive" if limit is None else str(limit))
    )
    print(
        "| phase (server seconds) | pages/s | mean in service | most in service "
        "| 503s |"
    )
    print("|---|---|---|---|---|")
    for name, start, end in phases:
        rate, mean, most, refused = _phase(records, start, end)
        print(
            f"| {name} ({start:.1f}-{end:.1f}) | {rate:.0f} | {mean:.1f} | {most} "
            f"| {refused} |"
        )
    fetched = Counter(
        record[1] for record in records if record[3] == 200 and record[1] != "/"
    )
    expected = {
        f"/p{index}/page/{page}"
        for index in result["survivors"]
        for page in range(result["pages"])
    }
    once = all(fetched.get(path) == 1 for path in expected)
    print(
        f"every page of the surviving processes fetched exactly once: {once} "
        f"({sum(1 for p in expected if fetched.get(p) == 1)}/{len(expected)})"
    )
    for line in result["logs"]:
        print(f"    {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["kill", "restart", "all"], default="all")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--pages", type=int, default=1500, help="per process")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--adaptive", action="store_true")
    parser.add_argument("--at", type=float, default=5.0)
    parser.add_argument("--down", type=float, default=3.0)
    parser.add_argument("--timeout", type=float, default=3.0, help="DOWNLOAD_TIMEOUT")
    args = parser.parse_args(argv)
    print(f"# load average {os.getloadavg()[0]:.2f}")
    parts = ["kill", "restart"] if args.part == "all" else [args.part]
    for part in parts:
        report(
            run(
                part,
                processes=args.processes,
                pages=args.pages,
                limit=None if args.adaptive else args.limit,
                at=args.at,
                down=args.down,
                timeout=args.timeout,
            )
        )
    print(f"# load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
