"""Managers and scope managers written only to the documented protocols.

Real crawls with the add-on (its scheduler queue and downloader), on both
reactors, with links followed from callbacks; every limit is checked at the
server. A class that does not implement the protocol fails at start-up with
a message naming the setting.
"""

from __future__ import annotations

import itertools

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.engine_crawls import ADDON, REACTORS, crawl_follow
from tests.spiders import PagesSpider, run_crawl

ON_BOTH_REACTORS = pytest.mark.parametrize("reactor", REACTORS)
#: A hung crawl ends with "closespider_timeout" instead of "finished".
GUARD = {"CLOSESPIDER_TIMEOUT": 60}
MANAGER = "tests.protocol_manager.ProtocolOnlyManager"
SCOPE_MANAGER = "tests.protocol_scope_manager.ProtocolOnlyScopeManager"


async def _crawl(reactor, settings, urls, **spider_kwargs):
    result = await crawl_follow(
        reactor, {**GUARD, "ADDONS": ADDON, **settings}, urls, **spider_kwargs
    )
    assert result["finish_reason"] == "finished"
    assert result["lost"] == []
    assert result["failures"] == []
    return result


def _two_hosts(simhosts, service_time=0.05):
    return simhosts(
        {"name": "A", "kind": "unlimited", "service_time": service_time},
        {"name": "B", "kind": "unlimited", "service_time": service_time},
    )


def _gaps(hosts, name):
    times = sorted(record[0] for record in hosts.stats(name)["arrivals"])
    return [later - earlier for earlier, later in itertools.pairwise(times)]


@ON_BOTH_REACTORS
@deferred_f_from_coro_f
async def test_a_protocol_only_manager_with_a_time_gate_spaces_every_send(
    simhosts, reactor
):
    # Concurrency 1 and 0.1 s between sends per host: the queue learns both
    # the time gate (get_time_until_ready) and the freed slot (release) from
    # the protocol alone, for requests yielded from callbacks.
    hosts = _two_hosts(simhosts, service_time=0.01)
    result = await _crawl(
        reactor,
        {
            "THROTTLING_MANAGER": MANAGER,
            "PROTOCOL_MANAGER_LIMIT": 1,
            "PROTOCOL_MANAGER_DELAY": 0.1,
            "CONCURRENT_REQUESTS": 16,
        },
        [hosts.url("A"), hosts.url("B")],
        depth=2,
        fanout=3,
        child_hosts=[hosts.url("A"), hosts.url("B")],
    )
    assert len(result["responses"]) == 2 * 13
    for name in "AB":
        assert hosts.stats(name)["max_concurrency"] == 1
        gaps = _gaps(hosts, name)
        assert len(gaps) == 12
        # Spacing is counted from the send: the first request also opens a
        # connection (tens of milliseconds here), so its arrival is late and
        # the first gap short; the others vary by a few milliseconds.
        later = gaps[1:]
        assert min(later) >= 0.08, (name, gaps)
        assert sum(later) >= 11 * 0.1 - 0.02, (name, gaps)


@ON_BOTH_REACTORS
@deferred_f_from_coro_f
async def test_a_protocol_only_scope_manager_holds_its_limit_at_the_server(
    simhosts, reactor
):
    hosts = _two_hosts(simhosts)
    result = await _crawl(
        reactor,
        {
            "THROTTLING_SCOPE_MANAGER": SCOPE_MANAGER,
            "THROTTLING_SCOPES": {hosts.netloc("B"): {"concurrency": 2}},
            "CONCURRENT_REQUESTS": 32,
        },
        [hosts.url("A"), hosts.url("B")],
        depth=2,
        fanout=5,
        child_hosts=[hosts.url("A"), hosts.url("B")],
    )
    assert len(result["responses"]) == 2 * 31
    # Its default of 3 for A, the configured 2 for B: reached, never exceeded.
    assert hosts.stats("A")["max_concurrency"] == 3
    assert hosts.stats("B")["max_concurrency"] == 2
    assert result["stats"].get("throttling/component_error_count", 0) == 0


@ON_BOTH_REACTORS
@deferred_f_from_coro_f
async def test_a_scope_manager_with_only_the_required_methods_crawls_to_the_end(
    simhosts, reactor
):
    hosts = _two_hosts(simhosts, service_time=0.01)
    result = await _crawl(
        reactor,
        {
            "THROTTLING_SCOPES": {
                hosts.netloc("B"): {
                    "manager": "tests.protocol_scope_manager.CountingOnly"
                }
            },
        },
        [hosts.url("A"), hosts.url("B")],
        depth=2,
        fanout=3,
        child_hosts=[hosts.url("A"), hosts.url("B")],
    )
    assert len(result["responses"]) == 2 * 13
    assert hosts.stats("B")["requests"] == 13
    # A keeps the add-on's own scope manager and its limit (the default
    # domain concurrency is 8; 127.0.0.1:PORT is an IP scope with the same).
    assert hosts.stats("A")["max_concurrency"] <= 8


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"THROTTLING_MANAGER": "tests.protocol_scope_manager.NotAManager"},
            "Invalid THROTTLING_MANAGER value "
            "'tests.protocol_scope_manager.NotAManager': it does not implement "
            "ThrottlingManagerProtocol (missing: get_scopes, release, "
            "process_response, process_exception)",
        ),
        (
            {
                "THROTTLING_SCOPE_MANAGER": (
                    "tests.protocol_scope_manager.NotAScopeManager"
                )
            },
            "Invalid THROTTLING_SCOPE_MANAGER value "
            "'tests.protocol_scope_manager.NotAScopeManager': it does not "
            "implement ThrottlingScopeManagerProtocol (missing: can_send, "
            "record_sent, record_done)",
        ),
        (
            {
                "THROTTLING_SCOPES": {
                    "api": {"manager": "tests.protocol_scope_manager.NotAScopeManager"}
                }
            },
            "Invalid THROTTLING_SCOPES['api']['manager'] value",
        ),
    ],
)
@deferred_f_from_coro_f
async def test_a_class_that_is_not_the_protocol_fails_at_start_up(
    simhosts, settings, message
):
    hosts = simhosts({"name": "A", "kind": "unlimited"})
    with pytest.raises(ValueError, match="Invalid ") as raised:
        await run_crawl(
            PagesSpider, {"ADDONS": ADDON, **settings}, urls=[hosts.url("A")]
        )
    assert message in str(raised.value)
    # Nothing was sent.
    assert hosts.stats("A")["requests"] == 0


@ON_BOTH_REACTORS
@deferred_f_from_coro_f
async def test_a_manager_with_only_the_core_methods_crawls_to_the_end(
    simhosts, reactor
):
    # get_scopes, acquire, release, process_response, process_exception: the
    # queue hands requests out as they come and acquire() holds them.
    hosts = _two_hosts(simhosts, service_time=0.02)
    result = await _crawl(
        reactor,
        {
            "THROTTLING_MANAGER": "tests.protocol_manager.MinimalManager",
            "CONCURRENT_REQUESTS": 16,
        },
        [hosts.url("A"), hosts.url("B")],
        depth=2,
        fanout=4,
        child_hosts=[hosts.url("A"), hosts.url("B")],
    )
    assert len(result["responses"]) == 2 * 21
    assert hosts.stats("A")["max_concurrency"] == 2
    assert hosts.stats("B")["max_concurrency"] == 2
