"""A subclass of the plugin's manager keeps its overrides on the hot path.

The manager's queue gate binds ``release``, ``get_request_delay`` and
``get_slot_key`` once, when it is built, so that the scheduler queue and the
downloader call them with no frame in between: what it binds must be the
subclass's methods. Real crawls, on both reactors, with the requests yielded
from a callback, a redirect and a retry; the limit is checked at the server.
"""

from __future__ import annotations

from typing import Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.engine_crawls import ADDON, REACTORS, crawl_in_process
from tests.overriding_manager import PREFIX
from tests.spiders import PagesSpider, run_crawl

_EPOLL = "twisted.internet.epollreactor.EPollReactor"


async def _crawl(reactor: str, settings: dict[str, Any], urls: list[str]) -> Any:
    if reactor == "epoll":
        return crawl_in_process(
            {
                "settings": {**settings, "TWISTED_REACTOR": _EPOLL},
                "urls": urls,
                "follow": True,
            }
        )
    crawler = await run_crawl(PagesSpider, settings, urls=urls, follow=True)
    spider = crawler.spider
    return {
        "unanswered": spider.unanswered(),
        "finish_reason": crawler.stats.get_value("finish_reason"),
        "stats": crawler.stats.get_stats(),
    }


@pytest.mark.parametrize("reactor", REACTORS)
@deferred_f_from_coro_f
async def test_the_queue_and_the_downloader_call_a_subclass_override(simhosts, reactor):
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.02})
    paths = [f"/page/{index}" for index in range(8)] + [
        "/moved?redirect=" + hosts.url("A", "/target"),  # a Request from Scrapy
        "/retried?status=503",  # retried once, then given up
    ]
    result = await _crawl(
        reactor,
        {
            "ADDONS": ADDON,
            "THROTTLING_MANAGER": "tests.overriding_manager.CountingManager",
            "THROTTLING_SCOPES": {hosts.netloc("A"): {"concurrency": 1}},
            "CONCURRENT_REQUESTS": 8,
            "RETRY_TIMES": 1,
            "BACKOFF_HTTP_CODES": [],
            "CLOSESPIDER_TIMEOUT": 60,
        },
        [hosts.url("A", path) for path in paths],
    )
    assert result["finish_reason"] == "finished"
    assert result["unanswered"] == []
    stats = result["stats"]
    downloads = stats["downloader/response_count"] + stats.get(
        "downloader/exception_count", 0
    )
    # The index page (a data: URL), 8 pages, the redirect and its target,
    # the retried URL twice.
    assert downloads == 13
    # Every download ended through the subclass's release: a release that
    # skipped it would leave the concurrency-1 scope full and hang the crawl.
    assert stats[f"{PREFIX}/release_count"] == downloads
    # The queue asks each pushed request its delay; the downloader asks each
    # download its slot key.
    assert stats[f"{PREFIX}/get_request_delay_count"] >= stats["scheduler/enqueued"]
    assert stats[f"{PREFIX}/get_slot_key_count"] >= downloads
    # The subclass's slot keys did not undo the scope's limit.
    assert hosts.stats("A")["max_concurrency"] == 1
