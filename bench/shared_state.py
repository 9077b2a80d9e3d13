"""Shared state through Redis (issue 13): ``python -m bench.shared_state``.

Two measurements, each against a real ``redis-server`` started on a free
port (persistence off) and fresh simulated hosts per run:

``overhead``
    One process, the two-hosts scenario of :mod:`bench.run` (A = 8 workers x
    20 ms, B = 2 x 50 ms, queue 16, 2000 + 300 pages, add-on defaults with
    ``CONCURRENT_REQUESTS_PER_DOMAIN = 32``, or ``--fixed N``: the plain
    scope manager with that limit), without and with
    :setting:`THROTTLING_STATE_URL`, alternating, ``--repeats`` times each:
    pages/s per host (the crawl's own figure, first send to last page), the
    ratio Redis / in-process of the same repeat, and Redis commands per
    request (``throttling/shared_state/command_count`` over the requests the
    host received), the wall time of those round trips per request and
    their share of the crawl's wall time
    (``throttling/shared_state/command_seconds``; each blocks the reactor
    thread); ``--trace`` adds host A's limit every 0.5 s, its baseline
    latency every second and its median and p90 latency.
``api``
    A rate-limited API (R requests in any sliding second, 429 +
    ``Retry-After: 1`` beyond) crawled by ``--processes`` processes with
    the add-on's defaults, shared and independent: pages/s over R, 429s,
    both overall and after the first 10 s; ``--trace`` adds each
    process's learned pace over time.
``quota``
    One host (unlimited) crawled by ``--processes`` processes whose scope
    has a quota (``--quota``: amount and window, default 20 per 2 s; 1
    unit a request), shared and independent: requests per quota window at
    the server (most and median), and requests/s over quota / window.
``processes``
    Host A crawled by ``--processes`` processes at once (each its share of
    ``--pages``), with a fixed scope concurrency, shared
    through Redis vs independent (each process its own 8): the most requests
    in service at the host (from the server's records), 503s, aggregate
    pages/s at the server (200s over first arrival to last answer), over
    A's capacity probed on this machine with exactly 8 in flight, and the
    same over the middle 80 % of the answers (without the crawl's start and
    the last process's tail). ``--limits``
    (default 8 and 16) gives the scope concurrencies to run: 8 is A's
    workers, 16 leaves room for Scrapy's turnaround within A's queue; with
    ``--adaptive`` (the default), also the add-on's latency-adaptive limit
    (its defaults, ``CONCURRENT_REQUESTS_PER_DOMAIN = 32`` as its ceiling),
    which the shared state makes one limit across the processes.
    ``--trace`` samples the shared rows' published limit and leases in
    Redis every 0.1 s and prints their means over the middle of the crawl
    beside the requests in service at the host and the machine's idle share.
    ``--service-ms`` sets A's service time (default 20 ms): a slower host
    asks less of the crawlers' CPU per second, to see the shared limit where
    the crawlers are not short of CPU.

Ratios only mean something within one run (2 shared cores); note ``uptime``
with the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.crawl import run_in_subprocess, start_in_subprocess
from bench.probe import probe
from bench.run import ADDON, HOST_A, HOST_B, PLAIN_SCOPE_MANAGER
from simhosts import SimHosts

ROOT = Path(__file__).resolve().parent.parent
#: Seconds of server time after which the API part counts as converged (as
#: in bench.ratelimit).
CONVERGED_AFTER = 10.0

#: The ceiling of the adaptive runs of the processes part (as the overhead
#: part's CONCURRENT_REQUESTS_PER_DOMAIN): room above A's 8 workers.
ADAPTIVE_CEILING = 32


class Redis:
    """A redis-server on a free loopback port, persistence off."""

    def __init__(self) -> None:
        sys.path.insert(0, str(ROOT))
        from tests.redis_server import RedisServer

        executable = shutil.which("redis-server")
        if executable is None:
            raise SystemExit(
                "redis-server is not installed (apt-get install redis-server)"
            )
        self.server = RedisServer(executable).start()
        self.url = self.server.url

    def flush(self) -> None:
        self.server.client().flushall()

    def close(self) -> None:
        self.server.cleanup()


def overhead(
    redis: Redis,
    repeats: int,
    pages: dict[str, int],
    fixed: int | None = None,
    trace: bool = False,
    *,
    before: Path | None = None,
) -> list[dict[str, Any]]:
    """Per repeat, one crawl in-process and one with the Redis backend (and,
    with *before*, one with the Redis backend of that checkout, the three in
    a shuffled order, so that the machine's drifts hit each alike)."""
    rows = []
    runs: list[tuple[str, dict[str, Any], Path | None]] = [
        ("in-process", {}, None),
        ("redis", {"THROTTLING_STATE_URL": redis.url}, None),
    ]
    if before is not None:
        runs.append(("before", {"THROTTLING_STATE_URL": redis.url}, before))
    for repeat in range(repeats):
        row: dict[str, Any] = {"repeat": repeat}
        order = list(runs)
        if before is not None:
            random.Random(repeat).shuffle(order)
        for name, extra, cwd in order:
            redis.flush()
            with SimHosts([HOST_A, HOST_B]) as hosts:
                settings = {
                    "ADDONS": ADDON,
                    "CONCURRENT_REQUESTS_PER_DOMAIN": fixed or 32,
                    **extra,
                }
                if fixed:
                    settings["THROTTLING_SCOPE_MANAGER"] = PLAIN_SCOPE_MANAGER
                config = {
                    "hosts": [
                        {"name": h, "url": hosts.url(h, "").rstrip("/"), "pages": n}
                        for h, n in pages.items()
                    ],
                    "settings": settings,
                    "per_host_slots": False,
                    "max_seconds": 120,
                }
                process, crawl = run_in_subprocess(config, timeout=240, cwd=cwd)
                if crawl is None:
                    raise SystemExit(process.stderr[-3000:])
                requests = sum(len(hosts.stats(h)["arrivals"]) for h in pages)
                result = {
                    host: crawl["hosts"][host]["pages_per_second"] for host in pages
                }
                result["503"] = sum(crawl["hosts"][host]["count_503"] for host in pages)
                fetched = sum(crawl["hosts"][host]["pages"] for host in pages)
                cpu = crawl.get("crawl_cpu_seconds")
                result["cpu_ms_per_page"] = 1000 * cpu / fetched if cpu else None
                commands = crawl["stats"].get("throttling/shared_state/command_count")
                result["commands_per_request"] = (
                    commands / requests if commands else None
                )
                # The round trips block the reactor thread: their wall time
                # per request, and their share of the crawl's wall time.
                waited = crawl["stats"].get("throttling/shared_state/command_seconds")
                wall = crawl["stats"].get("elapsed_time_seconds")
                result["redis_ms_per_request"] = (
                    1000 * waited / requests if waited else None
                )
                result["redis_share"] = waited / wall if waited and wall else None
                row[name] = result
                if trace:
                    # Host A's limit every 0.5 s (samples every 0.1 s).
                    limits = [
                        sample.get("limit")
                        for sample in crawl["hosts"]["A"]["state_samples"][::5]
                    ]
                    print(f"repeat {repeat}, {name}, A's limit: {limits}")
                    # Its baseline latency every second (ms), and the
                    # crawl's median and p90 download latency at A.
                    bests = [
                        None if best is None else round(1000 * best, 1)
                        for best in (
                            sample.get("best_latency")
                            for sample in crawl["hosts"]["A"]["state_samples"][::10]
                        )
                    ]
                    p50 = 1000 * crawl["hosts"]["A"]["latency_p50"]
                    p90 = 1000 * crawl["hosts"]["A"]["latency_p90"]
                    print(
                        f"  baseline (ms): {bests}; p50 {p50:.1f} ms, p90 {p90:.1f} ms"
                    )
        row["ratio"] = {
            host: row["redis"][host] / row["in-process"][host] for host in pages
        }
        if before is not None:
            row["before ratio"] = {
                host: row["before"][host] / row["in-process"][host] for host in pages
            }
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    return rows


class LeaseSampler:
    """Every 0.1 s while a crawl runs, host A's published limit and leases
    in the (private) Redis of the run, with the machine's CPU counters
    (``/proc/stat``): what the shared limit lets the processes take, to
    set against what is in service at the host (``processes --trace``)."""

    def __init__(self, redis_url: str) -> None:
        import threading

        import redis as redis_py

        self._client = redis_py.Redis.from_url(redis_url)
        self._stop = threading.Event()
        self.samples: list[tuple[float, int | None, int, list[int]]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LeaseSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self._client.close()

    def _run(self) -> None:
        client = self._client
        while not self._stop.wait(0.1):
            limit_keys = list(client.scan_iter(match="*:limit:*"))
            lease_keys = list(client.scan_iter(match="*:lease:*"))
            limit = client.get(limit_keys[0]) if limit_keys else None
            leases = client.zcard(lease_keys[0]) if lease_keys else 0
            with open("/proc/stat") as stat:
                cpu = [int(field) for field in stat.readline().split()[1:]]
            published = None if limit is None else int(limit)
            self.samples.append((time.time(), published, leases, cpu))

    def summary(
        self, intervals: list[tuple[float, float]], first_epoch: float
    ) -> dict[str, float | None] | None:
        """Means over the middle 80 % of the crawl (server time): the
        published limit (None: none was, as with a fixed limit), the
        leases, the requests in service at the host, and the machine's idle
        share (idle + iowait over all CPU time); and the highest published
        limit of the whole crawl (to set beside the most in service)."""
        start = min(begin for begin, _ in intervals)
        length = max(end for _, end in intervals) - start
        rows = []
        for epoch, limit, leases, cpu in self.samples:
            at = epoch - first_epoch
            if 0.1 * length <= at <= 0.9 * length:
                busy = sum(1 for b, e in intervals if b - start <= at < e - start)
                rows.append((limit, leases, busy, cpu))
        if len(rows) < 2:
            return None
        first, last = rows[0][3], rows[-1][3]
        spent = [after - before for before, after in zip(first, last, strict=True)]
        published = [row[0] for row in rows if row[0] is not None]
        every_limit = [sample[1] for sample in self.samples if sample[1] is not None]
        return {
            "limit": statistics.mean(published) if published else None,
            "highest_limit": max(every_limit, default=None),
            "leases": statistics.mean(row[1] for row in rows),
            "in_service": statistics.mean(row[2] for row in rows),
            "idle": (spent[3] + spent[4]) / sum(spent) if sum(spent) else 0.0,
        }


def crawl_processes(
    redis_url: str | None,
    processes: int,
    pages: int,
    limit: int | None,
    host: dict[str, Any] = HOST_A,
    *,
    quota: tuple[float, float] | None = None,
    trace: bool = False,
) -> dict[str, Any]:
    """*processes* crawling *host* (named A) at once; *limit* None: the
    add-on's adaptive limit (ceiling CONCURRENT_REQUESTS_PER_DOMAIN =
    ADAPTIVE_CEILING); *quota*: ``(quota, window)`` of A's scope, each
    request consuming 1; *trace* (with *redis_url*): a :class:`LeaseSampler`
    summary as ``"trace"``."""
    sampler = LeaseSampler(redis_url) if trace and redis_url else None
    with SimHosts([host]) as hosts:
        base = hosts.url("A", "").rstrip("/")
        settings: dict[str, Any] = {"ADDONS": ADDON}
        if limit is None:
            settings["CONCURRENT_REQUESTS_PER_DOMAIN"] = ADAPTIVE_CEILING
        else:
            settings["THROTTLING_SCOPE_MANAGER"] = PLAIN_SCOPE_MANAGER
            settings["THROTTLING_SCOPES"] = {hosts.netloc("A"): {"concurrency": limit}}
        meta: dict[str, Any] = {}
        if quota is not None:
            scopes = settings.setdefault("THROTTLING_SCOPES", {})
            entry = scopes.setdefault(hosts.netloc("A"), {})
            entry.update({"quota": quota[0], "window": quota[1]})
            meta = {"throttling_scopes": {hosts.netloc("A"): 1.0}}
        if redis_url is not None:
            settings["THROTTLING_STATE_URL"] = redis_url
            settings["THROTTLING_STATE_PROCESSES"] = processes
        running = []
        with tempfile.TemporaryDirectory() as tmp, sampler or contextlib.nullcontext():
            for index in range(processes):
                output = Path(tmp) / f"{index}.json"
                config = {
                    "hosts": [
                        {
                            "name": "A",
                            "url": f"{base}/p{index}",
                            "pages": pages // processes,
                            "meta": meta,
                        }
                    ],
                    "settings": settings,
                    "per_host_slots": False,
                    "max_seconds": 120,
                }
                running.append((start_in_subprocess(config, output), output))
            results = []
            for process, output in running:
                assert process.stderr is not None
                stderr = process.stderr.read()
                process.wait(240)
                if process.returncode != 0 or not output.exists():
                    raise SystemExit(stderr[-3000:])
                results.append(json.loads(output.read_text()))
        stats = hosts.stats("A")
    sys.path.insert(0, str(ROOT))
    from tests.server_checks import max_in_service, service_intervals

    intervals = service_intervals(stats)
    ok = [
        (start, end)
        for (start, end), record in zip(intervals, stats["arrivals"], strict=True)
        if record[3] == 200
    ]
    span = max(end for _, end in ok) - min(start for start, _ in intervals)
    commands = sum(
        r["stats"].get("throttling/shared_state/command_count", 0) for r in results
    )
    late = [record for record in stats["arrivals"] if record[0] >= CONVERGED_AFTER]
    # Server time (seconds from the first arrival), as the records are.
    last = max(end for _, end in ok) - stats["first_arrival_epoch"]
    late_span = last - CONVERGED_AFTER
    return {
        "pages": len(ok),
        "pages_per_second": len(ok) / span,
        "middle_pages_per_second": middle_rate(sorted(end for _, end in ok)),
        "late_pages_per_second": (
            sum(1 for record in late if record[3] == 200) / late_span
            if late_span > 0
            else None
        ),
        "late_429_per_10s": (
            10 * sum(1 for record in late if record[3] == 429) / late_span
            if late_span > 0
            else None
        ),
        "429": sum(1 for record in stats["arrivals"] if record[3] == 429),
        "max_in_service": max_in_service([stats]),
        "503": sum(1 for record in stats["arrivals"] if record[3] == 503),
        "commands_per_request": commands / len(stats["arrivals"]) if commands else None,
        "first_arrival_epoch": stats["first_arrival_epoch"],
        "arrival_times": sorted(record[0] for record in stats["arrivals"]),
        "process_results": results,
        "trace": (
            None
            if sampler is None
            else sampler.summary(intervals, stats["first_arrival_epoch"])
        ),
    }


COMMAND_PREFIX = "throttling/shared_state/command_count/"


def command_breakdown(result: dict[str, Any]) -> str:
    """Each process's Redis round trips by purpose (the
    ``throttling/shared_state/command_count/<purpose>`` stats): a check or
    release per request the process sent (``downloader/request_count``),
    the background ones (its leads, their publications) per second of its
    crawl, so that "one round trip per send and one per release at most"
    can be read off, apart from the leads' fixed cost per second."""
    lines = []
    for index, process in enumerate(result["process_results"]):
        stats = process["stats"]
        sent = stats.get("downloader/request_count") or 0
        seconds = stats.get("elapsed_time_seconds") or 0.0
        counts = {
            key[len(COMMAND_PREFIX) :]: value
            for key, value in stats.items()
            if key.startswith(COMMAND_PREFIX)
        }
        if not counts or not sent:
            continue
        total = sum(counts.values())
        per_request = ", ".join(
            f"{purpose} {counts[purpose] / sent:.2f}"
            for purpose in sorted(counts)
            if purpose not in ("lead", "publish")
        )
        background = ", ".join(
            f"{purpose} {counts[purpose] / seconds:.1f}/s"
            for purpose in ("lead", "publish")
            if purpose in counts and seconds
        )
        lines.append(
            f"  process {index}: {sent} requests, {total / sent:.2f} round trips "
            f"per request; per request: {per_request}; {background} "
            f"(= {sum(counts.get(p, 0) for p in ('lead', 'publish')) / sent:.2f} "
            "per request)"
        )
    return "\n".join(lines)


def middle_rate(ends: list[float], share: float = 0.8) -> float | None:
    """Pages/s over the middle *share* of the answers (sorted end times):
    the rate once the crawl has started and before its tail, where the
    whole-crawl figure also counts slow start and the last process's end."""
    count = len(ends)
    low, high = round(count * (1 - share) / 2), round(count * (1 + share) / 2) - 1
    if high <= low or ends[high] <= ends[low]:
        return None
    return (high - low) / (ends[high] - ends[low])


#: Server times (seconds from the first arrival) at which the API part's
#: trace reads each process's learned pace.
TRACE_TIMES = (2.0, 5.0, 10.0, 20.0, 40.0, 60.0, 90.0)


def pace_trace(result: dict[str, Any], rate: float) -> str:
    """Each process's learned pace (requests/s, 1 / its learned interval)
    at :data:`TRACE_TIMES`, and their sum over R (what the processes
    believe the API allows them together), or, when every process has the
    same pace (one shared pace), that pace over R."""
    first = result["first_arrival_epoch"]
    lines = []
    for at in TRACE_TIMES:
        paces = []
        for crawl in result["process_results"]:
            samples = crawl["hosts"]["A"]["state_samples"]
            before = [s for s in samples if s["t"] - first <= at]
            interval = before[-1].get("learned_interval") if before else None
            paces.append(1 / interval if interval else None)
        known = [pace for pace in paces if pace is not None]
        shown = " ".join("-" if p is None else f"{p:.1f}" for p in paces)
        if not known:
            total = "-"
        elif len(known) == len(paces) and max(known) - min(known) < 0.05:
            total = f"one pace, / R {known[0] / rate:.2f}"  # shared: one pace
        else:
            total = f"sum / R {sum(known) / rate:.2f}"
        lines.append(f"    t = {at:4.0f} s: paces {shown} req/s, {total}")
    return "\n".join(lines)


def api(
    redis: Redis, processes: int, pages: int, rate: float, trace: bool = False
) -> None:
    """The rate-limited API crawled by *processes* processes, shared or not;
    with *trace*, each process's learned pace over time after the table."""
    host = {"name": "A", "kind": "ratelimit", "rate": rate, "service_time": 0.01}
    print(
        f"\n## {processes} processes, a rate-limited API (R = {rate:g} requests/s "
        "in any sliding second, 429 + Retry-After: 1 beyond); add-on defaults, "
        f"CONCURRENT_REQUESTS_PER_DOMAIN = {ADAPTIVE_CEILING}"
    )
    print(
        "| configuration | pages | pages/s / R | after 10 s: pages/s / R "
        "| 429s | after 10 s: 429s per 10 s | Redis commands / request |"
    )
    print("|---|---|---|---|---|---|---|")
    traces = []
    for name, url in (("shared (Redis)", redis.url), ("independent", None)):
        redis.flush()
        time.sleep(0.5)
        result = crawl_processes(url, processes, pages, None, host)
        traces.append((name, result))
        commands = result["commands_per_request"]
        late = result["late_pages_per_second"]
        late_429 = result["late_429_per_10s"]
        print(
            f"| {name} | {result['pages']} | "
            f"{result['pages_per_second'] / rate:.3f} | "
            f"{'-' if late is None else f'{late / rate:.3f}'} | {result['429']} | "
            f"{'-' if late_429 is None else f'{late_429:.2f}'} | "
            f"{'-' if commands is None else f'{commands:.2f}'} |"
        )
    breakdown = command_breakdown(traces[0][1])
    if breakdown:
        print(f"Redis round trips of each process, shared:\n{breakdown}")
    if trace:
        for name, result in traces:
            print(f"learned pace per process, {name}:\n{pace_trace(result, rate)}")


def quota_windows(times: list[float], window: float) -> list[int]:
    """Requests at the server per quota window, counted between the middles
    of the windows the first arrival started (a window's quota goes in a
    burst at its start: a burst seen a few ms early stays in its window)."""
    counts: dict[int, int] = {}
    for arrival in times:
        index = int((arrival - times[0] + window / 2) // window)
        counts[index] = counts.get(index, 0) + 1
    return [counts.get(index, 0) for index in range(max(counts) + 1)]


def quota_part(
    redis: Redis, processes: int, pages: int, quota: float, window: float
) -> None:
    """*processes* processes spending a quota of *quota* per *window* on one
    host (unlimited, 10 ms a request), shared or not, counted at the server."""
    host = {"name": "A", "kind": "unlimited", "service_time": 0.01}
    print(
        f"\n## {processes} processes, a quota of {quota:g} per {window:g} s on one "
        "host (1 unit a request); add-on defaults"
    )
    print(
        "| configuration | requests | windows | most in a window | median "
        "| requests/s / (quota / window) | Redis commands / request |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, url in (("shared (Redis)", redis.url), ("independent", None)):
        redis.flush()
        time.sleep(0.5)
        result = crawl_processes(
            url, processes, pages, None, host, quota=(quota, window)
        )
        counts = quota_windows(result["arrival_times"], window)
        times = result["arrival_times"]
        rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
        commands = result["commands_per_request"]
        print(
            f"| {name} | {len(times)} | {len(counts)} | {max(counts)} | "
            f"{statistics.median(counts):g} | {rate / (quota / window):.2f} | "
            f"{'-' if commands is None else f'{commands:.2f}'} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--part",
        choices=["overhead", "processes", "api", "quota", "all"],
        default="all",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--pages", type=int, default=2400)
    parser.add_argument(
        "--limits",
        default="8,16",
        help="scope concurrencies of the processes part, comma-separated",
    )
    parser.add_argument(
        "--adaptive",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="processes part: also the add-on's adaptive limit (defaults, "
        f"CONCURRENT_REQUESTS_PER_DOMAIN = {ADAPTIVE_CEILING}), shared and not",
    )
    parser.add_argument(
        "--rate", type=float, default=50.0, help="api part: the API's R, requests/s"
    )
    parser.add_argument("--api-pages", type=int, default=2500)
    parser.add_argument(
        "--quota",
        default="20,2",
        help="quota part: the quota and its window (s), comma-separated",
    )
    parser.add_argument("--quota-pages", type=int, default=400)
    parser.add_argument(
        "--service-ms",
        type=float,
        default=1000 * HOST_A["service_time"],
        help="processes part: host A's service time per page, ms (8 workers; "
        "a slower host needs less of the crawlers' CPU per second)",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="api part: also print each process's learned pace over time; "
        "overhead part: host A's limit, baseline and latency; processes "
        "part: host A's published limit, its leases and the requests in "
        "service there (means over the middle of the crawl), and the "
        "machine's idle share",
    )
    parser.add_argument("--quick", action="store_true", help="fewer pages")
    parser.add_argument(
        "--fixed",
        type=int,
        default=0,
        help="overhead part: this fixed limit per host (plain scope manager) "
        "instead of the add-on's adaptive one",
    )
    parser.add_argument(
        "--before",
        type=Path,
        default=None,
        help="overhead part: also crawl with the Redis backend of this checkout "
        "(e.g. a git worktree of an earlier commit), the runs of each repeat "
        "in a shuffled order",
    )
    args = parser.parse_args(argv)
    redis = Redis()
    try:
        if args.part in ("overhead", "all"):
            pages = {"A": 600, "B": 100} if args.quick else {"A": 2000, "B": 300}
            rows = overhead(
                redis,
                args.repeats,
                pages,
                args.fixed or None,
                args.trace,
                before=args.before,
            )
            limit = f"fixed limit {args.fixed}" if args.fixed else "adaptive limit"
            print(f"## overhead: one process, two hosts {pages}, {limit}")
            print(
                "| repeat | A in-process | A redis | ratio | B in-process | B redis | "
                "ratio | 503s (in/redis) | Redis commands / request | "
                "crawl CPU ms/page (in/redis) | Redis wait ms/request | "
                "Redis wait / crawl wall time |"
            )
            print("|---|---|---|---|---|---|---|---|---|---|---|---|")
            for row in rows:
                inp, red, ratio = row["in-process"], row["redis"], row["ratio"]
                print(
                    f"| {row['repeat']} | {inp['A']:.0f} | {red['A']:.0f} | "
                    f"{ratio['A']:.3f} | {inp['B']:.1f} | {red['B']:.1f} | "
                    f"{ratio['B']:.3f} | {inp['503']}/{red['503']} | "
                    f"{red['commands_per_request']:.2f} | "
                    f"{inp['cpu_ms_per_page']:.2f}/{red['cpu_ms_per_page']:.2f} | "
                    f"{red['redis_ms_per_request']:.3f} | {red['redis_share']:.2f} |"
                )
            for host in pages:
                median = statistics.median(row["ratio"][host] for row in rows)
                print(f"median ratio redis / in-process, host {host}: {median:.3f}")
            if args.before is not None:
                print(f"\n## the same repeats, Redis backend of {args.before}")
                print(
                    "| repeat | A before | ratio | B before | ratio | "
                    "Redis commands / request | crawl CPU ms/page |"
                )
                print("|---|---|---|---|---|---|---|")
                for row in rows:
                    old, ratio = row["before"], row["before ratio"]
                    print(
                        f"| {row['repeat']} | {old['A']:.0f} | {ratio['A']:.3f} | "
                        f"{old['B']:.1f} | {ratio['B']:.3f} | "
                        f"{old['commands_per_request']:.2f} | "
                        f"{old['cpu_ms_per_page']:.2f} |"
                    )
                for host in pages:
                    median = statistics.median(
                        row["before ratio"][host] for row in rows
                    )
                    print(
                        f"median ratio redis (before) / in-process, host {host}: "
                        f"{median:.3f}"
                    )
                for name in ("in-process", "redis", "before"):
                    median = statistics.median(row[name]["A"] for row in rows)
                    print(f"median pages/s at A, {name}: {median:.0f}")
        if args.part in ("processes", "all"):
            host_a = {**HOST_A, "service_time": args.service_ms / 1000}
            with SimHosts([host_a]) as hosts:
                capacity = probe(hosts.url("A", "").rstrip("/"), 8, 2000)
            ceiling = capacity["pages_per_second"]
            print(
                f"\n## {args.processes} processes, host A (8 workers x "
                f"{args.service_ms:g} ms, queue 16); probed capacity (8 in flight): "
                f"{ceiling:.0f} pages/s"
            )
            print(
                "| configuration | pages | pages/s | / capacity | middle 80 % of "
                "answers: pages/s / capacity | max in service "
                "| 503s | Redis commands / request |"
            )
            print("|---|---|---|---|---|---|---|---|")
            shared_or_not = (("shared (Redis)", redis.url), ("independent", None))
            runs: list[tuple[str, str | None, int | None]] = [
                (f"{name}, concurrency {limit}", url, int(limit))
                for limit in args.limits.split(",")
                if limit
                for name, url in shared_or_not
            ]
            if args.adaptive:
                runs += [
                    (f"{name}, adaptive (add-on defaults)", url, None)
                    for name, url in shared_or_not
                ]
            traced: list[tuple[str, dict[str, Any]]] = []
            for name, url, limit in runs:
                redis.flush()
                time.sleep(0.5)
                result = crawl_processes(
                    url, args.processes, args.pages, limit, host_a, trace=args.trace
                )
                commands = result["commands_per_request"]
                speed = result["pages_per_second"]
                middle = result["middle_pages_per_second"]
                middle_text = (
                    "-" if middle is None else f"{middle:.0f} / {middle / ceiling:.2f}"
                )
                print(
                    f"| {name} | {result['pages']} | {speed:.0f} | "
                    f"{speed / ceiling:.2f} | {middle_text} | "
                    f"{result['max_in_service']} | {result['503']} | "
                    f"{'-' if commands is None else f'{commands:.2f}'} |"
                )
                if args.trace:
                    traced.append((name, result))
            for name, result in traced:
                breakdown = command_breakdown(result)
                if breakdown:
                    print(f"Redis round trips of each process, {name}:\n{breakdown}")
                cpu = sum(
                    r.get("crawl_cpu_seconds") or 0.0 for r in result["process_results"]
                )
                per_page = 1000 * cpu / result["pages"]
                line = f"trace, {name}: crawl CPU {per_page:.2f} ms/page"
                summary = result["trace"]
                if summary is not None:
                    limit = summary["limit"]
                    highest = summary["highest_limit"]
                    if highest is not None:
                        line += f"; highest published limit {highest}"
                    line += (
                        "; means over the middle 80 % of the crawl: published "
                        f"limit {'-' if limit is None else f'{limit:.1f}'}, leases "
                        f"{summary['leases']:.1f}, in service at the host "
                        f"{summary['in_service']:.1f}; machine idle "
                        f"{summary['idle']:.0%}"
                    )
                print(line)
        if args.part in ("api", "all"):
            api(redis, args.processes, args.api_pages, args.rate, args.trace)
        if args.part in ("quota", "all"):
            amount, window = (float(value) for value in args.quota.split(","))
            quota_part(redis, args.processes, args.quota_pages, amount, window)
    finally:
        redis.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
