"""Rampup in real crawls against the simulated hosts of :mod:`simhosts`.

The windows are short (:setting:`BACKOFF_WINDOW` of a fraction of a second)
so that several rampup steps fit in a test of a few seconds; the server's
records of every arrival are what the assertions read.
"""

from __future__ import annotations

from typing import Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_adaptive_throttle import LatencyScopeManager, ThrottlingScopeManager
from tests.spiders import PagesSpider, run_crawl

# Every crawl twice: URLs queued at start, and yielded from a callback.
pytestmark = pytest.mark.usefixtures("spider_modes")

ADDON = {"scrapy_adaptive_throttle.Addon": 500}
PLAIN = "scrapy_adaptive_throttle.ThrottlingScopeManager"


def settings(**extra: Any) -> dict[str, Any]:
    return {
        "ADDONS": ADDON,
        "THROTTLING_SCOPE_MANAGER": PLAIN,
        "DOWNLOAD_DELAY": 0,
        "RETRY_TIMES": 50,
        "RETRY_HTTP_CODES": [429],
        **extra,
    }


@deferred_f_from_coro_f
async def test_scope_starting_with_a_delay_reaches_concurrency_above_its_floor(
    simhosts,
):
    """Default rampup settings (min_delay 0) from a delay of 0.2 s: the delay
    falls until it no longer limits, then concurrency rises above 1."""
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.05})
    netloc = hosts.netloc("A")
    urls = [hosts.url("A", f"/{i}") for i in range(140)]
    crawler = await run_crawl(
        PagesSpider,
        settings(
            BACKOFF_WINDOW=0.4,
            THROTTLING_SCOPES={netloc: {"rampup": True, "delay": 0.2, "jitter": 0}},
        ),
        urls=urls,
    )
    assert crawler.spider.unanswered() == []
    state = crawler.throttler.get_scope_state(netloc)
    assert state["limit"] > 1
    assert state["base_delay"] < 0.2
    assert hosts.stats("A")["max_concurrency"] > 1
    stats = crawler.stats.get_stats()
    assert stats["throttling/rampup/faster_count"] >= 3


@deferred_f_from_coro_f
async def test_rampup_never_exceeds_an_explicit_concurrency(simhosts):
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.05})
    netloc = hosts.netloc("A")
    urls = [hosts.url("A", f"/{i}") for i in range(150)]
    crawler = await run_crawl(
        PagesSpider,
        settings(
            BACKOFF_WINDOW=0.2,
            THROTTLING_SCOPES={netloc: {"rampup": True, "concurrency": 3}},
        ),
        urls=urls,
    )
    assert crawler.spider.unanswered() == []
    assert hosts.stats("A")["max_concurrency"] == 3
    assert crawler.throttler.get_scope_state(netloc)["limit"] == 3


@deferred_f_from_coro_f
async def test_rate_limit_is_found_and_retry_after_honoured(simhosts):
    """An API that serves 20 requests per sliding second and answers 429 with
    Retry-After: 1 past that: rampup slows down after too many 429s in a
    window, never sends during a Retry-After hold, and every page arrives."""
    hosts = simhosts({"name": "R", "kind": "ratelimit", "rate": 20, "retry_after": 1})
    netloc = hosts.netloc("R")
    urls = [hosts.url("R", f"/{i}") for i in range(90)]
    crawler = await run_crawl(
        PagesSpider,
        settings(
            BACKOFF_WINDOW=1.0,
            THROTTLING_SCOPES={netloc: {"rampup": True, "jitter": 0}},
        ),
        urls=urls,
    )
    spider = crawler.spider
    assert spider.unanswered() == []
    served = sorted(e["index"] for e in spider.responses if e["status"] == 200)
    assert served == list(range(90))
    arrivals = hosts.stats("R")["arrivals"]
    answered_429 = [t for t, _, _, status, _ in arrivals if status == 429]
    assert answered_429
    for at in answered_429:
        # Retry-After: 1 (the 429 is answered at once): nothing in between,
        # with a margin for the time the answer takes to reach the crawler.
        during = [t for t, *_ in arrivals if at + 0.05 < t < at + 0.95]
        assert during == [], (at, during)
    stats = crawler.stats.get_stats()
    assert stats["throttling/rampup/slower_count"] >= 1
    state = crawler.throttler.get_scope_state(netloc)
    # One request at a time is already far faster than 20/s: a delay is the
    # brake (rampup's own, or the pace learned from the 429s, under which
    # rampup's delay may fall and its concurrency take one step up), and
    # concurrency stays near its floor, at the server too.
    assert state["base_delay"] > 0 or state.get("learned_interval", 0) > 0, state
    assert state["limit"] <= 2, state
    assert hosts.stats("R")["max_concurrency"] <= 2


@pytest.mark.parametrize("manager", [ThrottlingScopeManager, LatencyScopeManager])
@deferred_f_from_coro_f
async def test_idle_scope_takes_no_step(simhosts, manager):
    """A scope that sends one request per window never holds anything back:
    it tested nothing, so rampup leaves it alone.

    The requests are 0.5 s apart, five times the scope's delay: its delay
    counts from a request's arrival at the downloader, so an event loop
    stalled for the gap minus the delay would let it hold the next request
    (a window that did test the delay). At 0.3 s apart, a step was taken
    once in a run of .ci/run on a machine busy with other work."""
    hosts = simhosts({"name": "A", "kind": "unlimited"})
    netloc = hosts.netloc("A")
    urls = [hosts.url("A", f"/{i}") for i in range(4)]
    crawler = await run_crawl(
        PagesSpider,
        settings(
            THROTTLING_SCOPE_MANAGER=manager,
            BACKOFF_WINDOW=0.2,
            THROTTLING_SCOPES={netloc: {"rampup": True, "delay": 0.1}},
        ),
        urls=urls,
        metas=[{"throttling_delay": 0.5 * (i + 1)} for i in range(4)],
    )
    assert crawler.spider.unanswered() == []
    state = crawler.throttler.get_scope_state(netloc)
    assert state["rampup_faster_count"] == 0
    assert state["base_delay"] == 0.1
