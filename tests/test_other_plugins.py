"""Other plugins' download slots are added scopes, never replacements.

scrapy-zyte-api sets ``download_slot = "zyte-api@<host>"`` on the requests it
sends (from its downloader middleware, priority 1000); proxy rotation
plugins give each proxy a slot. Crawled with such slots, a host must still
be crawled at its own limit (not one request at a time, as when the slot
replaced the host scope and fell back to ``THROTTLING_SCOPE_CONCURRENCY``),
never above it, on both reactors and with links followed from callbacks;
and no deprecation warning is emitted (Scrapy does not deprecate the key).
"""

from __future__ import annotations

import uuid
import warnings

import pytest
from scrapy import Request
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_adaptive_throttle import ThrottlingManager, ThrottlingScopeManager
from tests.engine_crawls import ADDON, REACTORS, crawl_follow
from tests.spiders import FollowSpider, run_crawl

ON_BOTH_REACTORS = pytest.mark.parametrize("reactor", REACTORS)
HOST_LIMIT = 4
#: A fixed limit (not the adaptive one) so that the host's limit is exactly
#: what the server must see.
FIXED = "scrapy_adaptive_throttle.ThrottlingScopeManager"
ZYTE_MIDDLEWARE = "tests.plugin_components.ZyteApiSlotMiddleware"
PROXY_MIDDLEWARE = "tests.plugin_components.ProxySlotMiddleware"


def manager(**settings):
    crawler = get_crawler(settings_dict={"ADDONS": ADDON, **settings})
    return ThrottlingManager(crawler)


# -- scope assignment ---------------------------------------------------------


def test_a_zyte_api_slot_is_added_to_the_host_scope_with_the_host_kind():
    throttler = manager(CONCURRENT_REQUESTS_PER_DOMAIN=6)
    request = Request(
        "https://example.com/a", meta={"download_slot": "zyte-api@example.com"}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scopes = throttler.get_request_scopes(request)
    assert scopes == ["example.com", "zyte-api@example.com"]
    slot = throttler.config.scope("zyte-api@example.com")
    assert slot.kind == "domain"
    assert slot.concurrency == 6


def test_a_slot_naming_no_host_is_unlimited_unless_configured():
    throttler = manager(
        THROTTLING_SCOPE_CONCURRENCY=1,
        DOWNLOAD_DELAY=2.0,
        THROTTLING_SCOPES={"proxy-2": {"concurrency": 3}},
    )
    for name in ("proxy-1", "proxy-2"):
        request = Request("https://example.com/", meta={"download_slot": name})
        assert throttler.get_request_scopes(request) == ["example.com", name]
    free = throttler.config.scope("proxy-1")
    assert (free.kind, free.concurrency, free.delay) == ("slot", None, 0.0)
    assert type(throttler.get_scope_manager("proxy-1")) is ThrottlingScopeManager
    assert throttler.config.scope("proxy-2").concurrency == 3
    # The host keeps its own defaults.
    assert throttler.config.scope("example.com").delay == 2.0
    # A throttling_scopes scope of the same shape keeps the chapter's default.
    assert throttler.config.scope("api").concurrency == 1


def test_the_slot_the_downloader_stamped_and_explicit_scopes_add_nothing():
    throttler = manager()
    stamped = Request(
        "https://other.example/",
        meta={"download_slot": "example.com", "_throttling_slot_stamp": "example.com"},
    )
    assert throttler.get_request_scopes(stamped) == "other.example"
    same = Request("https://example.com/", meta={"download_slot": "example.com"})
    assert throttler.get_request_scopes(same) == "example.com"
    explicit = Request(
        "https://example.com/",
        meta={"throttling_scopes": "api", "download_slot": "zyte-api@example.com"},
    )
    assert throttler.get_request_scopes(explicit) == "api"


# -- real crawls ----------------------------------------------------------------

PATTERNS = {
    # scrapy-zyte-api's middleware, as installed by that plugin.
    "zyte-api middleware": ({"DOWNLOADER_MIDDLEWARES": {ZYTE_MIDDLEWARE: 1000}}, {}),
    # The same slot set by the spider on every request.
    "zyte-api slot from the spider": ({}, {"slot": "zyte-api@{netloc}"}),
    # One slot per proxy, set by a rotation middleware.
    "proxy middleware": ({"DOWNLOADER_MIDDLEWARES": {PROXY_MIDDLEWARE: 610}}, {}),
    # Every request through one proxy, whose slot the spider sets.
    "proxy slot from the spider": ({}, {"slot": "proxy-1"}),
}


@ON_BOTH_REACTORS
@pytest.mark.parametrize("pattern", list(PATTERNS))
@deferred_f_from_coro_f
async def test_a_host_behind_another_plugins_slot_is_crawled_at_its_limit(
    simhosts, reactor, pattern
):
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.05})
    extra_settings, slot = PATTERNS[pattern]
    meta = {}
    if slot:
        meta["download_slot"] = slot["slot"].format(netloc=hosts.netloc("A"))
    result = await crawl_follow(
        reactor,
        {
            "ADDONS": ADDON,
            "THROTTLING_SCOPE_MANAGER": FIXED,
            "CONCURRENT_REQUESTS": 16,
            "CONCURRENT_REQUESTS_PER_DOMAIN": HOST_LIMIT,
            "DOWNLOAD_DELAY": 0,
            "CLOSESPIDER_TIMEOUT": 60,
            **extra_settings,
        },
        [hosts.url("A")],
        depth=2,
        fanout=8,
        meta=meta,
    )
    assert result["finish_reason"] == "finished"
    assert result["lost"] == []
    assert len(result["responses"]) == len(result["expected"]) == 1 + 8 + 64
    stats = hosts.stats("A")
    # Reached (the slot did not crawl the host 1 at a time) and never exceeded.
    assert stats["max_concurrency"] == HOST_LIMIT
    if slot:
        # The slot really was a scope of every request, next to the host's.
        counts = result["stats"]
        slot_id = meta["download_slot"]
        assert counts[f"throttling/scopes/{slot_id}/response_count"] == 73
        assert counts[f"throttling/scopes/{hosts.netloc('A')}/response_count"] == 73


@deferred_f_from_coro_f
async def test_no_deprecation_warning_and_not_slower_than_plain_scrapy(simhosts):
    ours_hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.05})
    plain_hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.05})
    common = {
        "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": HOST_LIMIT,
        "DOWNLOAD_DELAY": 0,
        "DOWNLOADER_MIDDLEWARES": {ZYTE_MIDDLEWARE: 1000},
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = await run_crawl(
            FollowSpider,
            {**common, "ADDONS": ADDON, "THROTTLING_SCOPE_MANAGER": FIXED},
            urls=[ours_hosts.url("A")],
            depth=2,
            fanout=8,
        )
    assert [str(w.message) for w in caught if "download_slot" in str(w.message)] == []
    plain = await run_crawl(
        FollowSpider, common, urls=[plain_hosts.url("A")], depth=2, fanout=8
    )
    assert len(ours.spider.responses) == len(plain.spider.responses) == 73
    # Plain Scrapy reaches the slot's concurrency too (on the asyncio reactor
    # it even exceeds it); the plugin reaches the host limit and keeps to it.
    assert plain_hosts.stats("A")["max_concurrency"] >= HOST_LIMIT
    assert ours_hosts.stats("A")["max_concurrency"] == HOST_LIMIT


@ON_BOTH_REACTORS
@deferred_f_from_coro_f
async def test_a_slot_set_by_a_downloader_middleware_counts_from_the_retry(
    simhosts, reactor
):
    # Scopes are assigned when a request is scheduled: a slot that a
    # downloader middleware sets afterwards is a scope of the request's next
    # attempt, which copies the meta (as documented in other-plugins.rst).
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.01})
    result = await crawl_follow(
        reactor,
        {
            "ADDONS": ADDON,
            "DOWNLOAD_DELAY": 0,
            "DOWNLOADER_MIDDLEWARES": {PROXY_MIDDLEWARE: 610},
            "RETRY_TIMES": 1,
            "RETRY_HTTP_CODES": [503],
            "BACKOFF_HTTP_CODES": [],
            "CLOSESPIDER_TIMEOUT": 60,
        },
        [hosts.url("A")],
        depth=1,
        fanout=6,
        child_query="status=503",
    )
    assert result["finish_reason"] == "finished"
    assert result["lost"] == []
    stats = result["stats"]
    assert hosts.stats("A")["requests"] == 1 + 6 * 2
    host_count = stats[f"throttling/scopes/{hosts.netloc('A')}/response_count"]
    assert host_count == 1 + 6 * 2
    proxy_counts = [
        stats.get(f"throttling/scopes/{proxy}/response_count", 0)
        for proxy in ("proxy-1", "proxy-2", "proxy-3")
    ]
    assert sum(proxy_counts) == 6  # the retries, not the first attempts


# -- Scrapy's HTTP cache ------------------------------------------------------------


@ON_BOTH_REACTORS
@pytest.mark.parametrize(
    "plugin", ["plugin", "shared", "plain-scrapy"], ids=lambda value: value
)
@deferred_f_from_coro_f
async def test_http_cache_hits_do_not_wait_for_the_delay(
    simhosts, tmp_path, reactor, plugin, request
):
    """A crawl run again over Scrapy's HTTP cache (a spider's developer does
    that all day) is not spaced by DOWNLOAD_DELAY: nothing reaches the host.
    With Scrapy's own downloader the cache answers before the slot's delay;
    with the plugin the queue reserves the scope first, and the cache hit
    gives the send back, to the shared next-send time in Redis as well with
    THROTTLING_STATE_URL ("shared"). Links are followed from callbacks."""
    hosts = simhosts({"name": "A", "kind": "unlimited"})
    settings = {
        "HTTPCACHE_ENABLED": True,
        "HTTPCACHE_DIR": str(tmp_path / "httpcache"),
        "DOWNLOAD_DELAY": 0.4,
        "DOWNLOAD_DELAY_JITTER": 0,
        "CLOSESPIDER_TIMEOUT": 60,
    }
    if plugin != "plain-scrapy":
        settings = {**settings, "ADDONS": ADDON}
    if plugin == "shared":
        settings["THROTTLING_STATE_URL"] = request.getfixturevalue("redis_server").url
        settings["THROTTLING_STATE_PREFIX"] = f"cache-{uuid.uuid4().hex[:8]}"
    pages = 1 + 2 + 4
    first = await crawl_follow(reactor, settings, [hosts.url("A")], depth=2, fanout=2)
    assert first["lost"] == []
    assert len(first["responses"]) == pages
    fetched = len(hosts.stats("A")["arrivals"])
    # The first crawl downloads, spaced by the delay (checked at the host;
    # at least half of it: Scrapy 2.18 has no DOWNLOAD_DELAY_JITTER and
    # randomizes its delay by 0.5-1.5x).
    times = sorted(record[0] for record in hosts.stats("A")["arrivals"])
    assert times[-1] - times[0] >= (pages - 1) * 0.4 * 0.5
    second = await crawl_follow(reactor, settings, [hosts.url("A")], depth=2, fanout=2)
    assert second["finish_reason"] == "finished"
    assert second["lost"] == []
    assert len(second["responses"]) == pages
    assert second["stats"]["httpcache/hit"] == pages
    assert len(hosts.stats("A")["arrivals"]) == fetched
    # Spaced by the delay, the hits would take 2.4 s; served as they come,
    # well under a second (the bound leaves room for a loaded machine).
    assert second["stats"]["elapsed_time_seconds"] < 1.2
