"""LatencyScopeManager at the scope-manager level, with a fake clock.

The throttling manager is built from a crawler (``get_crawler``) with its clock
replaced by a hand-advanced one; the simulated host of
``tests/latency_host_model.py`` answers on the same fake clock. What the pure
algorithm tests (``tests/algorithms/test_latency_limit.py``) cannot show is
shown here: the ceiling and settings come from Scrapy settings, backoff
(Retry-After holds) comes from the default scope manager, the adaptive limit
is what the manager's gate enforces, raised limits wake waiting requests,
robots.txt Crawl-delay and delays stay in force, and the diagnostics.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy import Request
from scrapy.http import Response
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_adaptive_throttle import (
    LatencyScopeManager,
    ThrottlingManager,
    ThrottlingScopeManager,
)
from scrapy_adaptive_throttle._diagnostics import ThrottlingDiagnostics, format_state
from scrapy_adaptive_throttle._settings import ThrottlingSettings
from tests.fake_clock import FakeClock
from tests.latency_host_model import CrawlResult, SimulatedHost, mean, simulate

LATENCY_MANAGER = "scrapy_adaptive_throttle.LatencyScopeManager"
SCOPE = "example.com"


def make_manager(**settings: Any) -> tuple[ThrottlingManager, FakeClock]:
    base = {
        "BACKOFF_JITTER": 0,
        "DOWNLOAD_DELAY_JITTER": 0,
        "DOWNLOAD_DELAY": 0,
        "THROTTLING_SCOPE_MANAGER": LATENCY_MANAGER,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 64,
    }
    crawler = get_crawler(settings_dict={**base, **settings})
    manager = ThrottlingManager(crawler)
    crawler.throttler = manager  # type: ignore[attr-defined]
    clock = FakeClock()
    manager.clock = clock
    return manager, clock


def scope_manager(manager: ThrottlingManager, scope: str = SCOPE) -> Any:
    scope_manager = manager.get_scope_manager(scope)
    assert isinstance(scope_manager, LatencyScopeManager)
    return scope_manager


class ScopeClient:
    """Drive one scope the way the manager and the middleware do: backoff
    first (Retry-After: 1 on a 503), then the latency sample."""

    def __init__(self, manager: ThrottlingManager, scope: str) -> None:
        self.manager = manager
        self.scope = scope
        self.scope_manager = scope_manager(manager, scope)

    def limit(self) -> int:
        return int(self.scope_manager.concurrency)

    def wait(self, now: float) -> float:
        return float(self.scope_manager.can_send(now))

    def sent(self, now: float) -> None:
        self.scope_manager.record_sent(now)

    def answered(self, now: float, latency: float, overloaded: bool) -> None:
        status = 503 if overloaded else 200
        if overloaded:
            self.manager.apply_backoff({self.scope: {"delay": 1.0}}, now=now)
        self.scope_manager.record_response(latency, status, now)

    def freed(self, now: float) -> None:
        self.scope_manager.record_done(now)


def crawl(
    manager: ThrottlingManager,
    scope: str,
    host: SimulatedHost,
    duration: float,
    turnaround: float = 0.004,
) -> CrawlResult:
    client = ScopeClient(manager, scope)
    return simulate(
        client,
        host,
        duration,
        turnaround=turnaround,
        limit_of=lambda: client.scope_manager.latency_limit.limit,
    )


# -- configuration ---------------------------------------------------------------------


def test_the_addon_makes_it_the_default_scope_manager() -> None:
    crawler = get_crawler(
        settings_dict={"ADDONS": {"scrapy_adaptive_throttle.Addon": 500}}
    )
    assert ThrottlingSettings.from_crawler(crawler).scope_manager_cls is (
        LatencyScopeManager
    )


def test_the_plain_scope_manager_stays_one_setting_away() -> None:
    crawler = get_crawler(
        settings_dict={
            "ADDONS": {"scrapy_adaptive_throttle.Addon": 500},
            "THROTTLING_SCOPE_MANAGER": (
                "scrapy_adaptive_throttle.ThrottlingScopeManager"
            ),
        }
    )
    assert ThrottlingSettings.from_crawler(crawler).scope_manager_cls is (
        ThrottlingScopeManager
    )


@pytest.mark.parametrize(
    ("settings", "scope", "ceiling"),
    [
        ({"CONCURRENT_REQUESTS_PER_DOMAIN": 12}, "example.com", 12),
        ({"CONCURRENT_REQUESTS_PER_DOMAIN": 12}, "127.0.0.1:8080", 12),
        (
            {"CONCURRENT_REQUESTS_PER_DOMAIN": 12, "CONCURRENT_REQUESTS_PER_IP": 5},
            "127.0.0.1:8080",
            5,
        ),
        ({"THROTTLING_SCOPES": {"example.com": {"concurrency": 6}}}, "example.com", 6),
        ({"THROTTLING_SCOPE_CONCURRENCY": 3}, "api", 3),
        ({"THROTTLING_SCOPE_CONCURRENCY": 0, "CONCURRENT_REQUESTS": 20}, "api", 20),
    ],
)
def test_the_ceiling_is_the_scope_concurrency(
    settings: dict[str, Any], scope: str, ceiling: int
) -> None:
    manager, _ = make_manager(**settings)
    limit = scope_manager(manager, scope)
    assert limit.ceiling == ceiling
    assert limit.latency_limit.maximum == ceiling
    assert limit.concurrency == min(2, ceiling)


def test_initial_limit_floor_and_tolerance_are_settings() -> None:
    manager, _ = make_manager(
        THROTTLING_LATENCY_INITIAL_CONCURRENCY=4,
        THROTTLING_LATENCY_TOLERANCE=2.0,
        THROTTLING_LATENCY_WINDOW=5.0,
        THROTTLING_SCOPES={
            "slow.example": {
                "min_concurrency": 2,
                "initial_concurrency": 3,
                "latency_tolerance": 1.2,
                "latency_window": 60,
            }
        },
    )
    default = scope_manager(manager, "example.com").latency_limit
    assert (default.limit, default.tolerance, default.window) == (4.0, 2.0, 5.0)
    configured = scope_manager(manager, "slow.example").latency_limit
    assert (configured.limit, configured.tolerance, configured.window) == (
        3.0,
        1.2,
        60.0,
    )
    assert configured.minimum == 2


def test_nothing_to_adapt_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    manager, _ = make_manager(CONCURRENT_REQUESTS_PER_DOMAIN=1)
    with caplog.at_level(logging.WARNING):
        for scope in ("a.example", "b.example", "c.example"):
            assert scope_manager(manager, scope).concurrency == 1
    warnings = [r for r in caplog.records if "nothing to adapt" in r.getMessage()]
    assert len(warnings) == 1
    assert "Raise CONCURRENT_REQUESTS_PER_DOMAIN" in warnings[0].getMessage()


def test_nothing_to_adapt_names_the_scope_setting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    manager, _ = make_manager(THROTTLING_SCOPES={"api.example": {"concurrency": 1}})
    with caplog.at_level(logging.WARNING):
        scope_manager(manager, "api.example")
        scope_manager(manager, "other.example")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1
    assert "THROTTLING_SCOPES['api.example']['concurrency']" in messages[0]


# -- adapting on a simulated host ------------------------------------------------------


def test_two_hosts_settle_near_their_capacity_at_different_limits() -> None:
    manager, _ = make_manager()
    large = SimulatedHost(workers=8, service=0.02)
    small = SimulatedHost(workers=2, service=0.05, rng=random.Random(2))
    large_result = crawl(manager, "a.example", large, 10.0)
    small_result = crawl(manager, "b.example", small, 20.0)
    assert large_result.overloads == small_result.overloads == []
    large_limit = mean(large_result.limits(3.0))
    small_limit = mean(small_result.limits(5.0))
    # Capacity x service time (8 and 2), plus what covers the turnaround.
    assert 8 <= large_limit <= 16
    assert 2 <= small_limit <= 5
    assert large_result.rate(3.0, 10.0) >= 0.95 * large.capacity
    assert small_result.rate(5.0, 20.0) >= 0.9 * small.capacity
    assert large_result.median_latency(3.0) <= 1.5 * 0.02
    assert small_result.median_latency(5.0) <= 1.5 * 0.05


def test_overload_halves_the_limit_and_pauses_for_retry_after() -> None:
    manager, _ = make_manager(THROTTLING_LATENCY_INITIAL_CONCURRENCY=32)
    host = SimulatedHost(workers=2, service=0.05, queue=4)
    result = crawl(manager, SCOPE, host, 6.0)
    first = result.overloads[0]
    limit_after = [limit for time, limit in result.trace if time == first]
    assert limit_after[0] <= 16
    # Retry-After: 1 — nothing sent for a second after the first 503.
    assert not [sent for sent in result.sends if first < sent < first + 0.99]
    assert max(result.limits(4.0)) <= 6
    assert scope_manager(manager).latency_limit.overload_count == len(result.overloads)


@deferred_f_from_coro_f
async def test_a_retry_refused_again_does_not_halve_the_limit() -> None:
    """A 429 halves the limit, but the 429 of a retry of a request refused
    before (a page the server always refuses) only holds the scope: it says
    nothing new of the host's load."""
    manager, clock = make_manager(THROTTLING_LATENCY_INITIAL_CONCURRENCY=16)
    url = f"https://{SCOPE}/always-refused"
    headers = {"Retry-After": "1"}
    first = Response(url, status=429, headers=headers, request=Request(url))
    await manager.process_response(first)
    limit = scope_manager(manager).latency_limit
    assert (limit.limit, limit.overload_count) == (8, 1)
    clock.now = 1.5
    retry = first.request.copy()  # as RetryMiddleware retries it
    await manager.process_response(
        Response(url, status=429, headers=headers, request=retry)
    )
    assert (limit.limit, limit.overload_count) == (8, 1)
    assert scope_manager(manager).can_send(2.0) > 0  # held all the same
    clock.now = 3.0
    other = f"https://{SCOPE}/other"
    await manager.process_response(
        Response(other, status=429, headers=headers, request=Request(other))
    )
    assert (limit.limit, limit.overload_count) == (4, 2)


def test_permanent_slowdown_becomes_the_new_baseline() -> None:
    manager, _ = make_manager(THROTTLING_LATENCY_WINDOW=2.0)
    host = SimulatedHost(
        workers=8,
        service=0.02,
        service_at=lambda now: 0.02 if now < 3.0 else 0.08,
    )
    result = crawl(manager, SCOPE, host, 12.0)
    state = manager.get_scope_state(SCOPE)
    assert state["best_latency"] >= 0.08 * 0.9
    # Within a few windows, the limit is back where the slower host's
    # capacity needs it, and the crawl runs at that capacity.
    assert mean(result.limits(3.0 + 2 * 2.0)) >= 8
    assert result.rate(3.0 + 2 * 2.0, 12.0) >= 0.9 * 8 / 0.08
    assert result.overloads == []


def test_constant_latency_reaches_the_ceiling_only_if_used() -> None:
    manager, clock = make_manager(CONCURRENT_REQUESTS_PER_DOMAIN=10)
    busy = scope_manager(manager, "busy.example")
    idle = scope_manager(manager, "idle.example")
    for step in range(400):
        clock.now = now = step * 0.01
        # The busy scope always has its whole limit in flight, the idle one
        # a single request; both hosts always answer in 20 ms.
        if busy.active:
            busy.record_response(0.02, 200, now)
        for _ in range(busy.concurrency - busy.active):
            busy.record_sent(now - 0.02)
        idle.record_sent(now - 0.02)
        idle.record_response(0.02, 200, now)
        idle.record_done(now)
    assert busy.concurrency == 10
    assert manager.get_scope_state("busy.example")["at_ceiling_share"] > 0.5
    # One request in flight tests a limit of 1 or 2, "near" a limit of 2 or
    # 3: the idle scope's limit never goes further.
    assert idle.concurrency <= 3
    assert manager.get_scope_state("idle.example")["at_ceiling_share"] == 0.0


# -- the response feed -----------------------------------------------------------------


def response(status: int = 200, headers: dict[str, Any] | None = None) -> Response:
    url = f"https://{SCOPE}/page"
    return Response(url, status=status, headers=headers, request=Request(url))


async def answer(
    manager: ThrottlingManager,
    clock: FakeClock,
    status: int,
    latency: float | None,
    headers: dict[str, Any] | None = None,
) -> None:
    result = response(status, headers)
    request = result.request
    assert request is not None
    manager.reserve(request)
    if latency is not None:
        request.meta["download_latency"] = latency
    await manager.process_response(result)
    manager.release(request)
    clock.now += 0.001


@deferred_f_from_coro_f
async def test_a_503_halves_at_once_and_holds_for_retry_after() -> None:
    manager, clock = make_manager(THROTTLING_LATENCY_INITIAL_CONCURRENCY=16)
    await answer(manager, clock, 200, 0.05)
    await answer(manager, clock, 503, 0.001, {"Retry-After": "2"})
    limit = scope_manager(manager)
    assert limit.concurrency == 8
    now = clock.now
    assert limit.can_send(now) >= 2.0 - 0.01
    assert manager.get_scope_state(SCOPE)["backoff_count"] == 1
    # The fast 503 raised nothing and is not the best latency.
    assert limit.latency_limit.best == 0.05


@deferred_f_from_coro_f
async def test_fast_error_pages_and_missing_latencies_never_raise_it() -> None:
    manager, clock = make_manager()
    await answer(manager, clock, 200, 0.05)
    limit = scope_manager(manager)
    before = limit.latency_limit.limit
    for _ in range(20):
        await answer(manager, clock, 404, 0.001)
        await answer(manager, clock, 200, None)
    assert limit.latency_limit.limit == before
    assert limit.latency_limit.best == 0.05
    assert limit.latency_limit.last_latency == 0.001


def test_a_raised_limit_wakes_waiting_requests() -> None:
    manager, _ = make_manager()
    limit = scope_manager(manager)
    woken: list[str] = []
    manager.add_release_listener(woken.append)
    event = limit.slot_event()
    limit.record_sent(0.0)
    limit.record_sent(0.0)
    assert limit.concurrency_blocked()
    limit.record_response(0.3, 200, 0.3)  # a first answer, 2 -> 3 (slow start)
    assert limit.concurrency == 3
    assert woken == [SCOPE]
    assert event.called
    assert not limit.concurrency_blocked()
    limit.record_sent(0.3)
    # An answer in the upper half of the band: slow start ends, and the limit
    # grows by a fraction, which frees no slot and wakes nobody.
    limit.record_response(0.42, 200, 0.75)
    assert 3 < limit.latency_limit.limit < 4
    assert woken == [SCOPE]


def test_crawl_delay_caps_the_limit_and_spaces_requests() -> None:
    manager, _clock = make_manager(ROBOTSTXT_OBEY=True)
    limit = scope_manager(manager)
    limit.latency_limit.limit = 6.0
    limit.record_response(0.02, 200, 0.0)
    manager.apply_robots_crawl_delay(SCOPE, 2.0)
    assert limit.ceiling == 1
    assert limit.concurrency == 1
    limit.record_sent(1.0)
    assert limit.can_send(1.0) >= 2.0 - 1e-9
    # Fast answers do not lift it past the robots.txt ceiling.
    for step in range(10):
        limit.record_response(0.02, 200, 1.0 + step)
    assert limit.concurrency == 1


def test_download_delay_stays_a_floor_on_spacing() -> None:
    manager, _clock = make_manager(DOWNLOAD_DELAY=0.5)
    limit = scope_manager(manager)
    limit.record_sent(0.0)
    assert not limit.concurrency_blocked()
    assert limit.can_send(0.0) == pytest.approx(0.5)


@settings(max_examples=100, deadline=None)
@given(
    floor=st.integers(min_value=1, max_value=4),
    extra=st.integers(min_value=0, max_value=20),
    operations=st.lists(
        st.tuples(
            st.sampled_from(
                ["send", "done", "response", "error", "backoff", "set_concurrency"]
            ),
            st.floats(min_value=0.0001, max_value=2.0),
            st.integers(min_value=1, max_value=30),
        ),
        max_size=80,
    ),
)
def test_the_limit_never_leaves_floor_and_ceiling(
    floor: int, extra: int, operations: list[tuple[str, float, int]]
) -> None:
    manager, _clock = make_manager(
        THROTTLING_SCOPES={
            SCOPE: {"concurrency": floor + extra, "min_concurrency": floor}
        }
    )
    limit = scope_manager(manager)
    now = 0.0
    for operation, value, number in operations:
        now += value / 10
        if operation == "send":
            limit.record_sent(now)
        elif operation == "done":
            limit.record_done(now)
        elif operation == "response":
            limit.record_response(value, 200, now)
        elif operation == "error":
            limit.record_response(value, 500, now)
        elif operation == "backoff":
            limit.record_backoff(None, now)
        else:
            limit.set_concurrency(number)
        assert floor <= limit.concurrency <= limit.ceiling
        assert limit.ceiling >= floor
        assert limit.concurrency_blocked() == (limit.active >= limit.concurrency)


# -- diagnostics -----------------------------------------------------------------------


def test_state_names_limit_bounds_latencies_and_backoff() -> None:
    manager, _clock = make_manager(CONCURRENT_REQUESTS_PER_DOMAIN=8)
    limit = scope_manager(manager)
    limit.record_sent(0.0)
    limit.record_response(0.03, 200, 0.03)
    state = manager.get_scope_state(SCOPE)
    assert state["manager"] == "LatencyScopeManager"
    assert state["limit"] == 3  # slow start: 2 + 1
    assert state["in_flight"] == 1
    assert (state["floor"], state["ceiling"]) == (1, 8)
    assert state["best_latency"] == state["last_latency"] == 0.03
    assert state["backoff_level"] == 0
    assert [s["scope"] for s in manager.iter_scope_states()] == [SCOPE]
    text = format_state(state)
    assert "limit 3" in text
    assert "best 30 ms" in text


def test_pinned_scopes_are_named_in_stats_at_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    manager, _clock = make_manager(CONCURRENT_REQUESTS_PER_DOMAIN=4)
    diagnostics = ThrottlingDiagnostics(manager.crawler)
    pinned_low = scope_manager(manager, "slow.example")
    pinned_high = scope_manager(manager, "fast.example")
    scope_manager(manager, "unused.example")
    pinned_high.latency_limit.limit = 4.0
    pinned_high._set_current(4)
    for step in range(30):
        now = 1.0 + step
        pinned_low.record_response(0.1 + step, 200, now)
        pinned_high.record_response(0.02, 200, now)
    with caplog.at_level(logging.INFO):
        diagnostics.spider_closed()
    stats = manager.crawler.stats
    assert stats is not None
    assert stats.get_value("throttling/latency/scope_count") == 3
    assert stats.get_value("throttling/latency/pinned_floor_count") == 1
    assert stats.get_value("throttling/latency/pinned_floor_scopes") == ["slow.example"]
    assert stats.get_value("throttling/latency/pinned_ceiling_scopes") == [
        "fast.example"
    ]
    assert "slow.example" in caplog.text


def test_scope_states_are_logged_with_throttling_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    manager, _clock = make_manager(THROTTLING_DEBUG=True)
    diagnostics = ThrottlingDiagnostics(manager.crawler)
    limit = scope_manager(manager)
    limit.record_sent(0.0)
    limit.record_response(0.05, 200, 0.05)
    with caplog.at_level(logging.INFO):
        diagnostics.log_states()
    assert f"{SCOPE}: limit 3" in caplog.text
    assert "best 50 ms" in caplog.text
