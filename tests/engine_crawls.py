"""One crawl of :class:`~tests.spiders.FollowSpider`, on either reactor.

``asyncio`` runs in the test process (pytest-twisted installed Twisted's
asyncio reactor), ``epoll`` in a fresh process (``tests.crawl_process``), so
that every engine-facing test can run on both of Scrapy's usual reactors.
Both return the same dict: ``responses``, ``failures``, ``expected``,
``lost``, ``sent`` (``[time, path]`` at ``request_reached_downloader``),
``finish_reason``, ``live_scopes`` (scopes the plugin's manager
still holds at close) and ``stats`` (numbers and strings only); the EPoll
crawl also returns its ``log`` (the process's stderr).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.spiders import FollowSpider, run_crawl

ADDON = {"scrapy_adaptive_throttle.Addon": 500}
ROOT = Path(__file__).resolve().parents[1]
REACTORS = ("asyncio", "epoll")
_EPOLL = "twisted.internet.epollreactor.EPollReactor"


async def crawl_follow(
    reactor: str, settings: dict[str, Any], urls: list[str], **spider_kwargs: Any
) -> dict[str, Any]:
    """Crawl the link tree below *urls* on *reactor*; see the module docstring."""
    if reactor == "epoll":
        return crawl_in_process(
            {
                "spider": "follow",
                "settings": {**settings, "TWISTED_REACTOR": _EPOLL},
                "urls": urls,
                "spider_kwargs": spider_kwargs,
            }
        )
    assert reactor == "asyncio", reactor
    crawler = await run_crawl(FollowSpider, settings, urls=urls, **spider_kwargs)
    spider = crawler.spider
    assert isinstance(spider, FollowSpider)
    assert crawler.stats is not None
    return {
        "responses": spider.responses,
        "failures": spider.failures,
        "expected": sorted(spider.expected_urls()),
        "lost": sorted(spider.lost_urls()),
        "sent": spider.sent,
        "finish_reason": crawler.stats.get_value("finish_reason"),
        "live_scopes": len(
            getattr(getattr(crawler, "throttler", None), "_scope_managers", ())
        ),
        "stats": {
            key: value
            for key, value in crawler.stats.get_stats().items()
            if isinstance(value, (int, float, str))
        },
    }


def crawl_in_process(
    config: dict[str, Any], timeout: float = 120, cwd: Path = ROOT
) -> dict[str, Any]:
    """Run ``python -m tests.crawl_process`` with *config* in *cwd* (another
    checkout's ``tests`` and package, for a benchmark's ``--before``); its
    JSON result."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.crawl_process", json.dumps(config)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    outcome: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    # The crawl's log, for tests that count log lines on another reactor.
    outcome["log"] = result.stderr
    return outcome
