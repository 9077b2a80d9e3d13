"""One crawl of the invariant harness: a seeded random link graph over
simulated hosts with faults, crawled with or without the plugin, on either
reactor, and everything the invariants of ``tests/test_invariants.py`` need.

The graph is built from the seed before the crawl: a few seed pages (start
requests), each page linking to 1-3 children down to a fixed depth, every
page of one *kind* that says which host serves it and how:

``page``
    a plain page of the fast host;
``slow``
    a page of the slow host, a scope configured with its own concurrency
    and delay in ``THROTTLING_SCOPES``;
``shed``
    a page of the queue host, which answers ``503`` with ``Retry-After``
    when its queue is full;
``limited``
    a page of the rate-limited host (``429`` with ``Retry-After`` past its
    rate);
``error``
    ``500`` every time: retried, then the errback;
``reset``
    a page of the resetting host whose connection is aborted every time
    (``drop=1``): retried, then the errback;
``unavailable``
    ``503`` with ``Retry-After: 1`` every time (on the queue host): retried
    after the hold, then the errback;
``redirect``
    a ``302`` to a page of its own on the slow or fast host;
``shared``
    a page of the fast or queue host whose ``throttling_scopes`` meta adds
    the ``shared`` scope, configured with a concurrency of its own.

``chain``
    a page of the fast host, also in the ``chain`` scope (a delay of
    0.4 s), that links to exactly one more: a chain of them, each yielded
    from the previous one's callback, is the last work left in most crawls,
    with the scheduler empty while a page downloads, so a spider that
    closed with a download pending would lose the rest of it.

The seed pages are one of each kind (and the head of the chain), so that
every crawl meets every fault; the rest is random. Only pages that reach a
callback have children; the callback yields them while the engine runs.
Pages are told apart at the server by their path (``/p/<id>``, and
``/t/<id>`` for a redirect's target).

Run in this process with :func:`crawl_here` (asyncio reactor) or in a fresh
one with ``python -m tests.invariant_crawl JSON`` (any reactor); both return
the dict described in :func:`collect`.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections import Counter
from typing import Any
from urllib.parse import quote, urlsplit

from scrapy import Request, Spider, signals
from scrapy.http import Response
from scrapy.spidermiddlewares.httperror import HttpError
from twisted.python.failure import Failure

#: Host configs for :class:`simhosts.SimHosts`.
HOSTS: list[dict[str, Any]] = [
    {"name": "fast", "kind": "unlimited", "service_time": 0.01},
    {"name": "slow", "kind": "unlimited", "service_time": 0.15},
    {
        "name": "queue",
        "kind": "queue",
        "workers": 2,
        "service_time": 0.03,
        "queue_size": 1,
        "retry_after": 1,
    },
    {"name": "limited", "kind": "ratelimit", "rate": 5, "retry_after": 1},
    {"name": "reset", "kind": "unlimited", "service_time": 0.01},
]
KIND_WEIGHTS = {
    "page": 30,
    "slow": 8,
    "shed": 12,
    "limited": 8,
    "error": 5,
    "reset": 3,
    "unavailable": 2,
    "redirect": 8,
    "shared": 10,
}
#: Pages of these kinds must reach their callback with the plugin, whatever
#: the seed; ``error`` and ``reset`` pages always end in their errback.
ALWAYS_ANSWERED = frozenset({"page", "slow", "redirect", "shared", "chain"})
ALWAYS_FAILED = frozenset({"error", "reset", "unavailable"})

SHARED_SCOPE = "shared"
SHARED_CONCURRENCY = 2
SLOW_CONCURRENCY = 2
SLOW_DELAY = 0.2
CONCURRENT_REQUESTS = 8
PER_DOMAIN = 4
CHAIN_LENGTH = 12
CHAIN_SCOPE = "chain"
CHAIN_DELAY = 0.4


def build_graph(
    seed: int, bases: dict[str, str], *, depth: int = 3
) -> dict[str, dict[str, Any]]:
    """``{page id: {"kind", "url", "meta", "children", "depth"}}``, the same
    for the same seed and hosts."""
    rng = random.Random(seed)
    kinds = list(KIND_WEIGHTS)
    weights = list(KIND_WEIGHTS.values())
    graph: dict[str, dict[str, Any]] = {}

    def add(page_id: str, depth_left: int, kind: str | None = None) -> None:
        if kind is None:
            kind = rng.choices(kinds, weights)[0]
        meta: dict[str, Any] = {}
        path = f"/p/{page_id}"
        if kind == "page":
            url = bases["fast"] + path
        elif kind == "slow":
            url = bases["slow"] + path
        elif kind == "shed":
            url = bases["queue"] + path
        elif kind == "limited":
            url = bases["limited"] + path
        elif kind == "error":
            url = bases["fast"] + path + "?status=500"
        elif kind == "reset":
            url = bases["reset"] + path + "?drop=1"
        elif kind == "unavailable":
            url = bases["queue"] + path + "?status=503&header=Retry-After:1"
        elif kind == "redirect":
            target = bases[rng.choice(["slow", "fast"])] + f"/t/{page_id}"
            url = bases["fast"] + path + "?redirect=" + quote(target, safe="")
        else:
            base = bases[rng.choice(["fast", "queue"])]
            url = base + path
            meta["throttling_scopes"] = [urlsplit(base).netloc, SHARED_SCOPE]
        children: list[str] = []
        if depth_left > 0 and kind not in ALWAYS_FAILED:
            children = [f"{page_id}.{k}" for k in range(rng.randint(1, 3))]
        graph[page_id] = {
            "kind": kind,
            "url": url,
            "meta": meta,
            "children": children,
            "depth": depth_left,
        }
        for child in children:
            add(child, depth_left - 1)

    for index, kind in enumerate(kinds):
        add(f"s{index}", depth, kind)
    page_id = "c"
    fast = urlsplit(bases["fast"]).netloc
    for level in range(CHAIN_LENGTH):
        last = level == CHAIN_LENGTH - 1
        graph[page_id] = {
            "kind": "chain",
            "url": bases["fast"] + f"/p/{page_id}?delay=0.05",
            "meta": {"throttling_scopes": [fast, CHAIN_SCOPE]},
            "children": [] if last else [page_id + ".0"],
            "depth": CHAIN_LENGTH - 1 - level,
        }
        page_id += ".0"
    return graph


def page_key(url: str) -> tuple[str, str]:
    """``(netloc, path)``: a page's identity, at the crawler and the server."""
    parts = urlsplit(url)
    return parts.netloc, parts.path


class InvariantSpider(Spider):
    """Crawl :func:`build_graph`'s graph; record what happened to each page.

    Every request of the crawl, whoever made it (start, callback, retry,
    redirect), is counted at ``request_scheduled``, ``response_downloaded``
    and ``request_dropped``, and timed at ``request_reached_downloader``
    (Scrapy's signal of a request handed to the downloader: its send);
    every page's end (callback or errback) is recorded with its time.
    """

    name = "invariants"
    custom_settings: dict[str, Any] | None = None

    def __init__(self, graph: dict[str, dict[str, Any]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.graph = graph
        self.yielded: list[str] = []
        self.outcomes: dict[str, list[dict[str, Any]]] = {}
        self.scheduled: Counter[str] = Counter()
        self.received: Counter[str] = Counter()
        self.dropped: list[str] = []
        #: ``[time, netloc, path]`` of every request handed to the downloader.
        self.sent: list[list[Any]] = []
        self.closed_at: float | None = None
        self.at_close: dict[str, Any] = {}

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> Any:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider._scheduled, signal=signals.request_scheduled)
        crawler.signals.connect(spider._dropped, signal=signals.request_dropped)
        crawler.signals.connect(spider._sent, signal=signals.request_reached_downloader)
        crawler.signals.connect(spider._received, signal=signals.response_downloaded)
        crawler.signals.connect(spider._closed, signal=signals.spider_closed)
        return spider

    def _scheduled(self, request: Request) -> None:
        self.scheduled["\t".join(page_key(request.url))] += 1

    def _received(self, request: Request) -> None:
        self.received["\t".join(page_key(request.url))] += 1

    def _sent(self, request: Request) -> None:
        self.sent.append([time.monotonic(), *page_key(request.url)])

    def _dropped(self, request: Request) -> None:
        self.dropped.append(request.url)

    def _closed(self) -> None:
        self.closed_at = time.monotonic()
        engine = self.crawler.engine
        throttler = getattr(self.crawler, "throttler", None)
        self.at_close = {
            "downloader_active": len(engine.downloader.active),
            "reserved": len(getattr(throttler, "_reserved", ())),
            "scope_in_flight": {
                scope: manager.active
                for scope, manager in getattr(throttler, "_scope_managers", {}).items()
                if getattr(manager, "active", 0)
            },
        }

    def request_for(self, page_id: str) -> Request:
        page = self.graph[page_id]
        self.yielded.append(page_id)
        return Request(
            page["url"],
            callback=self.parse,
            errback=self.on_error,
            dont_filter=True,
            meta={**page["meta"], "page": page_id},
        )

    async def start(self) -> Any:
        for page_id in self.graph:
            if page_id.count(".") == 0:
                yield self.request_for(page_id)

    def _end(self, page_id: str, outcome: dict[str, Any]) -> None:
        outcome["time"] = time.monotonic()
        self.outcomes.setdefault(page_id, []).append(outcome)

    def parse(self, response: Response) -> Any:
        page_id = response.meta["page"]
        self._end(page_id, {"status": response.status, "url": response.url})
        for child in self.graph[page_id]["children"]:
            yield self.request_for(child)

    def on_error(self, failure: Failure) -> None:
        if isinstance(failure.value, HttpError):
            response = failure.value.response
            self._end(
                response.meta["page"], {"status": response.status, "error": "HttpError"}
            )
            return
        request = failure.request  # type: ignore[attr-defined]
        self._end(
            request.meta["page"],
            {"status": None, "error": type(failure.value).__name__},
        )


def crawl_settings(bases: dict[str, str], *, plugin: bool) -> dict[str, Any]:
    """The harness's settings, with or without the plugin."""
    settings: dict[str, Any] = {
        "CONCURRENT_REQUESTS": CONCURRENT_REQUESTS,
        "CONCURRENT_REQUESTS_PER_DOMAIN": PER_DOMAIN,
        "DOWNLOAD_DELAY": 0,
        "RETRY_TIMES": 2,
        "DOWNLOAD_TIMEOUT": 20,
        # A hang ends the crawl with another finish reason, never the test.
        "CLOSESPIDER_TIMEOUT": 90,
        "LOG_LEVEL": "ERROR",
    }
    if plugin:
        slow = urlsplit(bases["slow"]).netloc
        settings["ADDONS"] = {"scrapy_adaptive_throttle.Addon": 500}
        # Short exponential backoff steps: the resetting host backs its scope
        # off on every reset, and 300 s (the default cap) would outlast the
        # test. Retry-After still holds scopes for its full second.
        settings["BACKOFF_MIN_DELAY"] = 0.1
        settings["BACKOFF_MAX_DELAY"] = 0.25
        settings["THROTTLING_SCOPES"] = {
            slow: {"concurrency": SLOW_CONCURRENCY, "delay": SLOW_DELAY, "jitter": 0},
            SHARED_SCOPE: {"concurrency": SHARED_CONCURRENCY},
            CHAIN_SCOPE: {"delay": CHAIN_DELAY, "jitter": 0},
        }
    return settings


def collect(crawler: Any) -> dict[str, Any]:
    """What a crawl leaves for the invariants, as JSON-able data."""
    spider = crawler.spider
    stats = crawler.stats.get_stats()
    return {
        "finish_reason": stats.get("finish_reason"),
        "yielded": spider.yielded,
        "outcomes": spider.outcomes,
        "scheduled": dict(spider.scheduled),
        "received": dict(spider.received),
        "dropped": spider.dropped,
        "sent": spider.sent,
        "closed_at": spider.closed_at,
        "at_close": spider.at_close,
        "stats": {
            key: value
            for key, value in stats.items()
            if isinstance(value, (int, float, str))
        },
    }


async def crawl_here(config: dict[str, Any]) -> dict[str, Any]:
    """Run the crawl of *config* in this process (the asyncio reactor)."""
    from tests.spiders import run_crawl

    graph = build_graph(config["seed"], config["bases"])
    crawler = await run_crawl(InvariantSpider, config["settings"], graph=graph)
    return collect(crawler)


def main() -> None:
    from scrapy.crawler import CrawlerProcess

    from tests.spiders import BASE_SETTINGS

    config = json.loads(sys.argv[1])
    graph = build_graph(config["seed"], config["bases"])
    process = CrawlerProcess({**BASE_SETTINGS, **config["settings"]})
    crawler = process.create_crawler(InvariantSpider)
    process.crawl(crawler, graph=graph)
    process.start()
    from twisted.internet import reactor

    result = collect(crawler)
    result["reactor"] = f"{type(reactor).__module__}.{type(reactor).__name__}"
    print(json.dumps(result))


if __name__ == "__main__":
    main()
