"""robots.txt Crawl-delay: real crawls, and the manager with a fake clock.

With :setting:`ROBOTSTXT_OBEY` and :setting:`THROTTLING_ROBOTSTXT_OBEY`, a
``Crawl-delay`` for our user agent becomes the host scope's delay (capped at
:setting:`THROTTLING_ROBOTSTXT_MAX_DELAY`) and its concurrency becomes 1,
unless :setting:`THROTTLING_SCOPES` configures the scope more aggressively.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_adaptive_throttle import ThrottlingManager
from tests.spiders import PagesSpider, run_crawl
from tests.test_backoff_crawl import PlainPriorityQueue, gaps

# Every crawl runs twice: URLs queued at start, and yielded from a callback.
pytestmark = pytest.mark.usefixtures("spider_modes")

ADDON = {"scrapy_adaptive_throttle.Addon": 500}
ROBOTS = "User-agent: *\nCrawl-delay: {delay}\n"
FIXED = "scrapy_adaptive_throttle.ThrottlingScopeManager"
ADAPTIVE = "scrapy_adaptive_throttle.LatencyScopeManager"


def settings(**extra: Any) -> dict[str, Any]:
    return {
        "ADDONS": ADDON,
        "DOWNLOAD_DELAY": 0,
        "ROBOTSTXT_OBEY": True,
        # Limits are asserted exactly; the adaptive manager has its own tests.
        "THROTTLING_SCOPE_MANAGER": FIXED,
        **extra,
    }


def page_arrivals(hosts: Any, name: str = "A") -> list[list[Any]]:
    return [a for a in hosts.stats(name)["arrivals"] if a[1] != "/robots.txt"]


def robots_warnings(caplog: Any) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING and "Crawl-delay" in record.getMessage()
    ]


async def crawl(
    simhosts: Any, delay: float | None = 0.5, pages: int = 5, **extra: Any
) -> tuple[Any, Any]:
    host: dict[str, Any] = {"name": "A", "kind": "unlimited", "service_time": 0.05}
    if delay is not None:
        host["robots_txt"] = ROBOTS.format(delay=delay)
    hosts = simhosts(host)
    urls = [hosts.url("A", f"/p/{i}") for i in range(pages)]
    scopes = extra.pop("scopes", None)
    if scopes is not None:
        extra["THROTTLING_SCOPES"] = {hosts.netloc("A"): scopes}
    crawler = await run_crawl(PagesSpider, settings(**extra), urls=urls)
    assert crawler.spider.unanswered() == []
    assert sorted(crawler.spider.statuses) == [200] * pages
    return hosts, crawler


@pytest.mark.parametrize("scope_manager", [FIXED, ADAPTIVE])
@deferred_f_from_coro_f
async def test_crawl_delay_spaces_arrivals_one_at_a_time(
    simhosts, caplog, scope_manager
):
    # Default jitter (±50%) and CONCURRENT_REQUESTS_PER_DOMAIN (8) on purpose:
    # the Crawl-delay is a floor, and every page waited for robots.txt.
    with caplog.at_level(logging.WARNING):
        hosts, crawler = await crawl(
            simhosts, 0.5, THROTTLING_SCOPE_MANAGER=scope_manager
        )
    pages = page_arrivals(hosts)
    assert all(concurrent == 1 for _, _, concurrent, *_ in pages)
    assert hosts.stats("A")["max_concurrency"] == 1
    assert min(gaps([t for t, *_ in pages])) >= 0.48
    assert crawler.stats.get_value("throttling/robotstxt/crawl_delay_count") == 1
    state = crawler.throttler.get_scope_state(hosts.netloc("A"))
    assert (state["base_delay"], state["limit"]) == (0.5, 1)
    assert robots_warnings(caplog) == []


@deferred_f_from_coro_f
async def test_crawl_delay_through_the_gate(simhosts):
    # Without the throttling-aware queue the gate (after RobotsTxtMiddleware)
    # holds the requests; the result must be the same.
    hosts, _ = await crawl(simhosts, 0.4, SCHEDULER_PRIORITY_QUEUE=PlainPriorityQueue)
    pages = page_arrivals(hosts)
    assert hosts.stats("A")["max_concurrency"] == 1
    assert min(gaps([t for t, *_ in pages])) >= 0.38


@deferred_f_from_coro_f
async def test_crawl_delay_is_capped(simhosts):
    started = time.monotonic()
    hosts, crawler = await crawl(simhosts, 30, THROTTLING_ROBOTSTXT_MAX_DELAY=0.3)
    assert time.monotonic() - started < 10
    assert min(gaps([t for t, *_ in page_arrivals(hosts)])) >= 0.28
    assert crawler.throttler.get_scope_state(hosts.netloc("A"))["base_delay"] == 0.3


@deferred_f_from_coro_f
async def test_crawl_delay_is_ignored_when_switched_off(simhosts):
    for switch in ({"THROTTLING_ROBOTSTXT_OBEY": False}, {"ROBOTSTXT_OBEY": False}):
        hosts, crawler = await crawl(simhosts, 5, **switch)
        assert hosts.stats("A")["max_concurrency"] > 1
        assert crawler.stats.get_value("throttling/robotstxt/crawl_delay_count") is None


@deferred_f_from_coro_f
async def test_a_more_aggressive_scope_keeps_its_values_and_warns_once(
    simhosts, caplog
):
    with caplog.at_level(logging.WARNING):
        hosts, crawler = await crawl(
            simhosts, 0.5, pages=8, scopes={"delay": 0.05, "concurrency": 4}
        )
    [warning] = robots_warnings(caplog)
    assert repr(hosts.netloc("A")) in warning
    assert "delay 0.05 < Crawl-delay 0.5" in warning
    assert "concurrency 4 > 1" in warning
    assert "ignore_robots_txt" in warning
    assert min(gaps([t for t, *_ in page_arrivals(hosts)])) < 0.4
    state = crawler.throttler.get_scope_state(hosts.netloc("A"))
    assert (state["base_delay"], state["limit"]) == (0.05, 4)
    assert crawler.stats.get_value("throttling/robotstxt/crawl_delay_count") is None


@deferred_f_from_coro_f
async def test_only_the_aggressive_part_is_kept(simhosts, caplog):
    with caplog.at_level(logging.WARNING):
        hosts, crawler = await crawl(simhosts, 0.4, pages=4, scopes={"concurrency": 4})
    [warning] = robots_warnings(caplog)
    assert "concurrency 4 > 1" in warning
    assert "delay" not in warning.split("(")[1].split(")")[0].replace("Crawl-delay", "")
    state = crawler.throttler.get_scope_state(hosts.netloc("A"))
    assert (state["base_delay"], state["limit"]) == (0.4, 4)
    assert min(gaps([t for t, *_ in page_arrivals(hosts)])) >= 0.38


@deferred_f_from_coro_f
async def test_ignore_robots_txt_silences_the_warning(simhosts, caplog):
    with caplog.at_level(logging.WARNING):
        hosts, crawler = await crawl(
            simhosts, 0.5, scopes={"concurrency": 4, "ignore_robots_txt": True}
        )
    assert robots_warnings(caplog) == []
    state = crawler.throttler.get_scope_state(hosts.netloc("A"))
    assert (state["base_delay"], state["limit"]) == (0.0, 4)


@pytest.mark.parametrize("scope_manager", [FIXED, ADAPTIVE])
@deferred_f_from_coro_f
async def test_no_deadlock_with_a_scope_concurrency_of_1(simhosts, scope_manager):
    # The first page holds the scope's only slot while RobotsTxtMiddleware
    # downloads robots.txt for it: that download must not wait for the slot.
    for queue in ({}, {"SCHEDULER_PRIORITY_QUEUE": PlainPriorityQueue}):
        for delay in (None, 0.2):
            started = time.monotonic()
            hosts, _ = await crawl(
                simhosts,
                delay,
                pages=3,
                scopes={"concurrency": 1},
                THROTTLING_SCOPE_MANAGER=scope_manager,
                **queue,
            )
            assert time.monotonic() - started < 10
            paths = [path for _, path, *_ in hosts.stats("A")["arrivals"]]
            assert paths[0] == "/robots.txt"


@deferred_f_from_coro_f
async def test_crawl_delay_for_another_user_agent_is_ignored(simhosts):
    host = {
        "name": "A",
        "kind": "unlimited",
        "service_time": 0.05,
        "robots_txt": (
            "User-agent: otherbot\nCrawl-delay: 5\n\nUser-agent: *\nAllow: /\n"
        ),
    }
    hosts = simhosts(host)
    urls = [hosts.url("A", f"/p/{i}") for i in range(4)]
    crawler = await run_crawl(PagesSpider, settings(), urls=urls)
    assert crawler.spider.unanswered() == []
    assert crawler.stats.get_value("throttling/robotstxt/crawl_delay_count") is None
    assert hosts.stats("A")["max_concurrency"] > 1


# -- the manager, without a crawl ---------------------------------------------


def make_manager(**settings: Any) -> ThrottlingManager:
    crawler = get_crawler(
        settings_dict={"ROBOTSTXT_OBEY": True, "DOWNLOAD_DELAY_JITTER": 0, **settings}
    )
    manager = ThrottlingManager(crawler)
    now = [0.0]
    manager.clock = lambda: now[0]
    return manager


def test_crawl_delay_survives_eviction(caplog: Any) -> None:
    manager = make_manager(
        THROTTLING_SCOPE_LIMIT=1, THROTTLING_SCOPES={"slow.example": {"concurrency": 3}}
    )
    with caplog.at_level(logging.WARNING):
        manager.apply_robots_crawl_delay("slow.example", 2.0)
        first = manager.get_scope_manager("slow.example")
        # Used 5 s ago and idle since (a scope never used and changed at
        # run time is not evictable: recreating it would lose the change).
        first.record_sent(now=manager.clock() - 5.0)
        first.record_done()
        manager.get_scope_manager("other.example")  # evicts the idle scope
        assert "slow.example" not in manager._scope_managers
        state = manager.get_scope_state("slow.example")
    assert manager.get_scope_manager("slow.example") is not first
    assert (state["base_delay"], state["delay_floor"], state["limit"]) == (2.0, 2.0, 3)
    assert len(robots_warnings(caplog)) == 1


def test_crawl_delay_on_an_unconfigured_scope() -> None:
    manager = make_manager(DOWNLOAD_DELAY=0.25, CONCURRENT_REQUESTS_PER_DOMAIN=8)
    manager.apply_robots_crawl_delay("example.com", 1.5)
    state = manager.get_scope_state("example.com")
    assert (state["base_delay"], state["limit"]) == (1.5, 1)
    # A global DOWNLOAD_DELAY above the Crawl-delay stays.
    manager.apply_robots_crawl_delay("example.org", 0.1)
    manager.get_scope_manager("example.org")
    assert manager.get_scope_delay("example.org") == 0.25


def test_crawl_delay_is_a_floor_under_the_jitter() -> None:
    manager = make_manager(DOWNLOAD_DELAY_JITTER=0.5)
    manager.apply_robots_crawl_delay("example.com", 1.0)
    scope_manager = manager.get_scope_manager("example.com")
    now = 0.0
    for _ in range(200):
        scope_manager.record_sent(now)
        wait = scope_manager.can_send(now)
        assert 1.0 - 1e-9 <= wait <= 1.5 + 1e-9
        scope_manager.record_done(now)
        now += wait


def test_min_concurrency_above_1_conflicts(caplog: Any) -> None:
    manager = make_manager(THROTTLING_SCOPES={"example.com": {"min_concurrency": 2}})
    with caplog.at_level(logging.WARNING):
        manager.apply_robots_crawl_delay("example.com", 1.0)
    [warning] = robots_warnings(caplog)
    assert "min_concurrency 2 > 1" in warning


def test_invalid_crawl_delays_are_ignored() -> None:
    manager = make_manager()
    for delay in (0.0, -1.0, float("nan"), float("inf")):
        manager.apply_robots_crawl_delay("example.com", delay)
    assert manager.get_scope_delay("example.com") == 0.0
