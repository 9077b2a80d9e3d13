from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_adaptive_throttle._algorithms import (
    NO_JITTER,
    BackoffPolicy,
    BackoffState,
)


def make_state(
    base_delay: float = 0.0,
    *,
    uniform: Callable[[float, float], float] = random.uniform,
    **policy: Any,
) -> BackoffState:
    fields: dict[str, Any] = {"jitter": NO_JITTER, **policy}
    return BackoffState(BackoffPolicy(**fields), base_delay, uniform=uniform)


def delays_after_triggers(state: BackoffState, count: int) -> list[float]:
    result = []
    for _ in range(count):
        state.trigger(0.0)
        result.append(state.delay)
    return result


def test_policy_defaults() -> None:
    policy = BackoffPolicy()
    assert policy.delay_factor == 2.0
    assert (policy.min_delay, policy.max_delay) == (1.0, 300.0)
    assert policy.jitter == (-0.1, 0.1)
    assert policy.window == 60.0


@pytest.mark.parametrize(
    "fields",
    [
        {"delay_factor": 0.5},
        {"delay_factor": math.nan},
        {"min_delay": -1.0},
        {"max_delay": math.inf},
        {"jitter": (0.1, -0.1)},
        {"jitter": (math.nan, 0.1)},
        {"window": math.nan},
    ],
)
def test_policy_rejects_invalid_values(fields: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(fields))):
        BackoffPolicy(**fields)  # type: ignore[arg-type]


def test_initial_state() -> None:
    state = make_state(0.25)
    assert state.base_delay == state.delay == state.nominal_delay == 0.25
    assert state.level == 0
    assert state.hold_until == 0.0
    assert state.last_trigger is None
    assert state.trigger_count == 0
    assert not state.in_backoff(0.0)
    assert state.wait(0.0) == 0.0


@pytest.mark.parametrize(
    ("base", "policy", "expected"),
    [
        (0.0, {}, [1, 2, 4, 8]),
        (0.0, {"delay_factor": 10, "max_delay": 5}, [1, 5, 5]),
        (0.0, {"min_delay": 5, "delay_factor": 3}, [5, 15]),
        (0.0, {"min_delay": 3}, [3, 6]),
        (0.5, {}, [1, 2]),
        (2.0, {}, [4, 8]),
        # A base above max_delay (e.g. a long Crawl-delay) is never undercut.
        (400.0, {}, [400, 400]),
    ],
)
def test_trigger_sequences(
    base: float, policy: dict[str, Any], expected: list[float]
) -> None:
    state = make_state(base, **policy)
    assert delays_after_triggers(state, len(expected)) == expected
    assert state.level == state.trigger_count == len(expected)
    assert state.nominal_delay == expected[-1]


def test_trigger_records_time_and_count() -> None:
    state = make_state()
    state.trigger(5.0)
    state.trigger(7.0)
    assert state.last_trigger == 7.0
    assert state.trigger_count == 2
    assert state.in_backoff(7.0)


def test_recovery_one_step_per_window() -> None:
    state = make_state()
    delays_after_triggers(state, 3)
    assert state.delay == 4
    assert state.recover(59.9) == 0
    assert state.delay == 4
    assert state.recover(60.0) == 1
    assert (state.level, state.delay) == (2, 2)
    assert state.recover(120.0) == 1
    assert (state.level, state.delay) == (1, 1)
    assert state.recover(180.0) == 1
    assert (state.level, state.delay, state.nominal_delay) == (0, 0, 0)
    assert state.last_trigger is None
    assert not state.in_backoff(180.0)
    assert state.recover(10_000.0) == 0


def test_recovery_catches_up_after_a_long_quiet_period() -> None:
    state = make_state()
    delays_after_triggers(state, 3)
    assert state.recover(130.0) == 2
    assert (state.level, state.delay) == (1, 1)
    assert state.last_trigger == 120.0


def test_new_trigger_restarts_the_countdown() -> None:
    state = make_state()
    delays_after_triggers(state, 3)
    state.recover(60.0)
    state.trigger(90.0)
    assert (state.level, state.delay) == (3, 4)
    assert state.recover(149.0) == 0
    assert state.recover(150.0) == 1
    assert (state.level, state.delay) == (2, 2)


def test_recovery_from_base_below_min_delay() -> None:
    state = make_state(0.5)
    delays_after_triggers(state, 2)
    state.recover(60.0)
    assert (state.level, state.delay) == (1, 1)
    state.recover(120.0)
    assert (state.level, state.delay) == (0, 0.5)


def test_step_below_min_delay_goes_straight_to_base() -> None:
    state = make_state()
    state.trigger(0.0)
    state.trigger(0.0, hard_delay=5.0)
    assert (state.level, state.delay) == (2, 1)
    assert state.recover(60.0) == 2
    assert (state.level, state.delay) == (0, 0)


def test_recovery_above_min_delay_keeps_levels() -> None:
    state = make_state(2.0)
    state.trigger(0.0, grow=False)
    state.trigger(0.0, grow=False)
    assert state.recover(60.0) == 1
    assert (state.level, state.delay) == (1, 2)


def test_window_zero_recovers_at_once() -> None:
    state = make_state(window=0.0)
    # Each trigger first recovers the previous one, so the delay never grows.
    assert delays_after_triggers(state, 3) == [1, 1, 1]
    assert state.level == 1
    assert state.recover(0.0) == 1
    assert (state.level, state.delay) == (0, 0)


@pytest.mark.parametrize(
    ("hard_delay", "cap", "hold"),
    [(120.0, True, 120.0), (1000.0, True, 300.0), (1000.0, False, 1000.0)],
)
def test_hard_delay_is_a_hold(hard_delay: float, cap: bool, hold: float) -> None:
    state = make_state()
    state.trigger(10.0, hard_delay, cap=cap)
    assert state.hold_until == 10.0 + hold
    assert state.wait(10.0) == hold
    assert state.delay == state.nominal_delay == 0
    assert state.level == 1


def test_hold_outlives_recovery() -> None:
    state = make_state()
    state.trigger(0.0, 120.0)
    state.recover(60.0)
    assert state.level == 0
    assert state.wait(60.0) == 60.0
    assert state.in_backoff(60.0)
    assert not state.in_backoff(120.0)
    assert state.wait(130.0) == 0.0


def test_hold_only_extends() -> None:
    state = make_state()
    state.trigger(0.0, 100.0)
    state.trigger(1.0, 10.0)
    assert state.hold_until == 100.0
    state.trigger(2.0, 200.0)
    assert state.hold_until == 202.0


@pytest.mark.parametrize("hard_delay", [-5.0, 0.0, math.nan])
def test_unusable_hard_delay_counts_without_hold(hard_delay: float) -> None:
    state = make_state()
    state.trigger(3.0, hard_delay)
    assert state.hold_until == 0.0
    assert (state.level, state.trigger_count, state.delay) == (1, 1, 0)


def test_trigger_without_growth() -> None:
    state = make_state(0.25)
    state.trigger(0.0, grow=False)
    state.trigger(30.0, grow=False)
    assert (state.level, state.trigger_count, state.last_trigger) == (2, 2, 30.0)
    assert state.delay == 0.25


def test_set_base_delay_at_level_zero() -> None:
    state = make_state(1.0)
    state.set_base_delay(3.0)
    assert state.base_delay == state.delay == state.nominal_delay == 3.0
    state.set_base_delay(0.5)
    assert state.delay == 0.5


def test_set_base_delay_during_backoff() -> None:
    state = make_state()
    delays_after_triggers(state, 2)
    state.set_base_delay(1.0)
    assert state.delay == 2
    state.set_base_delay(3.0)
    assert state.delay == state.nominal_delay == 3.0
    state.recover(120.0)
    assert (state.level, state.delay) == (0, 3.0)


@pytest.mark.parametrize("value", [-1.0, math.nan])
def test_set_base_delay_floors_at_zero(value: float) -> None:
    state = make_state(2.0)
    state.set_base_delay(value)
    assert state.base_delay == state.delay == 0.0


def test_jitter_applies_to_nominal_without_compounding() -> None:
    state = make_state(uniform=lambda low, high: high, jitter=(-0.1, 0.1))
    delays = delays_after_triggers(state, 3)
    assert delays == pytest.approx([1.1, 2.2, 4.4])
    assert state.nominal_delay == 4
    state.recover(60.0)
    assert state.delay == pytest.approx(2.2)


def test_jitter_is_clamped_to_max_delay() -> None:
    state = make_state(uniform=lambda low, high: high, jitter=(0.0, 0.5), max_delay=3)
    assert delays_after_triggers(state, 3) == pytest.approx([1.5, 3.0, 3.0])


def test_level_zero_delay_is_exactly_base() -> None:
    def never_called(low: float, high: float) -> float:
        raise AssertionError("no jitter at level 0")

    state = make_state(0.5, uniform=never_called, jitter=(-0.1, 0.1))
    state.trigger(0.0, 10.0)
    state.recover(60.0)
    assert state.delay == 0.5


events = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=200),
        st.sampled_from(["trigger", "hard", "uncapped", "quiet", "recover", "base"]),
        st.one_of(st.floats(min_value=-10, max_value=1000), st.just(math.nan)),
    ),
    max_size=40,
)


policies = st.builds(
    BackoffPolicy,
    delay_factor=st.floats(min_value=1, max_value=10),
    min_delay=st.floats(min_value=0, max_value=20),
    max_delay=st.floats(min_value=0, max_value=400),
    jitter=st.just((-0.5, 0.5)),
    window=st.floats(min_value=-1, max_value=120),
)


@settings(max_examples=150, deadline=None)
@given(events=events, policy=policies, draw=st.floats(min_value=-0.5, max_value=0.5))
def test_invariants_hold_for_any_sequence(
    events: list[tuple[float, str, float]], policy: BackoffPolicy, draw: float
) -> None:
    state = BackoffState(policy, 1.0, uniform=lambda low, high: draw)
    now = 0.0
    for step, kind, value in events:
        now += step
        if kind == "trigger":
            state.trigger(now)
        elif kind == "hard":
            state.trigger(now, value)
        elif kind == "uncapped":
            state.trigger(now, value, cap=False)
        elif kind == "quiet":
            state.trigger(now, grow=False)
        elif kind == "recover":
            state.recover(now)
        else:
            state.set_base_delay(value)
        base = state.base_delay
        upper = max(policy.max_delay, base)
        assert state.level >= 0
        assert base <= state.nominal_delay <= upper
        assert 0 <= state.delay <= upper
        assert state.wait(now) >= 0
        if state.level == 0:
            assert state.delay == state.nominal_delay == base
            assert state.last_trigger is None
        else:
            assert state.last_trigger is not None
            assert state.in_backoff(now)
