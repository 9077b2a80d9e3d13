"""Soak: a long crawl of many hosts and thousands of scopes, with faults.

``python -m bench.soak [--minutes N]`` runs the same crawl twice, one after
the other (never at once: each gets the machine's two cores to share only
with the simulated hosts), with the plugin and with plain Scrapy, each in a
fresh process, and prints a table over time for each and a summary:

- **pages lost**: pages yielded (start requests and links yielded from
  callbacks) that ended neither in their callback nor in their errback; it
  must be 0. Pages that ended twice are counted too (also 0);
- **requests**: scheduled (every request the engine scheduled: pages,
  retries, redirects) and received by the servers (a connection reset on a
  reused connection is resent once by Twisted itself, so the servers may
  see a few more);
- **scopes alive** over time (the plugin's scope states in memory): every
  page is in its host's scope and its site's (``throttling_scopes`` meta),
  sites come and go, and :setting:`THROTTLING_SCOPE_MAX_IDLE` is short, so
  eviction must keep the count bounded;
- **RSS** of the crawl process over time (it must stay flat).

The crawl: ``--hosts`` simulated hosts (one port each; default 200) of four
kinds (fast and slow pages, a queue host that sheds 503 + Retry-After, a
host rate-limited with 429 + Retry-After), and ``--sites`` sites crawled at
once (default 48), each a small link tree of 13 pages on one host, the site
scope of concurrency 1. When a site is done, a new one starts, until the
time is up; then the crawl drains and closes. 3% of pages answer 500, 2%
reset the connection, 1% answer 503 with ``Retry-After: 2``, every time (so
they are retried, then reach their errback). Service times of 50 ms to 1.5
s and ``CONCURRENT_REQUESTS = 16`` keep the crawl at a few dozen pages a
second: the machine is shared, this measures losses and growth, not speed.

Memory: the spider keeps one byte per page and the set of pages in flight,
so what grows is the crawler's, not the benchmark's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGES_PER_SITE = 13  # a root, 3 children, 9 grandchildren
FAULTS = (
    ("status=500", 0.03),
    ("drop=1", 0.02),
    ("status=503&header=Retry-After:2", 0.01),
)


def host_configs(count: int, seed: int = 8) -> list[dict[str, Any]]:
    """*count* hosts: 60% fast-ish, 10% slow, 20% shedding 503, 10% 429."""
    rng = random.Random(seed)
    hosts: list[dict[str, Any]] = []
    for index in range(count):
        roll = index % 10
        name = f"h{index}"
        if roll < 6:
            hosts.append(
                {
                    "name": name,
                    "kind": "unlimited",
                    "service_time": round(rng.uniform(0.05, 0.4), 3),
                }
            )
        elif roll < 7:
            hosts.append({"name": name, "kind": "unlimited", "service_time": 1.5})
        elif roll < 9:
            hosts.append(
                {
                    "name": name,
                    "kind": "queue",
                    "workers": 2,
                    "service_time": 0.1,
                    "queue_size": 2,
                    "retry_after": 1,
                }
            )
        else:
            hosts.append(
                {"name": name, "kind": "ratelimit", "rate": 3, "retry_after": 1}
            )
    return hosts


# ---------------------------------------------------------------------------
# The crawl (runs in a child process: python -m bench.soak --child JSON)
# ---------------------------------------------------------------------------


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def run_child(config: dict[str, Any]) -> None:
    from scrapy import Request, Spider, signals
    from scrapy.crawler import CrawlerProcess
    from scrapy.spidermiddlewares.httperror import HttpError

    bases: list[str] = config["bases"]
    duration = config["minutes"] * 60.0
    interval = config["interval"]
    plugin = config["plugin"]

    class SoakSpider(Spider):
        name = "soak"

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.ends = bytearray()  # one byte per page: times it ended
            self.pending: set[int] = set()
            self.site_left: dict[int, int] = {}
            self.next_site = 0
            self.requests_scheduled = 0
            self.resets_scheduled = 0
            self.closed = False
            self.answered = 0
            self.failed = 0
            self.started = time.monotonic()
            self.samples: list[dict[str, Any]] = []

        @classmethod
        def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> Any:
            spider = super().from_crawler(crawler, *args, **kwargs)
            crawler.signals.connect(spider._scheduled, signal=signals.request_scheduled)
            crawler.signals.connect(spider._opened, signal=signals.spider_opened)
            crawler.signals.connect(spider._closed, signal=signals.spider_closed)
            return spider

        def _scheduled(self, request: Request) -> None:
            self.requests_scheduled += 1
            if "drop=1" in request.url:
                self.resets_scheduled += 1

        def _closed(self) -> None:
            self.closed = True

        def _opened(self) -> None:
            from twisted.internet import reactor

            def sample() -> None:
                self.sample()
                if not self.closed:
                    reactor.callLater(interval, sample)  # type: ignore[attr-defined]

            reactor.callLater(0, sample)  # type: ignore[attr-defined]

        def sample(self) -> None:
            throttler = getattr(self.crawler, "throttler", None)
            engine = self.crawler.engine
            scheduler = engine._slot.scheduler if engine._slot else None
            row = {
                "t": round(time.monotonic() - self.started, 1),
                "ended": self.answered + self.failed,
                "failed": self.failed,
                "pending_pages": len(self.pending),
                "queued": len(scheduler) if scheduler is not None else 0,
                "scopes": len(getattr(throttler, "_scope_managers", ())),
                "sites_started": self.next_site,
                "rss_mb": round(rss_bytes() / 2**20, 1),
            }
            self.samples.append(row)
            print("SAMPLE " + json.dumps(row), flush=True)

        def page_request(self, site: int, path: str, depth_left: int) -> Request:
            number = len(self.ends)
            self.ends.append(0)
            self.pending.add(number)
            rng = random.Random(number * 7919 + 17)
            query = ""
            roll = rng.random()
            for fault, share in FAULTS:
                if roll < share:
                    query = "?" + fault
                    break
                roll -= share
            base = bases[site % len(bases)]
            netloc = base.split("://", 1)[1]
            return Request(
                f"{base}/site{site}/{path}{query}",
                callback=self.parse,
                errback=self.on_error,
                dont_filter=True,
                meta={
                    "page": number,
                    "site": site,
                    "path": path,
                    "depth_left": depth_left,
                    "throttling_scopes": [netloc, f"site-{site}"],
                },
            )

        def new_site(self) -> Request:
            site = self.next_site
            self.next_site += 1
            self.site_left[site] = PAGES_PER_SITE
            return self.page_request(site, "p", 2)

        async def start(self) -> Any:
            for _ in range(config["sites"]):
                yield self.new_site()

        def _end(self, meta: dict[str, Any]) -> list[Request]:
            number = meta["page"]
            self.ends[number] += 1
            self.pending.discard(number)
            site = meta["site"]
            self.site_left[site] -= 1
            follow: list[Request] = []
            if self.site_left[site] == 0:
                del self.site_left[site]
                if time.monotonic() - self.started < duration:
                    follow.append(self.new_site())
            return follow

        def parse(self, response: Any) -> Any:
            self.answered += 1
            meta = response.meta
            follow = self._end(meta)
            depth_left = meta["depth_left"]
            if depth_left > 0:
                follow.extend(
                    self.page_request(
                        meta["site"], f"{meta['path']}.{k}", depth_left - 1
                    )
                    for k in range(3)
                )
            return follow

        def on_error(self, failure: Any) -> Any:
            self.failed += 1
            if isinstance(failure.value, HttpError):
                meta = failure.value.response.meta
            else:
                meta = failure.request.meta
            # A failed page has no links: its subtree counts as done.
            site = meta["site"]
            lost_subtree = sum(3**level for level in range(1, meta["depth_left"] + 1))
            self.site_left[site] -= lost_subtree
            return self._end(meta)

    settings: dict[str, Any] = {
        "LOG_LEVEL": "ERROR",
        "TELNETCONSOLE_ENABLED": False,
        "ROBOTSTXT_OBEY": False,
        "CONCURRENT_REQUESTS": 16,
        # Every simulated host is 127.0.0.1: plain Scrapy puts them all in
        # one download slot, which must not be the bottleneck.
        "CONCURRENT_REQUESTS_PER_DOMAIN": 16,
        "DOWNLOAD_DELAY": 0,
        "RETRY_TIMES": 2,
        "DOWNLOAD_TIMEOUT": 30,
        "CLOSESPIDER_TIMEOUT": duration + 600,
        "MEMUSAGE_ENABLED": False,
    }
    if plugin:
        settings.update(
            {
                "ADDONS": {"scrapy_adaptive_throttle.Addon": 500},
                "THROTTLING_SCOPE_MAX_IDLE": config["max_idle"],
                # A resetting or failing page backs its host off; keep the
                # steps short so one bad page does not stall a host for minutes.
                "BACKOFF_MAX_DELAY": 5.0,
            }
        )
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(SoakSpider)
    process.crawl(crawler)
    process.start()
    spider = crawler.spider
    spider.sample()
    stats = crawler.stats.get_stats()
    result = {
        "plugin": plugin,
        "finish_reason": stats.get("finish_reason"),
        "pages": len(spider.ends),
        "answered": spider.answered,
        "failed": spider.failed,
        "lost": sum(1 for ends in spider.ends if ends == 0),
        "ended_twice": sum(1 for ends in spider.ends if ends > 1),
        "requests_scheduled": spider.requests_scheduled,
        "resets_scheduled": spider.resets_scheduled,
        "sites": spider.next_site,
        "elapsed": round(time.monotonic() - spider.started, 1),
        "retry_count": stats.get("retry/count", 0),
        "gave_up": stats.get("retry/max_reached", 0),
        "samples": spider.samples,
    }
    print("RESULT " + json.dumps(result), flush=True)


# ---------------------------------------------------------------------------
# The parent: hosts, the two crawls, the report
# ---------------------------------------------------------------------------


def run_one(
    hosts: Any, config: dict[str, Any], *, plugin: bool, cwd: Path
) -> dict[str, Any]:
    hosts.reset()
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.soak",
                "--child",
                json.dumps({**config, "plugin": plugin}),
            ],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        result: dict[str, Any] | None = None
        label = "plugin" if plugin else "plain Scrapy"
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("SAMPLE "):
                row = json.loads(line[7:])
                print(
                    f"  [{label}] t={row['t']:>6}s ended={row['ended']:>6} "
                    f"scopes={row['scopes']:>5} rss={row['rss_mb']} MB",
                    file=sys.stderr,
                    flush=True,
                )
            elif line.startswith("RESULT "):
                result = json.loads(line[7:])
        process.wait()
        if result is None:
            stderr.seek(0)
            tail = stderr.read().decode(errors="replace")[-3000:]
            raise RuntimeError(f"the {label} crawl printed no result:\n{tail}")
    at_server = resets = 0
    for name in hosts.ports:
        arrivals = hosts.stats(name)["arrivals"]
        at_server += len(arrivals)
        resets += sum(1 for record in arrivals if "drop=1" in record[1])
    result["requests_at_server"] = at_server
    result["resets_at_server"] = resets
    return result


def print_report(results: list[dict[str, Any]], config: dict[str, Any]) -> None:
    for result in results:
        label = "with the plugin" if result["plugin"] else "plain Scrapy"
        print(f"\n{label}:")
        print(
            f"{'t s':>7} {'pages ended':>11} {'failed':>7} {'pending':>9} "
            f"{'queued':>7} {'scopes':>7} {'RSS MB':>7}"
        )
        samples = result["samples"]
        # At most ~12 rows: every k-th sample, and the last one.
        step = max(1, len(samples) // 11)
        rows = samples[::step]
        if rows[-1] is not samples[-1]:
            rows.append(samples[-1])
        for row in rows:
            print(
                f"{row['t']:>7} {row['ended']:>11} {row['failed']:>7} "
                f"{row['pending_pages']:>9} {row['queued']:>7} "
                f"{row['scopes']:>7} {row['rss_mb']:>7}"
            )
    print("\nsummary:")
    print(
        f"{'crawl':<13} {'finish':<9} {'time s':>7} {'pages':>6} {'lost':>4} "
        f"{'twice':>5} {'failed':>6} {'sites':>5} {'scheduled (resets)':>18} "
        f"{'at server (resets)':>18} {'max scopes':>10} {'RSS MB 2nd half':>15}"
    )
    for result in results:
        samples = result["samples"]
        rss = [row["rss_mb"] for row in samples[len(samples) // 2 :]]
        scheduled = f"{result['requests_scheduled']} ({result['resets_scheduled']})"
        at_server = f"{result['requests_at_server']} ({result['resets_at_server']})"
        print(
            f"{'plugin' if result['plugin'] else 'plain Scrapy':<13} "
            f"{result['finish_reason']:<9} {result['elapsed']:>7} "
            f"{result['pages']:>6} {result['lost']:>4} {result['ended_twice']:>5} "
            f"{result['failed']:>6} {result['sites']:>5} {scheduled:>18} "
            f"{at_server:>18} {max(row['scopes'] for row in samples):>10} "
            f"{f'{min(rss)}-{max(rss)}':>15}"
        )
    print(f"\nconfig: {json.dumps({k: v for k, v in config.items() if k != 'bases'})}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--sites", type=int, default=48, help="sites crawled at once")
    parser.add_argument(
        "--max-idle", type=float, default=20.0, help="THROTTLING_SCOPE_MAX_IDLE"
    )
    parser.add_argument(
        "--only", choices=("plugin", "plain"), help="run one of the two crawls"
    )
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        run_child(json.loads(args.child))
        return 0

    from simhosts import SimHosts

    configs = host_configs(args.hosts)
    with SimHosts(configs, startup_timeout=60) as hosts:
        config = {
            "minutes": args.minutes,
            "sites": args.sites,
            "max_idle": args.max_idle,
            "hosts": args.hosts,
            "interval": max(2.0, round(args.minutes * 60 / 40, 1)),
            "bases": [hosts.url(host["name"]).rstrip("/") for host in configs],
        }
        modes = {"plugin": [True], "plain": [False], None: [True, False]}[args.only]
        results = [run_one(hosts, config, plugin=mode, cwd=ROOT) for mode in modes]
    print_report(results, config)
    if args.json:
        Path(args.json).write_text(json.dumps(results))
    return 0 if all(r["lost"] == 0 and r["ended_twice"] == 0 for r in results) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
