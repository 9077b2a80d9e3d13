"""scrapy-redis's scheduler (issue 13): ``python -m bench.scrapy_redis``.

Does a slow host hold back a fast one when requests come from scrapy-redis's
shared Redis queue? A real ``redis-server`` (persistence off) holds one FIFO
queue (``scrapy_redis.queue.FifoQueue``), filled before the crawl with
``--slow-pages`` pages of S and ``--fast-pages`` of F, interleaved evenly
(one of S, then F's share, and so on), as a shared queue of a crawl over
several sites is. Fresh simulated hosts per run:

* S: 2 workers x 0.5 s, a queue of 16 in front of them (503 when full): a
  host that allows 2 requests in flight, 4 pages/s;
* F: 8 workers x 20 ms, a queue of 16 (about 400 pages/s).

Each request carries ``download_slot`` = its host, so plain Scrapy keeps one
slot per host. ``CONCURRENT_REQUESTS`` is 16 in each of ``--processes``
crawler processes (``python -m bench.crawl``, no start requests of their
own: they crawl what the queue holds). Rows:

``plain scrapy-redis``
    scrapy-redis's scheduler, no plugin; S limited by Scrapy's own
    ``DOWNLOAD_SLOTS`` (concurrency 2), F by
    ``CONCURRENT_REQUESTS_PER_DOMAIN`` = 16.
``plugin, gate only``
    the add-on with a scrapy-redis scheduler it leaves in place
    (:class:`GateOnlyScheduler`, a plain subclass), so throttling happens at
    the downloader middleware gate: the plugin as it was before issue 13.
``plugin, ThrottlingRedisScheduler``
    the add-on with ``scrapy_redis.scheduler.Scheduler``, which it replaces
    with :class:`~scrapy_adaptive_throttle.redis_scheduler.ThrottlingRedisScheduler`.

Both plugin rows use the plain scope manager with fixed limits, S 2 and F 16
(and, with several processes, :setting:`THROTTLING_STATE_URL` on the same
Redis, so the limits hold across them). Reported: F's pages/s (its pages
over the time from the first request sent to F's last page, across
processes), when F's and S's last pages came (seconds from the first send),
the most requests in service at each host (the server's records), and the
503s and 429s the hosts sent.

Ratios only mean something within one run (2 shared cores); note ``uptime``
with the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from scrapy_redis.scheduler import Scheduler

from bench.crawl import start_in_subprocess
from bench.shared_state import ROOT, Redis
from simhosts import SimHosts

SLOW = {"name": "S", "kind": "queue", "workers": 2, "service_time": 0.5}
FAST = {"name": "F", "kind": "queue", "workers": 8, "service_time": 0.02}
SLOW_LIMIT = 2
FAST_LIMIT = 16
PLAIN_SCOPE_MANAGER = "scrapy_adaptive_throttle.ThrottlingScopeManager"
ADDON = {"scrapy_adaptive_throttle.Addon": 500}


class GateOnlyScheduler(Scheduler):  # type: ignore[misc]
    """scrapy-redis's scheduler under another name: the add-on leaves a
    subclass in place, so requests are throttled at the gate only."""


def seed(redis_url: str, key: str, hosts: SimHosts, slow: int, fast: int) -> int:
    """Fill the Redis queue *key* with S's and F's pages, interleaved."""
    import redis
    from scrapy import Request
    from scrapy_redis import picklecompat
    from scrapy_redis.queue import FifoQueue

    from bench.crawl import BenchSpider

    spider = BenchSpider(hosts=[])
    queue = FifoQueue(
        redis.Redis.from_url(redis_url), spider, key, serializer=picklecompat
    )
    order: list[tuple[str, int]] = []
    per_slow = fast / slow
    made_fast = 0
    for index in range(slow):
        order.append(("S", index))
        target = round((index + 1) * per_slow)
        order.extend(("F", page) for page in range(made_fast, target))
        made_fast = target
    for name, index in order:
        netloc = hosts.netloc(name)
        queue.push(
            Request(
                hosts.url(name, f"/page/{index}"),
                callback=spider.parse,
                errback=spider.on_error,
                dont_filter=True,
                meta={"download_slot": netloc},
            )
        )
    return len(order)


def settings_for(
    row: str, hosts: SimHosts, redis_url: str, key: str, processes: int
) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "CONCURRENT_REQUESTS": 16,
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        "SCHEDULER_QUEUE_CLASS": "scrapy_redis.queue.FifoQueue",
        "SCHEDULER_QUEUE_KEY": key,
        "SCHEDULER_DUPEFILTER_KEY": f"{key}:dupefilter",
        "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
        "SCHEDULER_PERSIST": True,  # the processes share the queue to the end
        "REDIS_URL": redis_url,
    }
    if row == "plain":
        settings["CONCURRENT_REQUESTS_PER_DOMAIN"] = FAST_LIMIT
        settings["DOWNLOAD_SLOTS"] = {hosts.netloc("S"): {"concurrency": SLOW_LIMIT}}
        return settings
    settings["ADDONS"] = ADDON
    settings["THROTTLING_SCOPE_MANAGER"] = PLAIN_SCOPE_MANAGER
    settings["THROTTLING_SCOPES"] = {
        hosts.netloc("S"): {"concurrency": SLOW_LIMIT},
        hosts.netloc("F"): {"concurrency": FAST_LIMIT},
    }
    if row == "gate":
        settings["SCHEDULER"] = "bench.scrapy_redis.GateOnlyScheduler"
    if processes > 1:
        settings["THROTTLING_STATE_URL"] = redis_url
        settings["THROTTLING_STATE_PROCESSES"] = processes
    return settings


def run_row(
    row: str, redis: Redis, processes: int, slow: int, fast: int
) -> dict[str, Any]:
    key = f"bench:{uuid.uuid4().hex}:requests"
    with SimHosts([SLOW, FAST]) as hosts:
        queued = seed(redis.url, key, hosts, slow, fast)
        settings = settings_for(row, hosts, redis.url, key, processes)
        config = {
            "hosts": [
                {"name": name, "url": hosts.url(name, "").rstrip("/"), "pages": 0}
                for name in ("S", "F")
            ],
            "settings": settings,
            "per_host_slots": False,
            "max_seconds": 300,
        }
        results = []
        with tempfile.TemporaryDirectory() as tmp:
            running = []
            for index in range(processes):
                output = Path(tmp) / f"{index}.json"
                process = start_in_subprocess(config, output)
                running.append((process, output))
            for process, output in running:
                assert process.stderr is not None
                stderr = process.stderr.read()
                process.wait(600)
                if process.returncode != 0 or not output.exists():
                    raise SystemExit(stderr[-3000:])
                results.append(json.loads(output.read_text()))
        server = {name: hosts.stats(name) for name in ("S", "F")}
    sys.path.insert(0, str(ROOT))
    from tests.server_checks import max_in_service

    def host_figure(name: str, field: str) -> list[Any]:
        return [
            r["hosts"][name][field]
            for r in results
            if r["hosts"][name][field] is not None
        ]

    first_sent = min(
        min(host_figure(name, "first_sent_epoch"), default=float("inf"))
        for name in ("S", "F")
    )
    fast_last = max(host_figure("F", "last_page_epoch"))
    slow_last = max(host_figure("S", "last_page_epoch"))
    fast_pages = sum(host_figure("F", "pages"))
    slow_pages = sum(host_figure("S", "pages"))
    statuses = {
        name: [record[3] for record in stats["arrivals"]]
        for name, stats in server.items()
    }
    return {
        "queued": queued,
        "fast_pages": fast_pages,
        "slow_pages": slow_pages,
        "fast_pages_per_second": fast_pages / (fast_last - first_sent),
        "fast_done_after": fast_last - first_sent,
        "slow_done_after": slow_last - first_sent,
        "total": max(fast_last, slow_last) - first_sent,
        "max_in_service": {
            name: max_in_service([stats]) for name, stats in server.items()
        },
        "503": sum(s.count(503) for s in statuses.values()),
        "429": sum(s.count(429) for s in statuses.values()),
        "left_in_redis": redis.server.client().llen(key),
    }


ROWS = {
    "plain": "plain scrapy-redis (no plugin)",
    "gate": "plugin, gate only",
    "scheduler": "plugin, ThrottlingRedisScheduler",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", default="1,2", help="comma-separated")
    parser.add_argument("--slow-pages", type=int, default=100)
    parser.add_argument("--fast-pages", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rows", default=",".join(ROWS))
    args = parser.parse_args(argv)
    redis = Redis()
    try:
        for processes in (int(p) for p in args.processes.split(",") if p):
            print(
                f"\n## {processes} process(es), CONCURRENT_REQUESTS 16 each; "
                f"S {args.slow_pages} pages (2 workers x 0.5 s, limit 2), "
                f"F {args.fast_pages} pages (8 workers x 20 ms, limit 16), "
                "interleaved in one Redis FIFO queue"
            )
            print(
                "| configuration | pages S/F | F pages/s | F done after (s) "
                "| S done after (s) | total (s) | max in service S/F | 503s | 429s |"
            )
            print("|---|---|---|---|---|---|---|---|---|")
            for _ in range(args.repeats):
                for row in args.rows.split(","):
                    redis.flush()
                    time.sleep(0.5)
                    result = run_row(
                        row, redis, processes, args.slow_pages, args.fast_pages
                    )
                    print(json.dumps({"row": row, **result}), file=sys.stderr)
                    peak = result["max_in_service"]
                    print(
                        f"| {ROWS[row]} | {result['slow_pages']}/"
                        f"{result['fast_pages']} | "
                        f"{result['fast_pages_per_second']:.0f} | "
                        f"{result['fast_done_after']:.1f} | "
                        f"{result['slow_done_after']:.1f} | "
                        f"{result['total']:.1f} | {peak['S']}/{peak['F']} | "
                        f"{result['503']} | {result['429']} |",
                        flush=True,
                    )
    finally:
        redis.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
