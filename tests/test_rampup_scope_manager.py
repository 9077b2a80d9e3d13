"""Rampup inside the scope managers, built from a crawler and driven with an
explicit ``now`` (no engine, no network)."""

from __future__ import annotations

from typing import Any

import pytest
from scrapy.utils.test import get_crawler

from scrapy_adaptive_throttle import LatencyScopeManager, ThrottlingScopeManager
from scrapy_adaptive_throttle._crawler_throttler import get_throttler

SCOPE = "api.example.com"


def make_manager(
    scope_config: dict[str, Any] | None = None,
    manager: type = ThrottlingScopeManager,
    **settings: Any,
) -> Any:
    crawler = get_crawler(
        settings_dict={
            "DOWNLOAD_DELAY_JITTER": 0,
            "BACKOFF_JITTER": 0,
            "BACKOFF_WINDOW": 10.0,
            "THROTTLING_SCOPE_MANAGER": manager,
            "THROTTLING_SCOPES": {SCOPE: {"rampup": True, **(scope_config or {})}},
            **settings,
        }
    )
    return get_throttler(crawler).get_scope_manager(SCOPE)


def busy_window(manager: Any, start: float, *, latency: float = 0.05) -> float:
    """Ten rounds of as many requests as the limit allows, with one more
    held back by the concurrency limit each time; returns the end of the
    10-second window."""
    for index in range(10):
        at = start + index
        limit = manager._concurrency  # the limit rampup controls
        for _ in range(limit):
            manager.can_send(at)
            manager.record_sent(at)
        manager.can_send(at)  # the next request is held by the limit
        for _ in range(limit):
            manager.record_done(at + latency)
    return start + 10.0


def test_starts_at_the_floor_and_the_configured_delay() -> None:
    manager = make_manager({"delay": 0.5, "min_concurrency": 2})
    assert manager.concurrency == 2
    assert manager.get_base_delay() == 0.5
    state = manager.get_state(0.0)
    assert state["rampup_faster_count"] == 0


@pytest.mark.parametrize(
    ("scope_config", "settings", "ceiling"),
    [
        ({"concurrency": 3}, {}, 3),
        ({}, {"CONCURRENT_REQUESTS": 5}, 5),
    ],
)
def test_concurrency_ceiling(
    scope_config: dict[str, Any], settings: dict[str, Any], ceiling: int
) -> None:
    manager = make_manager(scope_config, **settings)
    start = 0.0
    manager.can_send(start)
    for _ in range(8):
        start = busy_window(manager, start)
    manager.can_send(start)
    assert manager.concurrency == ceiling


def test_triggers_within_the_target_do_not_grow_the_delay() -> None:
    manager = make_manager({"delay": 0.2})
    manager.can_send(0.0)
    manager.record_backoff(now=1.0)
    state = manager.get_state(1.0)
    assert state["base_delay"] == 0.2
    assert state["delay"] == 0.2  # an exponential step would make it 1 s
    assert state["backoff_count"] == 1
    assert state["rampup_window_triggers"] == 1


def test_trigger_above_the_target_undoes_the_last_faster_step() -> None:
    manager = make_manager({"delay": 0.4})
    manager.can_send(0.0)
    for index in range(10):  # the delay holds requests back
        manager.record_sent(float(index))
        manager.can_send(float(index) + 0.1)
        manager.record_done(float(index) + 0.01)
    manager.can_send(10.0)
    assert manager.get_base_delay() == pytest.approx(0.2)
    manager.record_backoff(now=11.0)
    manager.record_backoff(now=12.0)
    assert manager.get_base_delay() == pytest.approx(0.4)
    assert manager.get_state(12.0)["delay"] == pytest.approx(0.4)


def test_retry_after_is_honoured_whatever_rampup_decides() -> None:
    manager = make_manager({"delay": 0.0})
    manager.can_send(0.0)
    manager.record_backoff(delay=2.0, now=1.0)
    assert manager.can_send(1.5) == pytest.approx(1.5)
    assert manager.can_send(3.0) == 0.0


def test_rampup_raises_the_concurrency_of_a_scope_without_delay() -> None:
    manager = make_manager({"delay": 0.0})
    start = 0.0
    manager.can_send(start)
    for _ in range(3):
        start = busy_window(manager, start)
    manager.can_send(start)
    assert manager.concurrency == 4
    state = manager.get_state(start)
    assert state["rampup_faster_count"] == 3
    assert state["rampup_latency"] == pytest.approx(0.05)


def test_values_set_from_outside_are_the_new_starting_point() -> None:
    manager = make_manager({"delay": 0.0})
    manager.can_send(0.0)
    manager.set_concurrency(3)
    manager.set_base_delay(1.5)  # e.g. a robots.txt Crawl-delay
    manager.can_send(1.0)
    assert (manager.concurrency, manager.get_base_delay()) == (3, 1.5)
    manager.record_backoff(now=2.0)
    manager.record_backoff(now=3.0)  # nothing to undo: one slot less
    assert manager.concurrency == 2


def test_latency_scope_manager_takes_rampup_as_its_ceiling() -> None:
    manager = make_manager({"delay": 0.0}, manager=LatencyScopeManager)
    assert manager.ceiling == 1
    start = 0.0
    manager.can_send(start)
    for _ in range(2):
        start = busy_window(manager, start)
    manager.can_send(start)
    assert manager.ceiling == 3
    assert manager.concurrency <= manager.ceiling


def test_scopes_without_rampup_are_untouched() -> None:
    crawler = get_crawler(settings_dict={"BACKOFF_JITTER": 0})
    manager = get_throttler(crawler).get_scope_manager("example.com")
    manager.record_backoff(now=0.0)
    state = manager.get_state(0.0)
    assert state["delay"] == 1.0  # one exponential step from 0
    assert "rampup_faster_count" not in state
