"""A scope as one object: the strategies the scope managers compose, built
from a crawler and driven with an explicit ``now`` (no engine, no network)."""

from __future__ import annotations

from typing import Any

import pytest
from scrapy.utils.test import get_crawler

from scrapy_adaptive_throttle import LatencyScopeManager, ThrottlingScopeManager
from scrapy_adaptive_throttle._algorithms.concurrency import (
    AdaptiveLimit,
    FixedLimit,
    RampupLimit,
)
from scrapy_adaptive_throttle._crawler_throttler import get_throttler
from scrapy_adaptive_throttle._scope_state import (
    LocalScopeStore,
    ScopeParts,
    ScopeState,
)

SCOPE = "api.example.com"


def make_manager(
    manager: type, scope_config: dict[str, Any] | None = None, **settings: Any
) -> Any:
    crawler = get_crawler(
        settings_dict={
            "DOWNLOAD_DELAY_JITTER": 0,
            "BACKOFF_JITTER": 0,
            "THROTTLING_SCOPE_MANAGER": manager,
            "THROTTLING_SCOPES": {SCOPE: scope_config or {}},
            "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
            **settings,
        }
    )
    return get_throttler(crawler).get_scope_manager(SCOPE)


@pytest.mark.parametrize(
    ("manager", "config", "outer", "inner"),
    [
        (ThrottlingScopeManager, {}, FixedLimit, FixedLimit),
        (LatencyScopeManager, {}, AdaptiveLimit, AdaptiveLimit),
        (ThrottlingScopeManager, {"rampup": True}, RampupLimit, FixedLimit),
        (LatencyScopeManager, {"rampup": True}, RampupLimit, AdaptiveLimit),
    ],
)
def test_each_manager_composes_its_strategy(
    manager: type, config: dict[str, Any], outer: type, inner: type
) -> None:
    scope = make_manager(manager, config).scope
    assert type(scope.limit) is outer
    assert type(scope.strategy) is inner


def test_the_state_is_typed_and_get_state_is_its_dictionary() -> None:
    manager = make_manager(LatencyScopeManager, {"quota": 10})
    manager.record_sent(1.0, 2.0)
    state = manager.scope_state(1.5)
    assert isinstance(state, ScopeState)
    assert state.in_flight == 1
    assert state.quota_consumed == 2.0
    assert state.adaptive is not None
    assert state.adaptive.ceiling == 8
    assert manager.get_state(1.5) == state.as_dict()
    assert manager.get_state(1.5)["ceiling"] == 8


def samples(manager: Any) -> int:
    return int(manager.get_state(0.0)["latency_samples"])


def test_the_answer_that_triggered_a_backoff_is_no_latency_sample() -> None:
    manager = make_manager(LatencyScopeManager)
    manager.record_sent(1.0)
    manager.record_backoff(now=2.0)
    # Recorded a moment later than the trigger: still the same answer.
    manager.record_response(0.05, 200, 2.001)
    assert samples(manager) == 0
    manager.record_done(2.001)
    manager.record_sent(3.0)
    manager.record_response(0.05, 200, 3.05)
    assert samples(manager) == 1


def test_a_backoff_without_an_answer_skips_no_later_sample() -> None:
    manager = make_manager(LatencyScopeManager)
    manager.record_sent(1.0)
    manager.record_sent(1.0)
    manager.record_backoff(now=2.0)  # a download exception: no response
    manager.record_done(2.0)  # its request is released
    manager.record_response(0.05, 200, 2.0)  # the other request's answer
    assert samples(manager) == 1


def test_latency_adaptation_within_rampup_follows_rampups_ceiling() -> None:
    manager = make_manager(LatencyScopeManager, {"rampup": True})
    scope = manager.scope
    assert manager.ceiling == scope.rampup.state.concurrency
    manager.set_concurrency(5)
    # Set from outside: rampup starts from there, and the adaptive limit
    # stays under it.
    assert scope.rampup.state.concurrency == 5
    assert manager.ceiling == 5
    assert 1 <= manager.concurrency <= 5


class SharedCountersStore(LocalScopeStore):
    """A stand-in for a shared backend: every scope manager of a scope id
    gets the same counters and delay gate (as two processes sharing Redis
    would), the rest stays local."""

    def __init__(self) -> None:
        super().__init__()
        self.shared: dict[str, ScopeParts] = {}

    def parts(self, scope_id: str, config: Any) -> ScopeParts:
        local = super().parts(scope_id, config)
        first = self.shared.setdefault(scope_id, local)
        return ScopeParts(
            counters=first.counters,
            gate=first.gate,
            backoff=local.backoff,
            quota=local.quota,
        )


def test_a_store_replaces_where_the_state_is_kept() -> None:
    store = SharedCountersStore()

    class SharedScopeManager(ThrottlingScopeManager):
        state_store = store

    config = {"concurrency": 2, "delay": 1.0}
    one = make_manager(SharedScopeManager, config)
    other = make_manager(SharedScopeManager, config)
    assert one.scope is not other.scope
    one.record_sent(10.0)
    # The other manager sees the send: its gate is closed, one slot is taken.
    assert other.can_send(10.5) == pytest.approx(0.5)
    other.record_sent(11.0)
    assert one.concurrency_blocked()
    assert other.concurrency_blocked()
    one.record_done(11.5)
    assert not other.concurrency_blocked()
