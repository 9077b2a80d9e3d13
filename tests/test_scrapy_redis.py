"""scrapy-redis's scheduler with the plugin: real crawls, a real Redis queue.

Each crawl runs scrapy-redis's scheduler over a real ``redis-server`` (the
``redis_server`` fixture) against two simulated hosts: S, slow (2 workers x
0.2 s, its scope limited to 1 request at a time) and F, fast. Pages are
yielded from the callback of an index page (``PagesSpider``'s follow mode),
S and F interleaved in the Redis queue (FIFO), with one redirect and one
retried page among them; ``CONCURRENT_REQUESTS`` is 4, so that four S
requests waiting at the downloader gate would hold every slot.

* With the add-on, scrapy-redis's scheduler becomes
  ``ThrottlingRedisScheduler``: every page is fetched once, S never has more
  than its limit in service (at the server), and F is not held back by S:
  F's pages are all answered while most of S's still wait.
* The control: a subclass of scrapy-redis's scheduler that the add-on leaves
  in place (the gate alone) shows the head-of-line blocking the check looks
  for, so the check can fail.
* Plain scrapy-redis without the plugin fetches the same pages.
* A crawl closed half-way pushes the requests left in the buffer back to
  Redis, and a second crawl over the same queue fetches them.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections import Counter
from typing import Any
from urllib.parse import quote

import pytest
from scrapy.exceptions import CloseSpider
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy_redis.scheduler import Scheduler

from tests.engine_crawls import ADDON, REACTORS, crawl_in_process
from tests.server_checks import max_in_service
from tests.spiders import PagesSpider, run_crawl

REDIS_SCHEDULER = "scrapy_adaptive_throttle.redis_scheduler.ThrottlingRedisScheduler"
PLAIN_SCOPE_MANAGER = "scrapy_adaptive_throttle.ThrottlingScopeManager"
SLOW = {"name": "S", "kind": "queue", "workers": 2, "service_time": 0.2}
FAST = {"name": "F", "kind": "unlimited", "service_time": 0.01}
SLOW_LIMIT = 1
SLOW_PAGES = 12
FAST_PAGES = 24
_EPOLL = "twisted.internet.epollreactor.EPollReactor"
#: scrapy-redis 0.9.1's own scheduler passes ``spider=`` to the stats, which
#: Scrapy 2.19 deprecates (ThrottlingRedisScheduler does not).
SCRAPY_REDIS_STATS_WARNING = (
    "ignore:Passing a 'spider' argument to StatsCollector:"
    "scrapy.exceptions.ScrapyDeprecationWarning"
)


class GateOnlyScheduler(Scheduler):  # type: ignore[misc]
    """scrapy-redis's scheduler under another name: the add-on leaves a
    subclass in place, so requests are throttled at the gate only."""


def page_urls(hosts: Any) -> list[str]:
    """S and F interleaved (S, F, F, S, F, F...); F's 4th page redirects to
    a page of F, F's 7th is answered 500 (retried twice, then an error)."""
    urls = []
    for index in range(FAST_PAGES):
        if index % 2 == 0:
            urls.append(hosts.url("S", f"/page/{index // 2}"))
        if index == 3:
            target = hosts.url("F", f"/page/{index}")
            urls.append(hosts.url("F", f"/moved/{index}?redirect={quote(target)}"))
        elif index == 6:
            urls.append(hosts.url("F", f"/page/{index}?status=500"))
        else:
            urls.append(hosts.url("F", f"/page/{index}"))
    return urls


def crawl_settings(
    hosts: Any, redis_url: str, scheduler: str | None, *, plugin: bool = True
) -> dict[str, Any]:
    key = uuid.uuid4().hex
    settings: dict[str, Any] = {
        "SCHEDULER": scheduler or "scrapy_redis.scheduler.Scheduler",
        "SCHEDULER_QUEUE_CLASS": "scrapy_redis.queue.FifoQueue",
        "SCHEDULER_QUEUE_KEY": f"{key}:requests",
        "SCHEDULER_DUPEFILTER_KEY": f"{key}:dupefilter",
        "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
        "REDIS_URL": redis_url,
        "CONCURRENT_REQUESTS": 4,
        "RETRY_TIMES": 2,
        "RETRY_HTTP_CODES": [500],
        "DOWNLOAD_TIMEOUT": 10,
    }
    if plugin:
        settings["ADDONS"] = ADDON
        settings["THROTTLING_SCOPE_MANAGER"] = PLAIN_SCOPE_MANAGER
        settings["THROTTLING_SCOPES"] = {hosts.netloc("S"): {"concurrency": SLOW_LIMIT}}
    return settings


async def crawl(reactor: str, settings: dict[str, Any], urls: list[str]) -> Any:
    """PagesSpider in follow mode on *reactor*: ``responses``, ``failures``,
    ``unanswered``, ``stats`` (and ``log`` on EPoll)."""
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
        "responses": spider.responses,
        "failures": spider.failures,
        "unanswered": spider.unanswered(),
        "stats": crawler.stats.get_stats(),
    }


def arrivals(stats: dict[str, Any]) -> Counter[str]:
    return Counter(record[1] for record in stats["arrivals"])


def assert_every_page_once(outcome: dict[str, Any], hosts: Any) -> None:
    assert outcome["unanswered"] == []
    assert outcome["failures"] == []
    fast, slow = arrivals(hosts.stats("F")), arrivals(hosts.stats("S"))
    assert sorted(slow) == sorted(f"/page/{i}" for i in range(SLOW_PAGES))
    assert set(slow.values()) == {1}
    retried = "/page/6?status=500"
    assert fast.pop(retried) == 3  # the first try and RETRY_TIMES retries
    assert fast.pop("/moved/3?redirect=" + quote(hosts.url("F", "/page/3"))) == 1
    assert sorted(fast) == sorted(f"/page/{i}" for i in range(FAST_PAGES) if i != 6)
    assert set(fast.values()) == {1}
    assert outcome["stats"]["retry/count"] == 2
    statuses = Counter(entry["status"] for entry in outcome["responses"])
    assert statuses == {200: SLOW_PAGES + FAST_PAGES - 1, 500: 1}


def slow_answered_when_fast_done(outcome: dict[str, Any], hosts: Any) -> int:
    """How many S pages the spider had when the last F page reached it."""
    fast_netloc = hosts.netloc("F")
    slow_netloc = hosts.netloc("S")
    responses = outcome["responses"]
    last_fast = max(
        position
        for position, entry in enumerate(responses)
        if fast_netloc in entry["url"]
    )
    return sum(1 for entry in responses[:last_fast] if slow_netloc in entry["url"])


@pytest.mark.parametrize("reactor", REACTORS)
@deferred_f_from_coro_f
async def test_slow_host_does_not_hold_back_the_fast_one(
    simhosts, redis_server, reactor, caplog
):
    hosts = simhosts(SLOW, FAST)
    caplog.set_level(logging.WARNING)
    outcome = await crawl(
        reactor, crawl_settings(hosts, redis_server.url, None), page_urls(hosts)
    )
    assert_every_page_once(outcome, hosts)
    assert max_in_service([hosts.stats("S")]) <= SLOW_LIMIT
    # S takes >= 2.4 s for its 12 pages at 1 in flight; F's pages, which
    # nothing but S's requests could delay, are all answered first.
    assert slow_answered_when_fast_done(outcome, hosts) <= SLOW_PAGES // 3
    assert outcome["stats"]["scheduler/dequeued/redis"] > SLOW_PAGES + FAST_PAGES
    assert "head-of-line blocking" not in outcome.get("log", caplog.text)


@pytest.mark.filterwarnings(SCRAPY_REDIS_STATS_WARNING)
@pytest.mark.parametrize("reactor", REACTORS)
@deferred_f_from_coro_f
async def test_the_gate_alone_lets_the_slow_host_hold_back_the_fast_one(
    simhosts, redis_server, reactor, caplog
):
    """The control: the same crawl with the gate alone (a scrapy-redis
    scheduler the add-on leaves in place) is head-of-line blocked."""
    hosts = simhosts(SLOW, FAST)
    caplog.set_level(logging.WARNING)
    # By its full name: under pytest, __name__ may lack the package.
    scheduler = "tests.test_scrapy_redis.GateOnlyScheduler"
    outcome = await crawl(
        reactor, crawl_settings(hosts, redis_server.url, scheduler), page_urls(hosts)
    )
    assert_every_page_once(outcome, hosts)
    assert max_in_service([hosts.stats("S")]) <= SLOW_LIMIT
    assert slow_answered_when_fast_done(outcome, hosts) > SLOW_PAGES // 2
    log = outcome.get("log", caplog.text)
    assert "Derive it from scrapy_adaptive_throttle.redis_scheduler." in log


@pytest.mark.filterwarnings(SCRAPY_REDIS_STATS_WARNING)
@pytest.mark.parametrize("reactor", REACTORS)
@deferred_f_from_coro_f
async def test_plain_scrapy_redis_fetches_the_same_pages(
    simhosts, redis_server, reactor
):
    hosts = simhosts(SLOW, FAST)
    settings = crawl_settings(hosts, redis_server.url, None, plugin=False)
    outcome = await crawl(reactor, settings, page_urls(hosts))
    assert_every_page_once(outcome, hosts)


class StopAfterSpider(PagesSpider):
    """Close the crawl once *stop_after* responses reached the spider."""

    name = "stop_after"

    def __init__(self, stop_after: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stop_after = stop_after

    def parse(self, response: Any, **kwargs: Any) -> None:
        super().parse(response, **kwargs)
        if self.stop_after is not None and len(self.responses) >= self.stop_after:
            raise CloseSpider("stopped_half_way")


async def crawl_stopping(
    reactor: str, settings: dict[str, Any], urls: list[str], stop_after: int | None
) -> dict[str, Any]:
    if reactor == "epoll":
        return crawl_in_process(
            {
                "settings": {
                    **settings,
                    "TWISTED_REACTOR": _EPOLL,
                    "LOG_LEVEL": "INFO",
                },
                "urls": urls,
                "follow": bool(urls),
                "stop_after": stop_after,
            }
        )
    crawler = await run_crawl(
        StopAfterSpider, settings, urls=urls, follow=bool(urls), stop_after=stop_after
    )
    return {
        "responses": crawler.spider.responses,
        "failures": crawler.spider.failures,
        "stats": crawler.stats.get_stats(),
    }


@pytest.mark.parametrize("reactor", REACTORS)
@deferred_f_from_coro_f
async def test_the_buffer_goes_back_to_redis_when_the_crawl_closes(
    simhosts, redis_server, reactor, caplog
):
    """A crawl closed after 8 responses leaves S's pages in its buffer: they
    are pushed back to the Redis queue, and a second crawl over that queue
    (no start requests of its own) fetches them; no page is fetched twice."""
    hosts = simhosts(SLOW, FAST)
    caplog.set_level(logging.INFO, logger="scrapy_adaptive_throttle")
    settings = crawl_settings(hosts, redis_server.url, None)
    settings["SCHEDULER_PERSIST"] = True
    urls = page_urls(hosts)
    first = await crawl_stopping(reactor, settings, urls, 8)
    assert first["stats"]["finish_reason"] == "stopped_half_way"
    log = first.get("log", caplog.text)
    pushed = [line for line in log.splitlines() if "back to the Redis queue" in line]
    assert len(pushed) == 1, log[-3000:]
    queue_key = settings["SCHEDULER_QUEUE_KEY"]
    left = redis_server.client().llen(queue_key)
    match = re.search(r"Pushed (\d+) throttled request", pushed[0])
    assert match is not None
    # S's pages that waited in the buffer (8 responses, nearly all F's, took
    # 4 of S's pages out of the interleaved queue), on top of the requests
    # the first crawl never popped.
    assert 2 <= int(match.group(1)) <= left
    seen_first = url_arrivals(hosts)

    second = await crawl_stopping(reactor, settings, [], None)
    assert redis_server.client().llen(queue_key) == 0
    answered = {entry["url"] for entry in first["responses"] + second["responses"]}
    fetched = url_arrivals(hosts)
    retried = hosts.url("F", "/page/6?status=500")
    # No page fetched twice (the retried one is fetched 3 times, or fewer if
    # the first crawl closed while it was in flight).
    assert {url for url, count in fetched.items() if count > 1} <= {retried}
    # Every page answered by one of the crawls, but for the requests in flight
    # when the first one closed, which are lost with it as with scrapy-redis
    # alone (popped from Redis, never answered).
    redirect = next(url for url in urls if "/moved/" in url)
    in_flight_at_close = set(seen_first) - answered - {redirect}
    assert len(in_flight_at_close) <= settings["CONCURRENT_REQUESTS"]
    missing = set(urls) - answered - in_flight_at_close - {redirect, retried}
    assert missing == set()
    assert len(second["responses"]) >= int(match.group(1))


def url_arrivals(hosts: Any) -> Counter[str]:
    """How many times each URL of S and F arrived at its host."""
    return Counter(
        hosts.url(name, record[1])
        for name in ("S", "F")
        for record in hosts.stats(name)["arrivals"]
    )


@pytest.mark.parametrize(
    ("scheduler", "priority", "expected"),
    [
        ("scrapy_redis.scheduler.Scheduler", "project", REDIS_SCHEDULER),
        (Scheduler, "spider", REDIS_SCHEDULER),
        ("tests.test_scrapy_redis.GateOnlyScheduler", "project", None),
        ("scrapy.core.scheduler.Scheduler", "project", None),
    ],
)
def test_the_addon_replaces_only_scrapy_redis_scheduler(scheduler, priority, expected):
    from scrapy.settings import Settings

    from scrapy_adaptive_throttle import Addon

    settings = Settings()
    settings.set("SCHEDULER", scheduler, priority=priority)
    Addon().update_settings(settings)
    assert settings.get("SCHEDULER") == (expected or scheduler)


@pytest.mark.parametrize("value", [0, -3, "many", 2.5])
@deferred_f_from_coro_f
async def test_an_invalid_buffer_size_fails_at_start_up(
    simhosts, redis_server, caplog, value
):
    hosts = simhosts(FAST)
    settings = {
        "ADDONS": ADDON,
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        "REDIS_URL": redis_server.url,
        "SCHEDULER_QUEUE_KEY": f"{uuid.uuid4().hex}:requests",
        "THROTTLING_REDIS_BUFFER_SIZE": value,
    }
    with pytest.raises(ValueError, match="THROTTLING_REDIS_BUFFER_SIZE") as error:
        await run_crawl(PagesSpider, settings, urls=[hosts.url("F", "/page/0")])
    assert repr(value) in str(error.value)
    assert hosts.stats("F")["arrivals"] == []


def seed_queue(redis_url: str, key: str, urls: list[str]) -> None:
    """Fill the Redis queue *key* with *urls*, as a crawl that already
    ran, or a seeding script, would have (one shared queue)."""
    import redis
    from scrapy import Request
    from scrapy_redis import picklecompat
    from scrapy_redis.queue import FifoQueue

    spider = PagesSpider()
    queue = FifoQueue(
        redis.Redis.from_url(redis_url), spider, key, serializer=picklecompat
    )
    for url in urls:
        queue.push(
            Request(
                url, callback=spider.parse, errback=spider.on_error, dont_filter=True
            )
        )


@pytest.mark.parametrize("reactor", REACTORS)
def test_two_processes_share_the_queue_and_the_slow_host_limit(
    simhosts, redis_server, reactor, tmp_path
):
    """Two crawler processes over one Redis queue, with THROTTLING_STATE_URL:
    S's limit holds across them (at the server), every page is fetched once
    by one of them, F's pages all come before a third of S's, and the
    queue is empty at the end."""
    from tests.test_shared_state_crawl import finish, start_together

    hosts = simhosts(SLOW, FAST)
    settings = crawl_settings(hosts, redis_server.url, None)
    settings.update(
        {
            "THROTTLING_STATE_URL": redis_server.url,
            "THROTTLING_STATE_PREFIX": f"throttling:{uuid.uuid4().hex}",
            "THROTTLING_STATE_PROCESSES": 2,
            "SCHEDULER_PERSIST": True,  # the first to finish must not flush it
        }
    )
    if reactor == "epoll":
        settings["TWISTED_REACTOR"] = _EPOLL
    urls = [url for url in page_urls(hosts) if "status=500" not in url]
    seed_queue(redis_server.url, settings["SCHEDULER_QUEUE_KEY"], urls)
    configs = [{"settings": settings, "urls": []} for _ in range(2)]
    outcomes = [finish(p) for p in start_together(configs, tmp_path)]
    assert redis_server.client().llen(settings["SCHEDULER_QUEUE_KEY"]) == 0
    responses = [entry for outcome in outcomes for entry in outcome["responses"]]
    assert all(outcome["failures"] == [] for outcome in outcomes)
    assert all(len(outcome["responses"]) > 0 for outcome in outcomes)
    assert Counter(entry["url"] for entry in responses).most_common(1)[0][1] == 1
    redirect = next(url for url in urls if "/moved/" in url)
    target = hosts.url("F", "/page/3")
    assert {entry["url"] for entry in responses} == set(urls) - {redirect} | {target}
    assert set(url_arrivals(hosts).values()) == {1}
    assert max_in_service([hosts.stats("S")]) <= SLOW_LIMIT
    # S's answers at the server, against the last of F's.
    last_fast = (
        max(record[0] + record[4] for record in hosts.stats("F")["arrivals"])
        + hosts.stats("F")["first_arrival_epoch"]
    )
    slow = hosts.stats("S")
    slow_done_before = sum(
        1
        for record in slow["arrivals"]
        if slow["first_arrival_epoch"] + record[0] + record[4] <= last_fast
    )
    assert slow_done_before <= SLOW_PAGES // 3


@pytest.mark.parametrize("reactor", REACTORS)
@pytest.mark.parametrize("size", [1, 3])
@deferred_f_from_coro_f
async def test_a_full_buffer_stops_popping_and_drops_nothing(
    simhosts, redis_server, reactor, size
):
    """With room for 1 or 3 waiting requests, the scheduler stops popping
    from Redis while the buffer is full: every page is still fetched once,
    S stays at its limit, and F is held back more than with the default
    buffer (S's waiting pages fill it)."""
    hosts = simhosts(SLOW, FAST)
    settings = crawl_settings(hosts, redis_server.url, None)
    settings["THROTTLING_REDIS_BUFFER_SIZE"] = size
    outcome = await crawl(reactor, settings, page_urls(hosts))
    assert_every_page_once(outcome, hosts)
    assert max_in_service([hosts.stats("S")]) <= SLOW_LIMIT
    assert slow_answered_when_fast_done(outcome, hosts) > SLOW_PAGES // 3
