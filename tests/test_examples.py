"""The throttling chapter's examples, run in real crawls.

The example classes below are the chapter's code with two kinds of changes
only: import paths (``scrapy.throttling`` -> ``scrapy_adaptive_throttle``)
and, for tldextract, an extractor built with ``suffix_list_urls=()`` instead
of the module-level ``tldextract.extract``, which would download the Public
Suffix List on first use (these tests run offline; the bundled snapshot
gives the same answers for these names). Where the chapter's snippets are
split in two (or forget an import), they are joined (or the import added).

What is simulated, and how: the chapter's host names (``books.toscrape.com``,
``api.toscrape.com``...) are kept in the request URLs, so scopes are derived
from them exactly as in a real crawl, but every request goes through the
``proxy`` request meta key to one local simulated host
(:mod:`simhosts`): Scrapy sends plain-HTTP requests to a proxy with the
absolute URL and never resolves the host name, and the simulated host
records each arrival with that URL, when it came and how long it was served.
The per-scope limits are read from those records (requests in service at
once, per host name). Query parameters such as ``header=X-Actual-Cost:20``
make the simulated host add that header to its answer.
"""

from __future__ import annotations

import itertools
import socket
import time
import warnings
from typing import Any
from urllib.parse import urlparse

import pytest
import tldextract
from scrapy import Request
from scrapy.utils.asyncio import run_in_thread
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.test import get_crawler
from w3lib.url import url_query_parameter

from scrapy_adaptive_throttle import (
    ThrottlingManager,
    add_scope,
    scope_cache,
    update_scope_backoff,
)
from scrapy_adaptive_throttle._crawler_throttler import get_throttler
from scrapy_adaptive_throttle._settings import ThrottlingSettings
from tests.server_checks import max_in_service as max_in_service_across
from tests.spiders import INDEX_PAGE_SCOPES, PagesSpider, run_crawl

# Every crawl runs twice: URLs queued at start, and yielded from a callback.
pytestmark = pytest.mark.usefixtures("spider_modes")

ADDON = {"scrapy_adaptive_throttle.Addon": 500}
PLAIN = "scrapy_adaptive_throttle.ThrottlingScopeManager"

#: tldextract without network access: the bundled Public Suffix List only.
offline_extract = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)


def settings(**extra: Any) -> dict[str, Any]:
    # The chapter describes the default scope manager, with fixed limits.
    return {
        "ADDONS": ADDON,
        "THROTTLING_SCOPE_MANAGER": PLAIN,
        "DOWNLOAD_DELAY": 0,
        "DOWNLOAD_DELAY_JITTER": 0,
        "CONCURRENT_REQUESTS": 100,
        **extra,
    }


def served(arrivals: list[list[Any]], host: str | None = None) -> list[list[Any]]:
    """Arrivals answered 200, optionally only those for *host*."""
    return [
        arrival
        for arrival in arrivals
        if arrival[3] == 200 and (host is None or urlparse(arrival[1]).netloc == host)
    ]


def max_in_service(arrivals: list[list[Any]]) -> int:
    """The most requests the simulated host served at once."""
    events = []
    for t, _, _, _, response_time in arrivals:
        events += [(t, 1), (t + response_time, -1)]
    current = peak = 0
    for _, change in sorted(events, key=lambda event: (event[0], event[1])):
        current += change
        peak = max(peak, current)
    return peak


def bursts(times: list[float], gap: float) -> list[list[float]]:
    """Group sorted times into bursts separated by more than *gap*."""
    groups: list[list[float]] = []
    for t in sorted(times):
        if groups and t - groups[-1][-1] <= gap:
            groups[-1].append(t)
        else:
            groups.append([t])
    return groups


# -- alternative domain throttling ---------------------------------------------


class RegistrableDomainManager:
    """The chapter's first "alternative domain throttling" manager."""

    def get_request_scopes(self, request):
        extracted = offline_extract(request.url)
        if extracted.domain and extracted.suffix:
            return f"{extracted.domain}.{extracted.suffix}"
        return urlparse_cached(request).netloc


class SubdomainLevelsManager:
    """The chapter's second one: one scope per subdomain level."""

    def get_request_scopes(self, request):
        extracted = offline_extract(request.url)
        if not (extracted.domain and extracted.suffix):
            return urlparse_cached(request).netloc
        scopes = set()
        registrable_domain = f"{extracted.domain}.{extracted.suffix}"
        scopes.add(registrable_domain)
        if extracted.subdomain:
            subdomain_parts = extracted.subdomain.split(".")
            for i in range(len(subdomain_parts)):
                subdomain = ".".join(subdomain_parts[i:])
                full_domain = f"{subdomain}.{registrable_domain}"
                scopes.add(full_domain)
        return scopes


@deferred_f_from_coro_f
async def test_registrable_domain_is_the_scope(simhosts):
    hosts = simhosts({"name": "P", "kind": "unlimited", "service_time": 0.1})
    urls = [
        f"http://{host}/{i}"
        for i in range(12)
        for host in ("books.toscrape.com", "toscrape.com", "quotes.toscrape.com")
    ]
    crawler = await run_crawl(
        PagesSpider,
        settings(
            THROTTLING_MANAGER=RegistrableDomainManager,
            THROTTLING_SCOPES={"toscrape.com": {"concurrency": 3}},
        ),
        urls=urls,
        meta={"proxy": hosts.url("P", "").rstrip("/")},
    )
    assert crawler.spider.unanswered() == []
    arrivals = served(hosts.stats("P")["arrivals"])
    assert len(arrivals) == 36
    # Three subdomains, one scope: never more than 3 at once in all.
    assert max_in_service(arrivals) == 3
    scopes = {state["scope"] for state in crawler.throttler.iter_scope_states()}
    assert scopes - INDEX_PAGE_SCOPES == {"toscrape.com"}


def test_subdomain_levels_manager_scopes():
    manager = SubdomainLevelsManager()
    assert manager.get_request_scopes(Request("http://a.books.toscrape.com/")) == {
        "toscrape.com",
        "books.toscrape.com",
        "a.books.toscrape.com",
    }
    assert manager.get_request_scopes(Request("http://toscrape.com/")) == {
        "toscrape.com"
    }
    assert manager.get_request_scopes(Request("http://127.0.0.1:80/")) == (
        "127.0.0.1:80"
    )


@deferred_f_from_coro_f
async def test_subdomain_limits_under_a_shared_registrable_domain_limit(simhosts):
    """books 24 + quotes 16 would be 40: the shared toscrape.com limit of 32
    keeps the sum at 32, while each subdomain reaches its own limit (books
    once quotes, which has far fewer pages, is done).

    Quotes (34 pages) and books (150) alternate for quotes' pages, so that
    both reach 16 at once (32 in all); after quotes is done, books has about
    five rounds left at 24. (With a third of the pages for quotes and the
    rest for books, alternated 1:2, quotes never reached 16, and books
    reached 24 only on a fast machine: 22 on a loaded CI run.)"""
    hosts = simhosts({"name": "P", "kind": "unlimited", "service_time": 0.25})
    books = [f"http://books.toscrape.com/{i}" for i in range(150)]
    quotes = [f"http://quotes.toscrape.com/{i}" for i in range(34)]
    urls = [url for pair in zip(quotes, books, strict=False) for url in pair]
    urls += books[len(quotes) :]
    crawler = await run_crawl(
        PagesSpider,
        settings(
            THROTTLING_MANAGER=SubdomainLevelsManager,
            THROTTLING_SCOPES={
                "toscrape.com": {"concurrency": 32},
                "books.toscrape.com": {"concurrency": 24},
                "quotes.toscrape.com": {"concurrency": 16},
            },
        ),
        urls=urls,
        meta={"proxy": hosts.url("P", "").rstrip("/")},
    )
    assert crawler.spider.unanswered() == []
    arrivals = hosts.stats("P")["arrivals"]
    assert len(served(arrivals)) == 184
    assert max_in_service(served(arrivals)) == 32
    assert max_in_service(served(arrivals, "books.toscrape.com")) == 24
    assert max_in_service(served(arrivals, "quotes.toscrape.com")) == 16


# -- endpoint-specific throttling ----------------------------------------------


class EndpointManager(ThrottlingManager):
    @scope_cache
    async def get_scopes(self, request):
        parsed_url = urlparse_cached(request)
        if parsed_url.netloc != "api.toscrape.com":
            return await super().get_scopes(request)
        return f"{parsed_url.netloc}{parsed_url.path}"


@deferred_f_from_coro_f
async def test_endpoint_specific_throttling(simhosts):
    """Each endpoint is its own scope with its own delay; the slow endpoint
    does not hold back the fast one. (The slow endpoint's delay is 0.5 s
    here, not the chapter's 5 s, to keep the test short.)"""
    hosts = simhosts({"name": "P", "kind": "unlimited"})
    fast = [f"http://api.toscrape.com/fast-endpoint?i={i}" for i in range(12)]
    slow = [f"http://api.toscrape.com/slow-endpoint?i={i}" for i in range(4)]
    crawler = await run_crawl(
        PagesSpider,
        settings(
            THROTTLING_MANAGER=EndpointManager,
            THROTTLING_SCOPES={
                "api.toscrape.com/fast-endpoint": {"concurrency": 1000, "delay": 0.08},
                "api.toscrape.com/slow-endpoint": {"delay": 0.5},
            },
        ),
        urls=slow + fast,
        meta={"proxy": hosts.url("P", "").rstrip("/")},
    )
    assert crawler.spider.unanswered() == []
    arrivals = hosts.stats("P")["arrivals"]
    fast_times = [t for t, path, *_ in arrivals if "/fast-endpoint" in path]
    slow_times = [t for t, path, *_ in arrivals if "/slow-endpoint" in path]
    assert len(fast_times) == 12
    assert len(slow_times) == 4
    # Gaps are seen at the server: the time from send to arrival varies by
    # some milliseconds on a loaded machine, so one gap may look shorter than
    # the delay, but never all of them: the mean is the delay's proof.
    gaps = [b - a for a, b in itertools.pairwise(fast_times)]
    assert min(gaps) >= 0.04
    assert sum(gaps) / len(gaps) >= 0.078
    slow_gaps = [b - a for a, b in itertools.pairwise(slow_times)]
    assert min(slow_gaps) >= 0.4
    assert sum(slow_gaps) / len(slow_gaps) >= 0.49
    # The slow endpoint does not hold the fast one back: while the slow one
    # waits its 0.5 s, fast requests keep going (about 6 per slow gap), and
    # all 12 are done before the last slow one starts (1.5 s vs 0.9 s).
    between = [t for t in fast_times if slow_times[0] < t < slow_times[1]]
    assert len(between) >= 3
    assert fast_times[-1] < slow_times[-1]


# -- web scraping API ---------------------------------------------------------------


class ScrapingApiManager(ThrottlingManager):
    """The chapter's two web-scraping-API snippets, in one class."""

    @scope_cache
    async def get_scopes(self, request):
        scopes = await super().get_scopes(request)
        if urlparse_cached(request).netloc != "api.toscrape.com":
            return scopes
        target_url = url_query_parameter(request.url, "url")
        if not target_url:
            return scopes
        target_domain = urlparse(target_url).netloc
        return add_scope(scopes, target_domain)

    async def get_response_backoff(self, response):
        if (
            urlparse_cached(response.request).netloc != "api.toscrape.com"
            or response.status != 200
        ):
            return await super().get_response_backoff(response)
        upstream_status_code = int(
            response.headers.get("X-Upstream-Status-Code", b"200")
        )
        upstream_response = response.__class__(
            response.url,
            status=upstream_status_code,
            headers=response.headers,
            body=response.body,
        )
        return await super().get_response_backoff(upstream_response)


def api_url(target: str, **query: str) -> str:
    extra = "".join(f"&{key}={value}" for key, value in query.items())
    return f"http://api.toscrape.com/?url={target}{extra}"


@deferred_f_from_coro_f
async def test_web_scraping_api_target_domain_scope(simhosts):
    """API requests also get the scope of the site they scrape: with
    books.toscrape.com limited to 1, its pages never overlap, while the API's
    own limit lets quotes.toscrape.com pages through side by side."""
    hosts = simhosts({"name": "P", "kind": "unlimited", "service_time": 0.3})
    urls = [
        api_url(f"http://{site}/{i}")
        for i in range(5)
        for site in ("books.toscrape.com", "quotes.toscrape.com")
    ]
    crawler = await run_crawl(
        PagesSpider,
        settings(
            THROTTLING_MANAGER=ScrapingApiManager,
            THROTTLING_SCOPES={
                "api.toscrape.com": {"concurrency": 1000, "delay": 0.08},
                "books.toscrape.com": {"concurrency": 1},
                "quotes.toscrape.com": {"concurrency": 8},
            },
        ),
        urls=urls,
        meta={"proxy": hosts.url("P", "").rstrip("/")},
    )
    assert crawler.spider.unanswered() == []
    arrivals = served(hosts.stats("P")["arrivals"])
    books = [a for a in arrivals if "books.toscrape.com" in a[1]]
    quotes = [a for a in arrivals if "quotes.toscrape.com" in a[1]]
    assert max_in_service(books) == 1
    assert max_in_service(quotes) > 1
    scopes = {state["scope"] for state in crawler.throttler.iter_scope_states()}
    assert scopes - INDEX_PAGE_SCOPES == {
        "api.toscrape.com",
        "books.toscrape.com",
        "quotes.toscrape.com",
    }


@deferred_f_from_coro_f
async def test_web_scraping_api_upstream_status_backs_off(simhosts):
    """A 200 from the API that says the target answered 429 (with
    Retry-After: 1) holds the request's scopes back for that second."""
    hosts = simhosts({"name": "P", "kind": "unlimited"})
    target = "http://books.toscrape.com"
    urls = [
        api_url(f"{target}/0")
        + "&header=X-Upstream-Status-Code:429&header=Retry-After:1",
        *(api_url(f"{target}/{i}") for i in range(1, 4)),
    ]
    crawler = await run_crawl(
        PagesSpider,
        settings(
            THROTTLING_MANAGER=ScrapingApiManager,
            THROTTLING_SCOPES={"books.toscrape.com": {"concurrency": 1}},
        ),
        urls=urls,
        meta={"proxy": hosts.url("P", "").rstrip("/")},
    )
    assert crawler.spider.unanswered() == []
    arrivals = hosts.stats("P")["arrivals"]
    first, *others = arrivals
    assert "X-Upstream-Status-Code" in first[1]
    assert min(t for t, *_ in others) >= first[0] + 0.95
    state = crawler.throttler.get_scope_state("books.toscrape.com")
    assert state["backoff_count"] == 1


# -- cost-capped throttling ------------------------------------------------------


def estimate_request_cost(request):
    # Each request says what it is expected to cost.
    return float(url_query_parameter(request.url, "estimate", "1"))


class CostManager(ThrottlingManager):
    """The chapter's two cost-capped snippets, in one class (the first
    snippet uses add_scope without importing it: imported here)."""

    @scope_cache
    async def get_scopes(self, request):
        scopes = await super().get_scopes(request)
        parsed_url = urlparse_cached(request)
        if parsed_url.netloc != "api.toscrape.com":
            return scopes
        return add_scope(scopes, "cost", estimate_request_cost(request))

    async def get_response_backoff(self, response):
        backoff = await super().get_response_backoff(response)
        if response.headers.get("X-Actual-Cost") is None:
            return backoff
        estimated = estimate_request_cost(response.request)
        actual = float(response.headers[b"X-Actual-Cost"])
        # Report the difference between actual and estimated cost.
        return update_scope_backoff(backoff, "cost", consumed=actual - estimated)


@deferred_f_from_coro_f
async def test_cost_capped_throttling(simhosts):
    """Requests estimated at 10 that actually cost 20, quota 100 per window:
    the reconciled quota lets 5 requests (100 units of real cost) through per
    window, not 10. (The window is 2 s here instead of 60 s: long enough
    that five requests sent one after the other fit in one window on a
    loaded machine.)"""
    hosts = simhosts({"name": "P", "kind": "unlimited"})
    urls = [
        f"http://api.toscrape.com/item/{i}?estimate=10&header=X-Actual-Cost:20"
        for i in range(15)
    ]
    crawler = await run_crawl(
        PagesSpider,
        settings(
            THROTTLING_MANAGER=CostManager,
            THROTTLING_WINDOW=2.0,
            THROTTLING_SCOPES={"cost": {"quota": 100.0}},
        ),
        urls=urls,
        meta={"proxy": hosts.url("P", "").rstrip("/")},
    )
    assert crawler.spider.unanswered() == []
    times = [t for t, *_ in served(hosts.stats("P")["arrivals"])]
    groups = bursts(times, gap=1.0)
    assert [len(group) for group in groups] == [5, 5, 5]
    for earlier, later in itertools.pairwise(groups):
        assert later[0] - earlier[0] >= 1.95
    state = crawler.throttler.get_scope_state("cost")
    assert state["backoff_count"] == 0  # reconciling is not backing off


# -- per-IP concurrency -----------------------------------------------------------


class IPThrottlingManager(ThrottlingManager):
    @scope_cache
    async def get_scopes(self, request):
        scopes = await super().get_scopes(request)
        host = urlparse_cached(request).hostname
        address = await run_in_thread(socket.gethostbyname, host)
        return add_scope(scopes, address)


@deferred_f_from_coro_f
async def test_per_ip_manager_limits_hosts_sharing_an_address(simhosts):
    """Two hosts on two ports of 127.0.0.1, named ``localhost``: each has its
    own scope (``localhost:PORT``, 4 at once), and the IP scope they share
    (``127.0.0.1``, CONCURRENT_REQUESTS_PER_IP 3) caps them together."""
    hosts = simhosts(
        {"name": "A", "kind": "unlimited", "service_time": 0.2},
        {"name": "B", "kind": "unlimited", "service_time": 0.2},
    )
    urls = [
        hosts.url(name, f"/{i}").replace("127.0.0.1", "localhost")
        for i in range(8)
        for name in "AB"
    ]
    with warnings.catch_warnings():
        # Scrapy's own downloader reads the setting with getint(), which
        # warns in 2.19; the plugin reads it without warning (tested below).
        warnings.filterwarnings(
            "ignore",
            "The CONCURRENT_REQUESTS_PER_IP setting is deprecated",
            module="scrapy.settings",
        )
        crawler = await run_crawl(
            PagesSpider,
            settings(
                THROTTLING_MANAGER=IPThrottlingManager,
                CONCURRENT_REQUESTS_PER_IP=3,
                THROTTLING_SCOPE_CONCURRENCY=4,
            ),
            urls=urls,
        )
    assert crawler.spider.unanswered() == []
    stats = [hosts.stats("A"), hosts.stats("B")]
    assert sum(len(served(host["arrivals"])) for host in stats) == 16
    # Each host counts time from its own first arrival: compare in epoch time.
    assert max_in_service_across(stats) == 3
    assert crawler.throttler.get_scope_state("127.0.0.1")["limit"] == 3


@deferred_f_from_coro_f
async def test_concurrent_requests_per_ip_is_the_default_of_ip_scopes(simhosts):
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.2})
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            "The CONCURRENT_REQUESTS_PER_IP setting is deprecated",
            module="scrapy.settings",
        )
        crawler = await run_crawl(
            PagesSpider,
            settings(CONCURRENT_REQUESTS_PER_IP=3, CONCURRENT_REQUESTS_PER_DOMAIN=8),
            urls=[hosts.url("A", f"/{i}") for i in range(12)],
        )
    assert crawler.spider.unanswered() == []
    assert hosts.stats("A")["max_concurrency"] == 3


def test_plugin_reads_concurrent_requests_per_ip_without_warning():
    crawler = get_crawler(settings_dict={**settings(), "CONCURRENT_REQUESTS_PER_IP": 3})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = ThrottlingSettings.from_settings(crawler.settings)
        throttler = get_throttler(crawler)
        throttler.get_scope_manager("127.0.0.1:8080")
    assert config.ip_concurrency == 3
    assert throttler.get_scope_manager("127.0.0.1:8080").concurrency == 3


# -- a custom scope manager ---------------------------------------------------------


class FixedWindowScopeManager:
    """The chapter's example, verbatim: it implements only part of the
    scope-manager protocol (no get_base_delay, concurrency_blocked, get_load,
    slot events, get_state...)."""

    def __init__(self, crawler, config):
        self.limit = config["quota"]
        self.window = config.get("window", 60.0)
        self.reset_at = None
        self.used = 0.0
        self.active = 0

    @classmethod
    def from_crawler(cls, crawler, config):
        return cls(crawler, config)

    def can_send(self, now=None, amount=None):
        now = now if now is not None else time.monotonic()
        if self.reset_at is not None and now >= self.reset_at:
            self.reset_at, self.used = None, 0.0
        if self.used and self.used + (amount or 0) > self.limit:
            return self.reset_at - now
        return 0.0

    def record_sent(self, now=None, amount=None):
        now = now if now is not None else time.monotonic()
        if self.reset_at is None:
            self.reset_at = now + self.window
        self.used += amount or 0
        self.active += 1

    def record_done(self, now=None):
        self.active = max(0, self.active - 1)

    def record_backoff(self, delay=None, now=None):
        pass  # this manager does not back off

    def reconcile_quota(self, consumed=None, remaining=None, now=None):
        if remaining is not None:
            self.used = max(0.0, self.limit - remaining)
        elif consumed is not None:
            self.used = max(0.0, self.used + consumed)

    def set_base_delay(self, delay):
        pass

    def set_concurrency(self, concurrency):
        pass

    def is_idle(self, now, max_idle):
        return self.active == 0


@pytest.mark.parametrize("scheduler_queue", ["throttling-aware", "scrapy"])
@deferred_f_from_coro_f
async def test_custom_scope_manager_through_the_manager_key(simhosts, scheduler_queue):
    """A fixed window of 4 units per second for the "api" scope, with the
    chapter's partial scope manager, through the throttling-aware queue and
    through the gate (Scrapy's own priority queue); 503s and delay_scope()
    reach methods it does not have, and nothing crashes."""
    hosts = simhosts({"name": "A", "kind": "unlimited"})
    urls = [hosts.url("A", f"/{i}?status=503") for i in range(2)] + [
        hosts.url("A", f"/{i}") for i in range(2, 12)
    ]
    extra: dict[str, Any] = {}
    if scheduler_queue == "scrapy":
        extra["SCHEDULER_PRIORITY_QUEUE"] = "scrapy.pqueues.ScrapyPriorityQueue"

    class DelayingSpider(PagesSpider):
        def parse(self, response, **kwargs):
            super().parse(response, **kwargs)
            self.crawler.throttler.delay_scope("api", 0.0)

    crawler = await run_crawl(
        DelayingSpider,
        settings(
            THROTTLING_SCOPES={
                "api": {"manager": FixedWindowScopeManager, "quota": 4.0, "window": 1.0}
            },
            RETRY_ENABLED=False,
            **extra,
        ),
        urls=urls,
        meta={"throttling_scopes": {"api": 1.0}},
    )
    assert crawler.spider.unanswered() == []
    times = [t for t, *_ in hosts.stats("A")["arrivals"]]
    groups = bursts(times, gap=0.5)
    assert [len(group) for group in groups] == [4, 4, 4]
    for earlier, later in itertools.pairwise(groups):
        assert later[0] - earlier[0] >= 0.95
    state = crawler.throttler.get_scope_state("api")
    assert state["manager"] == "FixedWindowScopeManager"
