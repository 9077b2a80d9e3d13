"""The scope manager and the manager with a fake clock (no network, no engine)."""

from __future__ import annotations

from typing import Any

import pytest
from scrapy import Request
from scrapy.utils.test import get_crawler

from scrapy_adaptive_throttle import (
    ThrottlingManager,
    ThrottlingScopeManager,
    add_scope,
    iter_scopes,
    update_scope_backoff,
)
from tests.fake_clock import FakeClock


def scope_manager(
    scope: str = "example.com", **settings: Any
) -> ThrottlingScopeManager:
    crawler = get_crawler(settings_dict={"DOWNLOAD_DELAY_JITTER": 0, **settings})
    return ThrottlingScopeManager(
        crawler, {"id": scope, **settings.get("THROTTLING_SCOPES", {}).get(scope, {})}
    )


def manager(**settings: Any) -> tuple[ThrottlingManager, FakeClock]:
    crawler = get_crawler(settings_dict={"DOWNLOAD_DELAY_JITTER": 0, **settings})
    throttler = ThrottlingManager(crawler)
    clock = FakeClock(1000.0)
    throttler.clock = clock
    return throttler, clock


# -- scope manager ---------------------------------------------------------------


def test_delay_is_counted_from_each_send() -> None:
    scope = scope_manager(DOWNLOAD_DELAY=2.0)
    assert scope.can_send(now=0.0) == 0.0
    scope.record_sent(now=0.0)
    assert scope.can_send(now=0.5) == pytest.approx(1.5)
    scope.record_done(now=0.9)
    # Finishing early does not shorten the delay.
    assert scope.can_send(now=1.0) == pytest.approx(1.0)
    assert scope.can_send(now=2.0) == 0.0


def test_a_cache_hit_gives_its_send_back() -> None:
    scope = scope_manager(DOWNLOAD_DELAY=2.0)
    scope.record_sent(now=0.0)
    scope.record_sent(now=2.0)
    assert scope.can_send(now=2.1) == pytest.approx(1.9)
    # Only the last send can be given back: the one before it already let
    # the last one wait.
    assert not scope.refund_send(0.0, now=2.1)
    assert scope.refund_send(2.0, now=2.1)
    # The next send is spaced from the send before the cache hit.
    assert scope.can_send(now=2.1) == 0.0
    # Once only.
    assert not scope.refund_send(2.0, now=2.2)


def test_a_cache_hit_never_gives_back_a_backoff_hold() -> None:
    scope = scope_manager(DOWNLOAD_DELAY=2.0)
    scope.record_sent(now=0.0)
    scope.record_backoff(5.0, now=0.1)
    assert not scope.refund_send(0.0, now=0.2)
    assert scope.can_send(now=0.2) == pytest.approx(4.9)


def test_a_cache_hit_gives_its_quota_back() -> None:
    scope = scope_manager(
        THROTTLING_WINDOW=10.0,
        THROTTLING_SCOPES={"example.com": {"quota": 3.0}},
    )
    scope.record_sent(now=0.0, amount=2.0)
    assert scope.can_send(now=0.1, amount=2.0) == pytest.approx(9.9)
    scope.refund_send(0.0, now=0.1, amount=2.0)
    assert scope.can_send(now=0.1, amount=2.0) == 0.0


def test_jitter_range_bounds_the_spacing() -> None:
    crawler = get_crawler(settings_dict={"DOWNLOAD_DELAY": 1.0})
    scope = ThrottlingScopeManager(crawler, {"id": "a.example", "jitter": [-0.25, 0.5]})
    waits = []
    for _ in range(200):
        scope.record_sent(now=0.0)
        waits.append(scope.can_send(now=0.0))
        scope.record_done(now=0.0)
    assert 0.75 <= min(waits) < 0.85
    assert 1.4 < max(waits) <= 1.5


def test_concurrency_and_min_concurrency() -> None:
    crawler = get_crawler(settings_dict={"CONCURRENT_REQUESTS_PER_DOMAIN": 2})
    scope = ThrottlingScopeManager(crawler, {"id": "a.example", "min_concurrency": 2})
    scope.record_sent(now=0.0)
    assert not scope.concurrency_blocked()
    scope.record_sent(now=0.0)
    assert scope.concurrency_blocked()
    assert scope.get_load() == 1.0
    scope.set_concurrency(1)
    assert scope.concurrency == 2  # never below min_concurrency
    scope.record_done()
    assert not scope.concurrency_blocked()


def test_one_waiter_is_woken_per_freed_slot() -> None:
    crawler = get_crawler(settings_dict={"CONCURRENT_REQUESTS_PER_DOMAIN": 1})
    scope = ThrottlingScopeManager(crawler, {"id": "a.example"})
    scope.record_sent(now=0.0)
    events = [scope.slot_event() for _ in range(5)]
    scope.record_done()
    assert [event.called for event in events] == [True, False, False, False, False]
    scope.discard_slot_event(events[1])
    scope.record_sent(now=0.0)
    scope.record_done()
    assert [event.called for event in events] == [True, False, True, False, False]
    # Raising the limit by two wakes two more.
    scope.record_sent(now=0.0)
    scope.set_concurrency(3)
    assert [event.called for event in events] == [True, False, True, True, True]


def test_idleness() -> None:
    scope = scope_manager()
    assert scope.is_idle(now=0.0, max_idle=10)
    scope.record_sent(now=0.0)
    assert not scope.is_idle(now=100.0, max_idle=10)
    scope.record_done()
    assert not scope.is_idle(now=5.0, max_idle=10)
    assert scope.is_idle(now=10.5, max_idle=10)
    scope.record_backoff(delay=60.0, now=20.0)
    assert not scope.is_idle(now=50.0, max_idle=10)


def test_a_backed_off_scope_nobody_uses_recovers_and_becomes_idle() -> None:
    # Recovery used to run only when the scope sent again: a scope that
    # backed off once and was never used again was never evictable (a soak
    # crawl of short-lived site scopes kept half of them for ever).
    scope = scope_manager(BACKOFF_WINDOW=60.0, BACKOFF_JITTER=0)
    scope.record_sent(now=0.0)
    scope.record_done(now=0.5)
    scope.record_backoff(now=1.0)  # no server delay: the spacing grows
    scope.record_backoff(now=2.0)
    assert scope.get_state(now=3.0)["backoff_level"] == 2
    # Still backing off: not evictable, however long unused.
    assert not scope.is_idle(now=61.0, max_idle=10)
    # Two quiet windows later it has recovered, and it is idle.
    assert scope.is_idle(now=123.0, max_idle=10)
    assert scope.get_state(now=123.0)["backoff_level"] == 0


def test_idle_eviction_of_scopes_that_backed_off() -> None:
    throttler, clock = manager(
        THROTTLING_SCOPE_MAX_IDLE=10, BACKOFF_WINDOW=30.0, BACKOFF_JITTER=0
    )
    for index in range(50):
        request = Request(f"https://site{index}.example/")
        throttler.reserve(request)
        throttler.release(request)
        throttler.delay_scope(f"site{index}.example", 2.0)
        clock.now += 1
    # Every site is done; other requests keep the crawl (and eviction) going.
    for _ in range(20):
        clock.now += 5
        request = Request("https://busy.example/")
        throttler.reserve(request)
        throttler.release(request)
    assert list(throttler._scope_managers) == ["busy.example"]


# -- manager ---------------------------------------------------------------------


def test_default_scope_is_the_netloc_without_userinfo() -> None:
    throttler, _ = manager()
    request = Request("http://user:pw@Example.COM:8080/x")
    assert throttler.get_request_scopes(request) == "example.com:8080"
    assert throttler.get_slot_key(Request("https://example.com/")) == "example.com"


def test_throttling_scopes_meta_wins_and_slot_key_is_sorted() -> None:
    throttler, _ = manager()
    request = Request("https://example.com/", meta={"throttling_scopes": {"b", "a"}})
    assert set(iter_scopes(throttler.get_request_scopes(request))) == {"a", "b"}
    assert throttler.get_slot_key(request) == "a+b"


def test_a_download_slot_set_by_another_component_is_an_added_scope() -> None:
    throttler, _ = manager()
    request = Request("https://example.com/", meta={"download_slot": "legacy"})
    assert throttler.get_request_scopes(request) == ["example.com", "legacy"]
    # A value the downloader stamped itself is not another component's slot.
    stamped = Request(
        "https://other.example/",
        meta={"download_slot": "example.com", "_throttling_slot_stamp": "example.com"},
    )
    assert throttler.get_request_scopes(stamped) == "other.example"


def test_check_and_reserve_with_several_scopes() -> None:
    throttler, clock = manager(
        THROTTLING_SCOPES={"a": {"concurrency": 1}, "b": {"delay": 5.0}}
    )
    values = [("a", None), ("b", None)]
    assert throttler.check_scopes(values, clock.now) == (0.0, None)
    request = Request("https://example.com/")
    throttler.reserve_scopes(request, values, clock.now)
    wait, blocked = throttler.check_scopes(values, clock.now)
    assert wait == pytest.approx(5.0)
    assert blocked == "a"
    throttler.release(request)
    throttler.release(request)  # idempotent
    clock.now += 5
    assert throttler.check_scopes(values, clock.now) == (0.0, None)


def test_release_notifies_listeners_per_scope() -> None:
    throttler, _ = manager()
    seen: list[str] = []
    throttler.add_release_listener(seen.append)
    request = Request("https://example.com/", meta={"throttling_scopes": ["a", "b"]})
    throttler.reserve(request)
    throttler.release(request)
    assert seen == ["a", "b"]


def test_delay_scope_and_scope_delay() -> None:
    throttler, clock = manager(BACKOFF_MAX_DELAY=10.0)
    throttler.delay_scope("a.example", 60.0)
    # Trusted: not capped at BACKOFF_MAX_DELAY.
    wait, _ = throttler.check_scopes([("a.example", None)], clock.now)
    assert wait == pytest.approx(60.0)
    throttler.set_scope_delay("b.example", 3.0)
    assert throttler.get_scope_delay("b.example") == 3.0
    throttler.set_scope_delay("b.example", 1.0)
    assert throttler.get_scope_delay("b.example") == 1.0


def test_lru_eviction_keeps_busy_scopes() -> None:
    throttler, _ = manager(THROTTLING_SCOPE_LIMIT=3)
    busy = Request("https://busy.example/")
    throttler.reserve(busy)
    for index in range(10):
        throttler.get_scope_manager(f"s{index}.example")
    live = list(throttler._scope_managers)
    assert len(live) == 3
    assert "busy.example" in live
    throttler.release(busy)


def test_idle_eviction() -> None:
    throttler, clock = manager(THROTTLING_SCOPE_MAX_IDLE=100)
    throttler.set_scope_delay("configured.example", 2.0)
    first = Request("https://old.example/")
    throttler.reserve(first)
    throttler.release(first)
    # A scope configured before its first request survives the first passes.
    clock.now += 60
    throttler.reserve(Request("https://other.example/"))
    assert throttler.get_scope_delay("configured.example") == 2.0
    clock.now += 90
    request = Request("https://new.example/")
    throttler.reserve(request)
    assert "old.example" not in throttler._scope_managers
    assert "new.example" in throttler._scope_managers


def test_throttling_delay_deadline() -> None:
    throttler, _ = manager()
    request = Request("https://example.com/", meta={"throttling_delay": 30})
    first = throttler.get_request_delay(request)
    assert 29 < first <= 30
    assert throttler.get_request_delay(request) <= first
    request.meta["_throttling_delayed"] = True
    assert throttler.get_request_delay(request) == 0.0


def test_scope_helpers_follow_the_reference_semantics() -> None:
    assert add_scope(None, "a") == "a"
    assert add_scope("a", "a") == "a"
    assert add_scope("a", "b") == {"a", "b"}
    assert add_scope({"a": 1.0}, "b") == {"a": 1.0, "b": None}
    assert add_scope({"a": None}, "b", 3.0) == {"a": None, "b": 3.0}
    with pytest.raises(TypeError):
        add_scope({"a": 1.0}, "a", 2.0)
    assert update_scope_backoff(None, "a") == "a"
    assert update_scope_backoff("a", "b", delay=2.0) == {"a": {}, "b": {"delay": 2.0}}
    assert update_scope_backoff({"c": {}}, "c", consumed=-1.5) == {
        "c": {"consumed": -1.5}
    }


class MinimalScopeManager:
    """Only the three methods a scope manager must have."""

    def __init__(self, crawler: Any, config: dict[str, Any]) -> None:
        self.active = 0

    def can_send(self, now: float | None = None, amount: float | None = None) -> float:
        return 0.0

    def record_sent(
        self, now: float | None = None, amount: float | None = None
    ) -> None:
        self.active += 1

    def record_done(self, now: float | None = None) -> None:
        self.active -= 1


def test_a_scope_manager_with_only_the_required_methods() -> None:
    throttler, clock = manager(
        THROTTLING_SCOPES={"minimal": {"manager": MinimalScopeManager}}
    )
    request = Request("https://example.com/", meta={"throttling_scopes": "minimal"})
    assert throttler.check_scopes([("minimal", None)], clock.now) == (0.0, None)
    throttler.reserve(request)
    throttler.apply_backoff("minimal")
    throttler.apply_backoff({"minimal": {"delay": 5.0, "consumed": 1.0}})
    throttler.delay_scope("minimal", 10.0)
    with pytest.raises(TypeError, match=r"'minimal'.*no set_base_delay"):
        throttler.set_scope_delay("minimal", 1.0)
    assert throttler.get_scope_delay("minimal") == 0.0
    assert throttler.get_scope_state("minimal")["scope"] == "minimal"
    throttler.release(request)
    assert throttler.get_scope_manager("minimal").active == 0


def test_the_scope_adapters_are_a_live_read_only_view() -> None:
    throttler, _ = manager()
    throttler.get_scope_state("a.example")
    throttler.get_scope_state("b.example")
    scopes = throttler.scope_adapters()
    assert list(scopes) == ["a.example", "b.example"]
    # Looking creates no scope and refreshes none (the eviction order).
    assert scopes.get("c.example") is None
    assert scopes["a.example"].manager is throttler._scope_managers["a.example"]
    assert list(throttler._scope_managers) == ["a.example", "b.example"]
    with pytest.raises(TypeError):
        scopes["c.example"] = scopes["a.example"]  # type: ignore[index]
    # Live: a scope used later moves to the end, a new one appears.
    throttler.get_scope_state("a.example")
    throttler.get_scope_state("c.example")
    assert list(scopes) == ["b.example", "a.example", "c.example"]
