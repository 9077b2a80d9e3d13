"""Every reservation is released, whatever happens to the request.

A scope of concurrency 1 makes a leaked reservation visible at once: the
next request of the scope would wait forever, so the crawl would not finish.
"""

from __future__ import annotations

from typing import Any

import pytest
from scrapy.exceptions import IgnoreRequest
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.spiders import PagesSpider, run_crawl

# Every crawl runs twice: URLs queued at start, and yielded from a callback.
pytestmark = pytest.mark.usefixtures("spider_modes")


class IgnoreSomeMiddleware:
    """Drops requests whose URL contains ``ignore-me`` before the download."""

    def process_request(self, request: Any) -> None:
        if "ignore-me" in request.url:
            raise IgnoreRequest("ignored by test")


def assert_all_released(crawler: Any) -> None:
    throttler = crawler.throttler
    assert throttler._reserved == {}
    for state in throttler.iter_scope_states():
        assert state["in_flight"] == 0, state


@deferred_f_from_coro_f
async def test_reservations_are_released_on_every_outcome(simhosts):
    hosts = simhosts(
        {
            "name": "A",
            "kind": "unlimited",
            "service_time": 0.01,
            "robots_txt": "User-agent: *\nDisallow: /private\n",
        },
        {"name": "B", "kind": "unlimited"},
    )
    paths = [
        "/ok",
        "/private/disallowed",  # IgnoreRequest from RobotsTxtMiddleware
        "/ignore-me",  # IgnoreRequest from a downloader middleware
        "/dropped?drop=1",  # download exception, not retried
        "/missing?status=404",  # error response
        "/moved?redirect=" + hosts.url("B", "/target"),  # redirect (a Request)
        "/retried?status=500",  # retried (a Request) then given up
        "/ok2",
    ]
    urls = [hosts.url("A", path) for path in paths]
    crawler = await run_crawl(
        PagesSpider,
        {
            "ADDONS": {"scrapy_adaptive_throttle.Addon": 500},
            "ROBOTSTXT_OBEY": True,
            "RETRY_TIMES": 1,
            "THROTTLING_SCOPE_MANAGER": (
                "scrapy_adaptive_throttle.ThrottlingScopeManager"
            ),
            "THROTTLING_SCOPES": {hosts.netloc("A"): {"concurrency": 1}},
            "DOWNLOADER_MIDDLEWARES": {f"{__name__}.IgnoreSomeMiddleware": 960},
            # Only the outcome matters here, not backoff delays.
            "BACKOFF_HTTP_CODES": [],
            "BACKOFF_EXCEPTIONS": [],
            # A leak would stall the crawl: end it, so the test fails, not hangs.
            "CLOSESPIDER_TIMEOUT": 20,
        },
        urls=urls,
    )
    spider = crawler.spider
    assert spider.unanswered() == []
    errors = {entry["error"] for entry in spider.failures}
    assert "IgnoreRequest" in errors
    assert_all_released(crawler)
    assert crawler.stats.get_value("finish_reason") == "finished"
