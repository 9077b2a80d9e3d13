"""explain(): why a request or a scope waits, with a fake clock; the decision
log's rate limit; the telnet shortcut (fired through Scrapy's signal)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from scrapy import Request
from scrapy.extensions.telnet import update_telnet_vars
from scrapy.http import Response
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_adaptive_throttle import LatencyScopeManager, ThrottlingManager
from scrapy_adaptive_throttle._decisions import DecisionLog
from scrapy_adaptive_throttle._diagnostics import ThrottlingDiagnostics
from scrapy_adaptive_throttle._explain import Explanation, ScopeExplanation
from tests.fake_clock import FakeClock

SCOPE = "example.com"
URL = f"https://{SCOPE}/page"


def make_manager(**settings: Any) -> tuple[ThrottlingManager, FakeClock]:
    base = {"BACKOFF_JITTER": 0, "DOWNLOAD_DELAY_JITTER": 0, "DOWNLOAD_DELAY": 0}
    crawler = get_crawler(settings_dict={**base, **settings})
    manager = ThrottlingManager(crawler)
    crawler.throttler = manager  # type: ignore[attr-defined]
    clock = FakeClock()
    manager.clock = clock
    return manager, clock


def send(manager: ThrottlingManager, url: str = URL) -> Request:
    request = Request(url)
    values = [(scope, None) for scope in [request.url.split("/")[2]]]
    manager.reserve_scopes(request, values, manager.clock())
    return request


def only(explanation: Explanation) -> ScopeExplanation:
    assert len(explanation.scopes) == 1
    return explanation.scopes[0]


def test_a_fresh_scope_is_not_created_by_looking() -> None:
    manager, _ = make_manager()
    answer = manager.explain(SCOPE)
    scope = only(answer)
    assert scope.known is False
    assert scope.reason is None
    assert answer.ready
    assert SCOPE not in manager._scope_managers
    assert "no state yet" in str(scope)


def test_concurrency_is_the_reason_when_every_slot_is_taken() -> None:
    manager, _ = make_manager(CONCURRENT_REQUESTS_PER_DOMAIN=2)
    send(manager)
    assert only(manager.explain(SCOPE)).reason is None
    send(manager)
    scope = only(manager.explain(Request(URL)))
    assert (scope.reason, scope.in_flight, scope.limit) == ("concurrency", 2, 2)
    assert scope.wait == 0.0
    assert "concurrency 2/2" in str(scope)


def test_the_delay_is_the_reason_until_it_elapses() -> None:
    manager, clock = make_manager(DOWNLOAD_DELAY=2.0, CONCURRENT_REQUESTS_PER_DOMAIN=8)
    send(manager)
    clock.now = 0.5
    answer = manager.explain(Request(URL))
    assert answer.reasons == {SCOPE: "delay"}
    assert answer.wait == pytest.approx(1.5)
    clock.now = 2.0
    assert manager.explain(Request(URL)).ready


@deferred_f_from_coro_f
async def test_a_server_hold_names_its_status_and_header() -> None:
    manager, clock = make_manager(CONCURRENT_REQUESTS_PER_DOMAIN=8)
    request = send(manager)
    response = Response(URL, status=503, headers={"Retry-After": "30"}, request=request)
    await manager.process_response(response)
    clock.now = 10.0
    scope = only(manager.explain(SCOPE))
    assert scope.reason == "backoff_hold"
    assert scope.wait == pytest.approx(20.0)
    assert scope.backoff_cause == "status/503, Retry-After: 30"
    assert "backoff caused by status/503, Retry-After: 30" in str(scope)
    clock.now = 31.0
    assert only(manager.explain(SCOPE)).reason is None


def test_backoff_steps_are_told_apart_from_the_configured_delay() -> None:
    manager, clock = make_manager(
        CONCURRENT_REQUESTS_PER_DOMAIN=8, BACKOFF_MIN_DELAY=1.0
    )
    send(manager)
    manager.apply_backoff(SCOPE, now=0.0, cause="status/429")
    clock.now = 0.25
    scope = only(manager.explain(SCOPE))
    assert scope.reason == "backoff"
    assert scope.backoff_level == 1
    assert scope.backoff_cause == "status/429"


def test_a_used_up_quota_is_the_reason() -> None:
    manager, clock = make_manager(
        THROTTLING_SCOPES={SCOPE: {"quota": 2, "window": 10.0, "concurrency": 8}}
    )
    request = Request(URL, meta={"throttling_scopes": {SCOPE: 1}})
    for _ in range(2):
        manager.reserve_scopes(Request(URL), [(SCOPE, 1)], 0.0)
    clock.now = 4.0
    scope = only(manager.explain(request))
    assert scope.reason == "quota"
    assert scope.wait == pytest.approx(6.0)


def test_a_crawl_delay_is_named_as_such() -> None:
    manager, clock = make_manager(CONCURRENT_REQUESTS_PER_DOMAIN=8, ROBOTSTXT_OBEY=True)
    manager.apply_robots_crawl_delay(SCOPE, 5.0)
    send(manager)
    clock.now = 1.0
    scope = only(manager.explain(SCOPE))
    assert scope.reasons.keys() == {"crawl_delay", "concurrency"}
    assert scope.reason == "crawl_delay"  # the longer wait
    assert scope.wait == pytest.approx(4.0)


def test_every_scope_of_a_request_answers() -> None:
    manager, _ = make_manager(THROTTLING_SCOPES={"api": {"concurrency": 1}})
    request = Request(URL, meta={"throttling_scopes": [SCOPE, "api"]})
    manager.reserve_scopes(Request(URL), [("api", None)], 0.0)
    answer = manager.explain(request)
    assert [s.scope for s in answer.scopes] == [SCOPE, "api"]
    assert answer.reasons == {"api": "concurrency"}
    assert not answer.ready
    text = repr(answer)
    assert text.startswith(f"{URL}: waiting")
    assert "api: in flight 1/limit 1; waiting: concurrency 1/1" in text


def test_looking_changes_nothing() -> None:
    manager, clock = make_manager(CONCURRENT_REQUESTS_PER_DOMAIN=8, BACKOFF_WINDOW=1)
    send(manager)
    manager.apply_backoff(SCOPE, now=0.0)
    clock.now = 5.0  # quiet windows have passed: the gate would recover
    before = manager._scope_managers[SCOPE].get_state(5.0)
    manager.explain(SCOPE)
    assert manager._scope_managers[SCOPE].get_state(5.0) == before


def test_a_custom_scope_manager_answers_through_its_protocol() -> None:
    class Minimal:
        def __init__(self, crawler: Any, config: dict[str, Any]) -> None:
            self.active = 0

        def can_send(self, now: float, amount: float | None = None) -> float:
            return 3.0

        def record_sent(self, now: float, amount: float | None = None) -> None:
            self.active += 1

        def record_done(self, now: float) -> None:
            self.active -= 1

    manager, _ = make_manager(THROTTLING_SCOPES={SCOPE: {"manager": Minimal}})
    send(manager)
    scope = only(manager.explain(SCOPE))
    assert (scope.reason, scope.wait) == ("other", 3.0)


def test_the_telnet_shortcut_explains_urls_and_scopes() -> None:
    manager, _ = make_manager(CONCURRENT_REQUESTS_PER_DOMAIN=1)
    diagnostics = ThrottlingDiagnostics(manager.crawler)
    assert diagnostics is not None
    send(manager)
    telnet_vars: dict[str, Any] = {}
    manager.crawler.signals.send_catch_log(update_telnet_vars, telnet_vars=telnet_vars)
    shortcut = telnet_vars["explain"]
    assert telnet_vars["throttler"] is manager
    by_url = shortcut(URL)
    assert by_url.request.url == URL
    assert by_url.reasons == {SCOPE: "concurrency"}
    assert shortcut(SCOPE).reasons == {SCOPE: "concurrency"}
    assert "waiting: concurrency 1/1" in repr(by_url)


# -- the decision log ---------------------------------------------------------


def test_each_scope_logs_a_burst_then_one_line_per_interval() -> None:
    log = DecisionLog(scope_interval=10.0, scope_burst=3, lines_per_second=100)
    allowed = [log.allow("a", 0.1 * step, "limit") for step in range(6)]
    assert allowed == [0, 0, 0, None, None, None]
    # Another kind of decision of the same scope has its own bucket.
    assert log.allow("a", 0.6, "backoff") == 0
    assert log.allow("a", 5.0, "limit") is None
    # One line refilled after 10 s; it reports the 4 left out.
    assert log.allow("a", 10.3, "limit") == 4
    assert log.allow("a", 10.4, "limit") is None


def test_the_whole_crawl_writes_a_bounded_number_of_lines_a_second() -> None:
    log = DecisionLog(scope_interval=10.0, scope_burst=5, lines_per_second=20)
    allowed = [log.allow(f"host{n}", 0.5, "limit") for n in range(100_000)]
    assert sum(skipped is not None for skipped in allowed) == 20
    assert log.dropped == 100_000 - 20
    assert log.allow("host-late", 1.6, "limit") == 0


def test_adaptive_limit_changes_are_logged_with_throttling_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    manager, _ = make_manager(
        THROTTLING_DEBUG=True,
        THROTTLING_SCOPE_MANAGER=LatencyScopeManager,
        CONCURRENT_REQUESTS_PER_DOMAIN=8,
    )
    scope = manager.get_scope_manager(SCOPE)
    with caplog.at_level(logging.DEBUG, logger="scrapy_adaptive_throttle"):
        for step in range(20):
            scope.record_sent(step * 0.1)
            scope.record_response(0.05, 200, step * 0.1 + 0.05)
    changes = [
        record.getMessage()
        for record in caplog.records
        if record.getMessage().startswith("Adaptive limit of scope")
    ]
    assert changes[0] == (
        f"Adaptive limit of scope {SCOPE}: 2 -> 3 (latency 50 ms, baseline 50 ms)"
    )
    # Rate-limited: a burst of 5, however many changes there were.
    assert len(changes) == 5
    assert scope.concurrency > 6
