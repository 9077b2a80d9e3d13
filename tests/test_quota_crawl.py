"""Quotas in real crawls against the simulated hosts of :mod:`simhosts`.

Requests carry their expected consumption in the ``throttling_scopes`` meta
key (``{"api": amount}``). What went out per quota window is read from the
sends (``PagesSpider.sent``, Scrapy's ``request_reached_downloader``): the
server's arrival times add the transit of each request, which on a loaded
machine can exceed 0.2 s and move an arrival into the next burst. The server
still confirms that every request arrived once and that the arrivals spread
over the windows. Windows are 0.5 to 1 s so that a test takes seconds.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_adaptive_throttle import ThrottlingManager
from tests.spiders import PagesSpider, run_crawl

# Every crawl runs twice: URLs queued at start, and yielded from a callback.
pytestmark = pytest.mark.usefixtures("spider_modes")

ADDON = {"scrapy_adaptive_throttle.Addon": 500}


def settings(**extra: Any) -> dict[str, Any]:
    return {"ADDONS": ADDON, "DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS": 32, **extra}


#: Most a request may spend between its send and its arrival at the server
#: on a loaded machine (seen: 0.13-0.18 s; see tests/test_invariants.py).
MAX_TRANSIT = 0.3


def bursts(records: list[list[Any]], gap: float) -> list[list[list[Any]]]:
    """Group ``[time, path, ...]`` records into bursts separated by more than
    *gap* seconds."""
    groups: list[list[list[Any]]] = []
    for record in sorted(records):
        if groups and record[0] - groups[-1][-1][0] <= gap:
            groups[-1].append(record)
        else:
            groups.append([record])
    return groups


def check_at_server(arrivals: list[list[Any]], sent: list[list[Any]]) -> None:
    """The server saw every send once, and its arrivals span the time the
    sends took, less one transit."""
    assert sorted(path for _, path, *_ in arrivals) == sorted(p for _, p in sent)
    send_span = max(t for t, _ in sent) - min(t for t, _ in sent)
    arrival_span = max(a[0] for a in arrivals) - min(a[0] for a in arrivals)
    assert arrival_span >= send_span - MAX_TRANSIT, (arrival_span, send_span)


class TimedSpider(PagesSpider):
    """Remembers when the crawl started."""

    async def start(self):
        self.started = time.monotonic()
        async for item in super().start():
            yield item


@deferred_f_from_coro_f
async def test_no_more_than_the_quota_per_window(simhosts):
    hosts = simhosts({"name": "A", "kind": "unlimited"})
    urls = [hosts.url("A", f"/{i}") for i in range(15)]
    crawler = await run_crawl(
        PagesSpider,
        settings(THROTTLING_SCOPES={"api": {"quota": 10.0, "window": 1.0}}),
        urls=urls,
        meta={"throttling_scopes": {"api": 2.0}},
    )
    assert crawler.spider.unanswered() == []
    check_at_server(hosts.stats("A")["arrivals"], crawler.spider.sent)
    groups = bursts(crawler.spider.sent, gap=0.5)
    assert [len(group) for group in groups] == [5, 5, 5]
    for earlier, later in itertools.pairwise(groups):
        assert later[0][0] - earlier[0][0] >= 0.95


@deferred_f_from_coro_f
async def test_large_requests_open_each_window_and_small_ones_fill_it(simhosts):
    """Amounts 8 and 1 against a quota of 10: each window starts with a large
    request (the larger share goes first at equal priority), small ones fill
    what is left, and none waits behind a large one that does not fit."""
    hosts = simhosts({"name": "A", "kind": "unlimited"})
    urls = [hosts.url("A", f"/small/{i}") for i in range(12)]
    urls += [hosts.url("A", f"/large/{i}") for i in range(3)]
    metas = [{"throttling_scopes": {"api": 1.0}}] * 12
    metas += [{"throttling_scopes": {"api": 8.0}}] * 3
    crawler = await run_crawl(
        PagesSpider,
        settings(THROTTLING_SCOPES={"api": {"quota": 10.0, "window": 0.5}}),
        urls=urls,
        metas=metas,
    )
    assert crawler.spider.unanswered() == []
    check_at_server(hosts.stats("A")["arrivals"], crawler.spider.sent)
    groups = bursts(crawler.spider.sent, gap=0.2)
    units = [
        sum(8 if "/large/" in path else 1 for _, path, *_ in group) for group in groups
    ]
    assert all(total <= 10 for total in units), units
    # One large request per window (two would be 16 units). The first window
    # may be opened by small requests queued before the large ones (Scrapy
    # reads start requests lazily); after it, a window with a large request
    # starts with it, and small ones fill what it leaves.
    larges = [sum("/large/" in path for _, path, *_ in g) for g in groups]
    assert max(larges) == 1
    assert sum(larges) == 3
    for group in groups[1:]:
        if any("/large/" in path for _, path, *_ in group):
            assert "/large/" in group[0][1], group
    assert any("/large/" in g[0][1] and len(g) > 1 for g in groups)
    assert sum(len(group) for group in groups) == 15


class InitialBackoffManager(ThrottlingManager):
    calls = 0

    async def get_initial_backoff(self):
        type(self).calls += 1
        return {"api": {"remaining": 0.0}, "other": {"delay": 1.0}}


@deferred_f_from_coro_f
async def test_initial_backoff_applies_before_the_first_request(simhosts):
    """get_initial_backoff is called once, before anything is sent: "api"
    starts with an exhausted quota (window 1 s) and "other" with a 1 s hold."""
    InitialBackoffManager.calls = 0
    hosts = simhosts({"name": "A", "kind": "unlimited"})
    urls = [hosts.url("A", f"/api/{i}") for i in range(3)]
    urls += [hosts.url("A", f"/other/{i}") for i in range(2)]
    metas = [{"throttling_scopes": {"api": 1.0}}] * 3
    metas += [{"throttling_scopes": "other"}] * 2
    crawler = await run_crawl(
        TimedSpider,
        settings(
            THROTTLING_MANAGER=InitialBackoffManager,
            THROTTLING_SCOPES={"api": {"quota": 10.0, "window": 1.0}},
            THROTTLING_SCOPE_CONCURRENCY=4,
        ),
        urls=urls,
        metas=metas,
    )
    spider = crawler.spider
    assert spider.unanswered() == []
    assert InitialBackoffManager.calls == 1
    first = min(entry["time"] - entry["download_latency"] for entry in spider.responses)
    assert first - spider.started >= 0.9
