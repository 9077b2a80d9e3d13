"""Errors in user code and user data stay with the request concerned.

Each test breaks one thing a user controls (a custom scope manager or
manager, request meta, scope ids) and checks, on both reactors and with
links followed from callbacks: the crawl finishes (never hangs), nothing
else is lost, the request concerned is reported once with its URL (or sent
with its host's scope), and no slot is leaked (later requests of a scope of
concurrency 1 still go out).
"""

from __future__ import annotations

import logging

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.engine_crawls import ADDON, REACTORS, crawl_follow

ON_BOTH_REACTORS = pytest.mark.parametrize("reactor", REACTORS)
ERROR_STAT = "throttling/component_error_count"
#: A hung crawl ends with "closespider_timeout" instead of "finished".
GUARD = {"CLOSESPIDER_TIMEOUT": 60}


async def _crawl(reactor, settings, urls, **spider_kwargs):
    """Crawl with the add-on and a guard against hangs; it must finish."""
    result = await crawl_follow(
        reactor, {**GUARD, "ADDONS": ADDON, **settings}, urls, **spider_kwargs
    )
    assert result["finish_reason"] == "finished"
    return result


def _two_hosts(simhosts):
    return simhosts(
        {"name": "A", "kind": "unlimited", "service_time": 0.01},
        {"name": "B", "kind": "unlimited", "service_time": 0.01},
    )


@ON_BOTH_REACTORS
@deferred_f_from_coro_f
async def test_a_scope_manager_whose_can_send_raises_fails_only_its_requests(
    simhosts, reactor
):
    hosts = _two_hosts(simhosts)
    result = await _crawl(
        reactor,
        {
            "THROTTLING_SCOPES": {
                hosts.netloc("B"): {"manager": "tests.faulty_components.CanSendRaises"}
            },
        },
        [hosts.url("A"), hosts.url("B")],
        depth=2,
        fanout=3,
        child_hosts=[hosts.url("A"), hosts.url("B")],
    )
    assert result["lost"] == []
    failed = {entry["url"] for entry in result["failures"]}
    answered = {entry["url"] for entry in result["responses"]}
    assert failed
    assert answered
    assert all(hosts.netloc("B") in url for url in failed)
    assert all(hosts.netloc("A") in url for url in answered)
    assert {entry["error"] for entry in result["failures"]} == {
        "ThrottlingComponentError"
    }
    assert hosts.stats("B")["requests"] == 0
    assert result["stats"][ERROR_STAT] == len(failed)


@ON_BOTH_REACTORS
@deferred_f_from_coro_f
async def test_record_sent_raising_after_the_pop_leaks_no_slot(simhosts, reactor):
    # Concurrency 1: a leaked slot would block every later request of B.
    hosts = _two_hosts(simhosts)
    result = await _crawl(
        reactor,
        {
            "THROTTLING_SCOPES": {
                hosts.netloc("B"): {
                    "manager": "tests.faulty_components.RecordSentRaisesEveryOther",
                    "concurrency": 1,
                }
            },
        },
        [hosts.url("B")],
        depth=3,
        fanout=2,
    )
    assert result["lost"] == []
    assert result["failures"], "no record_sent failed: the test tests nothing"
    assert result["responses"]
    assert len(result["failures"]) + len(result["responses"]) == len(result["expected"])
    assert hosts.stats("B")["max_concurrency"] == 1


@ON_BOTH_REACTORS
@deferred_f_from_coro_f
async def test_a_scope_manager_that_cannot_be_built_fails_only_its_requests(
    simhosts, reactor
):
    hosts = _two_hosts(simhosts)
    result = await _crawl(
        reactor,
        {
            "THROTTLING_SCOPES": {
                hosts.netloc("B"): {"manager": "tests.faulty_components.InitRaises"}
            },
        },
        [hosts.url("A"), hosts.url("B")],
        depth=1,
        fanout=4,
        child_hosts=[hosts.url("A"), hosts.url("B")],
    )
    assert result["lost"] == []
    assert hosts.stats("B")["requests"] == 0
    assert {hosts.netloc("B") in e["url"] for e in result["failures"]} == {True}
    assert len(result["responses"]) == hosts.stats("A")["requests"] > 0


@ON_BOTH_REACTORS
@deferred_f_from_coro_f
async def test_a_failing_record_done_still_delivers_the_page(simhosts, reactor):
    hosts = _two_hosts(simhosts)
    result = await _crawl(
        reactor,
        {
            "THROTTLING_SCOPES": {
                hosts.netloc("A"): {
                    "manager": "tests.faulty_components.RecordDoneRaises"
                }
            },
        },
        [hosts.url("A")],
        depth=2,
        fanout=2,
    )
    assert result["lost"] == []
    assert result["failures"] == []
    assert len(result["responses"]) == 7
    assert result["stats"][ERROR_STAT] == 7


@ON_BOTH_REACTORS
@deferred_f_from_coro_f
async def test_a_failing_backoff_hook_still_delivers_the_page(simhosts, reactor):
    hosts = _two_hosts(simhosts)
    result = await _crawl(
        reactor,
        {
            "THROTTLING_MANAGER": "tests.faulty_components.ResponseBackoffRaises",
        },
        [hosts.url("A")],
        depth=2,
        fanout=2,
    )
    assert result["finish_reason"] == "finished"
    assert result["failures"] == []
    assert len(result["responses"]) == 7
    assert result["stats"][ERROR_STAT] == 7


@ON_BOTH_REACTORS
@deferred_f_from_coro_f
async def test_invalid_scopes_meta_sends_with_the_host_scope(simhosts, reactor):
    # Bad throttling_scopes on every request, start requests and followed
    # links alike: each is reported and sent throttled as its host.
    hosts = _two_hosts(simhosts)
    result = await _crawl(
        reactor,
        {
            "THROTTLING_SCOPES": {hosts.netloc("A"): {"concurrency": 1}},
        },
        [hosts.url("A"), hosts.url("A"), hosts.url("A")],
        depth=1,
        fanout=3,
        meta={"throttling_scopes": 5},
    )
    assert result["lost"] == []
    assert result["failures"] == []
    assert len(result["responses"]) == 12
    assert result["stats"][ERROR_STAT] == 12
    # Sent with the host's scope: its concurrency of 1 held.
    assert hosts.stats("A")["max_concurrency"] == 1


@deferred_f_from_coro_f
async def test_each_failing_request_is_reported_once_with_its_url(simhosts, caplog):
    hosts = _two_hosts(simhosts)
    with caplog.at_level(logging.ERROR, logger="scrapy_adaptive_throttle"):
        result = await _crawl(
            "asyncio",
            {
                "THROTTLING_MANAGER": (
                    "tests.faulty_components.ScopesRaiseForMarkedURLs"
                ),
                "LOG_LEVEL": "ERROR",
            },
            [hosts.url("A"), hosts.url("B"), hosts.url("A")],
            depth=1,
            fanout=2,
            # Seeds: invalid meta; children: the manager raises.
            child_query="boom=1",
            meta={"throttling_scopes": [1, 2]},
        )
    assert result["lost"] == []
    errors = [
        record.getMessage()
        for record in caplog.records
        if record.name.startswith("scrapy_adaptive_throttle")
    ]
    urls = [entry["url"] for entry in result["responses"]]
    assert len(urls) == 9
    for url in urls:
        assert sum(url in message for message in errors) == 1, url
    # The traceback is logged once per failing component, not per request.
    assert sum(record.exc_info is not None for record in caplog.records) <= 2


@deferred_f_from_coro_f
async def test_each_failing_request_is_reported_once_on_the_epoll_reactor(simhosts):
    # The same crawl in an EPoll process, counted in its log.
    hosts = _two_hosts(simhosts)
    result = await _crawl(
        "epoll",
        {
            "THROTTLING_MANAGER": "tests.faulty_components.ScopesRaiseForMarkedURLs",
            "LOG_LEVEL": "ERROR",
        },
        [hosts.url("A"), hosts.url("B"), hosts.url("A")],
        depth=1,
        fanout=2,
        child_query="boom=1",
        meta={"throttling_scopes": [1, 2]},
    )
    assert result["lost"] == []
    errors = [
        line
        for line in result["log"].splitlines()
        if "[scrapy_adaptive_throttle." in line and "] ERROR: " in line
    ]
    urls = [entry["url"] for entry in result["responses"]]
    assert len(urls) == 9
    for url in urls:
        assert sum(url in line for line in errors) == 1, url
    assert len(errors) == 9
    assert result["stats"][ERROR_STAT] == 9
    assert result["log"].count("Traceback (most recent call last)") <= 2


@pytest.mark.parametrize("delay", [-1, "nan", "inf", 1e12, True])
@deferred_f_from_coro_f
async def test_out_of_range_throttling_delay_is_ignored_with_one_warning(
    simhosts, caplog, delay
):
    # Logs are read here, in the test process (asyncio reactor); the EPoll
    # test below checks the same crawl by its stats.
    hosts = _two_hosts(simhosts)
    value = float(delay) if isinstance(delay, str) else delay
    with caplog.at_level(logging.WARNING, logger="scrapy_adaptive_throttle"):
        result = await crawl_follow(
            "asyncio",
            {**GUARD, "ADDONS": ADDON, "CLOSESPIDER_TIMEOUT": 20},
            [hosts.url("A")],
            depth=1,
            fanout=3,
            meta={"throttling_delay": value},
        )
    assert result["finish_reason"] == "finished"
    assert len(result["responses"]) == 4
    warnings = [
        record for record in caplog.records if "throttling_delay" in record.getMessage()
    ]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING
    assert result["stats"]["throttling/invalid_delay_count"] == 4


@ON_BOTH_REACTORS
@deferred_f_from_coro_f
async def test_a_manager_written_only_to_the_protocol_crawls_to_the_end(
    simhosts, reactor
):
    hosts = _two_hosts(simhosts)
    result = await _crawl(
        reactor,
        {
            "THROTTLING_MANAGER": "tests.protocol_manager.ProtocolOnlyManager",
            "CONCURRENT_REQUESTS": 16,
        },
        [hosts.url("A"), hosts.url("B")],
        depth=2,
        fanout=4,
        child_hosts=[hosts.url("A"), hosts.url("B")],
        child_query="delay=0.05",
    )
    assert result["lost"] == []
    assert len(result["responses"]) == 2 * 21
    # Its limit of 2 per host held at the server, and was reached.
    assert hosts.stats("A")["max_concurrency"] == 2
    assert hosts.stats("B")["max_concurrency"] == 2


@pytest.mark.parametrize("delay", [-1, "nan", "inf", 1e12])
@deferred_f_from_coro_f
async def test_out_of_range_throttling_delays_on_the_epoll_reactor(simhosts, delay):
    hosts = _two_hosts(simhosts)
    result = await crawl_follow(
        "epoll",
        {**GUARD, "ADDONS": ADDON, "CLOSESPIDER_TIMEOUT": 20},
        [hosts.url("A"), hosts.url("B")],
        depth=1,
        fanout=3,
        meta={"throttling_delay": float(delay) if isinstance(delay, str) else delay},
    )
    assert result["finish_reason"] == "finished"
    assert len(result["responses"]) == 8
    assert result["stats"]["throttling/invalid_delay_count"] == 8
    # One warning for the whole crawl (the log is at WARNING level).
    warnings = [
        line
        for line in result["log"].splitlines()
        if "WARNING: Ignoring the throttling_delay" in line
    ]
    assert len(warnings) == 1, warnings


@ON_BOTH_REACTORS
@deferred_f_from_coro_f
async def test_a_failing_release_still_delivers_the_page(simhosts, reactor):
    hosts = _two_hosts(simhosts)
    result = await _crawl(
        reactor,
        {"THROTTLING_MANAGER": "tests.faulty_components.ReleaseRaises"},
        [hosts.url("A")],
        depth=2,
        fanout=2,
    )
    assert result["lost"] == []
    assert result["failures"] == []
    assert len(result["responses"]) == 7
    assert result["stats"][ERROR_STAT] == 7


@ON_BOTH_REACTORS
@deferred_f_from_coro_f
async def test_a_failing_exception_backoff_hook_keeps_the_download_error(
    simhosts, reactor
):
    # Children reset their connection: each is retried, then reaches its
    # errback with the download error itself, not the hook's.
    hosts = _two_hosts(simhosts)
    result = await _crawl(
        reactor,
        {
            "THROTTLING_MANAGER": "tests.faulty_components.ExceptionBackoffRaises",
            "RETRY_TIMES": 1,
        },
        [hosts.url("A")],
        depth=1,
        fanout=3,
        child_query="drop=1",
    )
    assert result["lost"] == []
    assert len(result["responses"]) == 1
    assert len(result["failures"]) == 3
    errors = {entry["error"] for entry in result["failures"]}
    assert "ThrottlingComponentError" not in errors
    assert errors <= {"ResponseNeverReceived", "ConnectionLost", "DownloadFailedError"}
    assert result["stats"]["retry/count"] == 3
    assert result["stats"][ERROR_STAT] >= 6  # every attempt of every child
