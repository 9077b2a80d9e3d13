"""The engine sees every download the plugin runs, on both reactors.

Regression tests for downloads that the engine could not see on the asyncio
reactor (the request entered ``downloader.active`` a loop turn late): the
spider closed while pages were still downloading, dropping what their
callbacks would yield, and ``CONCURRENT_REQUESTS`` was exceeded. Every crawl
here yields requests from callbacks, and each runs with and without the
plugin: the plugin must never do worse than Scrapy.
"""

from __future__ import annotations

import socket

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.engine_crawls import ADDON, REACTORS, crawl_follow
from tests.server_checks import max_in_service

WITH_AND_WITHOUT = pytest.mark.parametrize(
    "plugin", [True, False], ids=["plugin", "plain-scrapy"]
)
ON_BOTH_REACTORS = pytest.mark.parametrize("reactor", REACTORS)


def _settings(plugin: bool, **settings: object) -> dict[str, object]:
    return {**settings, "ADDONS": ADDON} if plugin else dict(settings)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@ON_BOTH_REACTORS
@WITH_AND_WITHOUT
@deferred_f_from_coro_f
async def test_a_chain_of_links_with_a_delay_is_followed_to_the_end(
    simhosts, reactor, plugin
):
    # Each page links to the next; with a delay, the scheduler is empty while
    # a page downloads, which is when an engine blind to the download closed
    # the spider (2 of 8 pages fetched before the fix).
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.01})
    result = await crawl_follow(
        reactor,
        _settings(plugin, DOWNLOAD_DELAY=0.3),
        [hosts.url("A")],
        depth=7,
        fanout=1,
    )
    assert len(result["expected"]) == 8
    assert result["lost"] == []
    assert len(result["responses"]) == 8
    assert result["finish_reason"] == "finished"
    assert hosts.stats("A")["requests"] == 8


@ON_BOTH_REACTORS
@WITH_AND_WITHOUT
@deferred_f_from_coro_f
async def test_concurrent_requests_holds_at_the_server_for_followed_links(
    simhosts, reactor, plugin
):
    # Four hosts, each allowed 16 at once: only CONCURRENT_REQUESTS (8)
    # can hold the total down, and it must, counted at the server.
    names = ["A", "B", "C", "D"]
    hosts = simhosts(
        *({"name": name, "kind": "unlimited", "service_time": 0.05} for name in names)
    )
    result = await crawl_follow(
        reactor,
        _settings(
            plugin,
            CONCURRENT_REQUESTS=8,
            CONCURRENT_REQUESTS_PER_DOMAIN=16,
            THROTTLING_LATENCY_INITIAL_CONCURRENCY=16,
        ),
        [hosts.url(name) for name in names],
        depth=2,
        fanout=5,
        child_hosts=[hosts.url(name) for name in names],
    )
    assert result["lost"] == []
    assert len(result["responses"]) == len(result["expected"]) == 4 * 31
    peak = max_in_service(hosts.stats(name) for name in names)
    assert peak <= 8
    # The limit is reached, not just respected by a crawl too slow to test it.
    assert peak >= 6


@ON_BOTH_REACTORS
@WITH_AND_WITHOUT
@deferred_f_from_coro_f
async def test_retries_of_followed_links_are_never_dropped(simhosts, reactor, plugin):
    # Children answer 500 (retried, then given up) and seeds on closed ports
    # fail to connect (retried, then given up): every request ends reported.
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.01})
    dead = [f"http://127.0.0.1:{_closed_port()}" for _ in range(20)]
    result = await crawl_follow(
        reactor,
        _settings(plugin, RETRY_TIMES=2, DOWNLOAD_DELAY=0.05),
        [hosts.url("A"), *dead],
        depth=2,
        fanout=3,
        child_query="status=500",
    )
    assert result["lost"] == []
    connection_failures = [
        entry for entry in result["failures"] if "ConnectionRefused" in entry["error"]
    ]
    assert len(connection_failures) == 20
    # 3 children + 9 grandchildren of the live seed, each tried 3 times.
    assert hosts.stats("A")["requests"] == 1 + 3 * 12
    stats = result["stats"]
    assert stats["retry/max_reached"] == 20 + 12
    assert result["finish_reason"] == "finished"
