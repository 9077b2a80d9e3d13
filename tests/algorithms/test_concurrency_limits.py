"""The concurrency-limit strategies of a scope, fed numbers: fixed, adaptive,
and either one within rampup."""

from __future__ import annotations

import pytest

from scrapy_adaptive_throttle._algorithms import (
    BackoffPolicy,
    BackoffState,
    LatencyLimit,
    RampupPolicy,
    RampupState,
)
from scrapy_adaptive_throttle._algorithms.concurrency import (
    AdaptiveLimit,
    ConcurrencyLimit,
    FixedLimit,
    RampupLimit,
)
from scrapy_adaptive_throttle._algorithms.delay_gate import DelayGate


def adaptive(ceiling: int = 8, initial: int = 4, minimum: int = 1) -> AdaptiveLimit:
    algorithm = LatencyLimit(initial=initial, minimum=minimum, maximum=ceiling)
    return AdaptiveLimit(algorithm, ceiling=ceiling, no_ceiling=16)


def rampup(inner: ConcurrencyLimit, delay: float = 1.0) -> RampupLimit:
    policy = RampupPolicy(window=10.0, min_concurrency=1, max_concurrency=8)
    return RampupLimit(RampupState(policy, delay=delay), inner)


@pytest.mark.parametrize("ceiling", [None, 1, 5])
def test_a_fixed_limit_is_its_ceiling(ceiling: int | None) -> None:
    limit = FixedLimit(ceiling)
    assert limit.limit == limit.ceiling == ceiling
    limit.on_sent(0.0, 3)
    limit.on_overload(1.0)
    assert not limit.on_response(2.0, 5.0, 3, error=False)
    assert limit.limit == ceiling
    limit.set_ceiling(7)
    assert limit.limit == 7


def test_an_adaptive_limit_halves_on_overload_and_stays_under_its_ceiling() -> None:
    limit = adaptive(ceiling=8, initial=8)
    assert limit.limit == 8
    limit.on_overload(1.0)
    assert limit.limit == 4
    limit.set_ceiling(2)
    assert (limit.limit, limit.ceiling) == (2, 2)
    # No configured ceiling: CONCURRENT_REQUESTS (no_ceiling) is the one.
    limit.set_ceiling(None)
    assert limit.ceiling == 16


def test_error_responses_never_raise_an_adaptive_limit() -> None:
    limit = adaptive(ceiling=8, initial=2)
    now = 0.0
    for _ in range(200):
        now += 0.01
        limit.on_sent(now, 1)
        limit.on_response(now, 0.001, 1, error=True)
    assert limit.limit <= 2
    assert limit.samples == 200


def test_rampup_sets_the_ceiling_of_the_limit_it_wraps() -> None:
    inner = adaptive(ceiling=8, initial=8)
    limit = rampup(inner)
    backoff = BackoffState(BackoffPolicy(), 1.0)
    gate = DelayGate((0.0, 0.0))
    limit.state.concurrency = 3  # what a faster step decides
    change = limit.enforce(0.0, backoff, gate)
    assert change is not None
    assert (change.old_concurrency, change.concurrency) == (1, 3)
    assert inner.ceiling == limit.ceiling == 3
    assert inner.limit <= 3
    # Nothing changed since: nothing to enforce.
    assert limit.enforce(0.0, backoff, gate) is None


def test_a_ceiling_set_from_outside_rebases_rampup() -> None:
    limit = rampup(FixedLimit(1))
    limit.set_ceiling(4)
    assert limit.state.concurrency == 4
    assert limit.limit == 4
    limit.set_base_delay(3.0)
    assert limit.state.delay == 3.0
    limit.set_floor(2.0)
    assert limit.state.delay_floor == 2.0


def test_a_lower_rampup_delay_opens_the_gate_sooner() -> None:
    limit = rampup(FixedLimit(1), delay=2.0)
    backoff = BackoffState(BackoffPolicy(), 2.0)
    gate = DelayGate((0.0, 0.0))
    gate.record_send(10.0, backoff.delay, backed_off=False, paced_until=None)
    assert gate.next_send_at == 12.0
    limit.state.delay = 0.5  # a faster step
    change = limit.enforce(10.0, backoff, gate)
    assert change is not None
    assert change.delay == 0.5
    assert backoff.base_delay == 0.5
    assert gate.next_send_at == 10.5
