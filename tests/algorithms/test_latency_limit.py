from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_adaptive_throttle._algorithms import LatencyLimit
from scrapy_adaptive_throttle._algorithms.latency_speed import SpeedChange
from tests.latency_host_model import SimulatedHost, crawl, mean

# -- unit rules ---------------------------------------------------------------


def test_defaults() -> None:
    limit = LatencyLimit()
    assert (limit.limit, limit.minimum, limit.maximum) == (2.0, 1, 8)
    assert (limit.tolerance, limit.window) == (1.5, 30.0)
    assert limit.best is None
    assert limit.last_latency is None
    assert limit.current() == 2
    counters = (
        limit.increase_count,
        limit.decrease_count,
        limit.overload_count,
        limit.rebaseline_count,
    )
    assert counters == (0, 0, 0, 0)


@pytest.mark.parametrize(
    ("initial", "minimum", "maximum", "expected"),
    [(2.0, 1, 8, 2.0), (0.5, 1, 8, 1.0), (20.0, 1, 8, 8.0), (math.nan, 3, 8, 3.0)],
)
def test_initial_is_clamped(
    initial: float, minimum: int, maximum: int, expected: float
) -> None:
    limit = LatencyLimit(initial=initial, minimum=minimum, maximum=maximum)
    assert limit.limit == expected


@pytest.mark.parametrize(
    ("bounds", "expected_bounds", "expected_limit"),
    [
        ((1, 3), (1, 3), 3.0),
        ((6, 10), (6, 10), 6.0),
        ((0, 10), (1, 10), 5.0),
        ((4, 2), (4, 4), 4.0),
    ],
)
def test_set_bounds_reclamps(
    bounds: tuple[int, int], expected_bounds: tuple[int, int], expected_limit: float
) -> None:
    limit = LatencyLimit(initial=5.0, maximum=10)
    limit.set_bounds(*bounds)
    assert (limit.minimum, limit.maximum) == expected_bounds
    assert limit.limit == expected_limit


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tolerance": 0.9},
        {"tolerance": math.nan},
        {"window": math.inf},
        {"resolution": -1.0},
    ],
)
def test_invalid_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        LatencyLimit(**kwargs)


def test_current_is_the_integer_part() -> None:
    limit = LatencyLimit(probe=False, slow_start=False, initial=3.99)
    assert limit.current() == 3


def test_fast_answers_grow_by_one_over_limit() -> None:
    limit = LatencyLimit(probe=False, slow_start=False, initial=2.0)
    limit.on_response(0.0, 0.1, in_flight=2)
    assert limit.limit == 2.5
    assert limit.best == limit.last_latency == 0.1
    # Still in the lower half of the tolerance band (0.1 to 0.15): full step.
    limit.on_response(0.2, 0.11, in_flight=2)
    assert limit.limit == pytest.approx(2.9)
    assert limit.increase_count == 2


@pytest.mark.parametrize(
    ("latency", "expected"),
    [(0.1, 2.5), (0.125, 2.5), (0.14, 2.2), (0.15, 2.0)],
)
def test_growth_tapers_off_towards_the_tolerance(
    latency: float, expected: float
) -> None:
    limit = LatencyLimit(probe=False, slow_start=False, initial=2.0)
    limit.on_response(0.0, 0.1, in_flight=0)  # best 0.1; idle: no growth
    limit.on_response(1.0, latency, in_flight=2)
    assert limit.limit == pytest.approx(expected)


def test_tolerance_of_one_grows_on_the_best_latency() -> None:
    limit = LatencyLimit(probe=False, slow_start=False, initial=2.0, tolerance=1.0)
    limit.on_response(0.0, 0.1, in_flight=2)
    assert limit.limit == 2.5


def test_slow_start_adds_a_request_per_fast_answer() -> None:
    limit = LatencyLimit(initial=2.0, maximum=64)
    assert limit.in_slow_start
    for index in range(6):
        limit.on_response(index / 100, 0.02, in_flight=limit.current())
    assert limit.limit == 8.0
    # An answer in the upper half of the tolerance band (0.025 to 0.03): a
    # queue is forming; back to 1 / limit, tapered.
    limit.on_response(0.1, 0.028, in_flight=8)
    assert not limit.in_slow_start
    assert limit.limit == pytest.approx(8 + 0.4 / 8)


@pytest.mark.parametrize(
    "event",
    [
        lambda limit: limit.on_overload(1.0),
        lambda limit: limit.on_response(1.0, 0.5, in_flight=2),
    ],
)
def test_slow_start_ends_at_the_first_sign_of_overload(event: Any) -> None:
    limit = LatencyLimit(initial=2.0, maximum=64)
    limit.on_response(0.0, 0.02, in_flight=2)
    event(limit)
    assert not limit.in_slow_start


def test_slow_start_needs_the_limit_in_use() -> None:
    limit = LatencyLimit(initial=2.0, maximum=64)
    for index in range(20):
        limit.on_response(index, 0.02, in_flight=1)
    assert limit.limit == 3.0


@pytest.mark.parametrize(
    ("latency", "slow"), [(0.0015, False), (0.006, False), (0.0066, True)]
)
def test_resolution_is_the_smallest_added_latency_that_counts(
    latency: float, slow: bool
) -> None:
    limit = LatencyLimit(probe=False, slow_start=False, initial=2.0, resolution=0.005)
    limit.on_response(0.0, 0.001, in_flight=0)  # best: 1 ms
    limit.on_response(1.0, latency, in_flight=2)
    assert (limit.decrease_count == 1) is slow


def test_growth_needs_the_limit_in_use() -> None:
    limit = LatencyLimit(probe=False, slow_start=False, initial=4.0)
    limit.on_response(0.0, 0.1, in_flight=2)
    assert limit.limit == 4.0
    limit.on_response(0.0, 0.1, in_flight=3)
    assert limit.limit == 4.25


def test_growth_stops_at_maximum() -> None:
    limit = LatencyLimit(probe=False, slow_start=False, initial=3.9, maximum=4)
    limit.on_response(0.0, 0.1, in_flight=4)
    assert limit.limit == 4.0
    limit.on_response(0.2, 0.1, in_flight=4)
    assert limit.limit == 4.0
    assert limit.increase_count == 1


def test_answers_to_requests_older_than_a_raise_do_not_raise_again() -> None:
    limit = LatencyLimit(probe=False, slow_start=False, initial=2.9, maximum=10)
    limit.on_response(1.0, 0.1, in_flight=2)  # 2.9 -> 3.24: raised at t=1.0
    assert limit.current() == 3
    # Sent at 0.95, before the raise: it tested a limit of 2, not 3.
    limit.on_response(1.05, 0.1, in_flight=3)
    assert limit.limit == pytest.approx(2.9 + 1 / 2.9)
    # Sent at 1.0: it tested the new limit.
    limit.on_response(1.1, 0.1, in_flight=3)
    assert limit.limit > 3.5


def test_one_slow_answer_in_a_round_is_noise() -> None:
    limit = LatencyLimit(probe=False, slow_start=False, initial=8.0, maximum=16)
    limit.on_response(0.0, 0.1, in_flight=1)
    for step in range(1, 8):
        limit.on_response(step, 0.3 if step == 3 else 0.11, in_flight=1)
    assert limit.limit == 8.0
    assert limit.decrease_count == 0


def test_a_slow_round_decreases_once() -> None:
    limit = LatencyLimit(probe=False, slow_start=False, initial=12.0, maximum=16)
    limit.on_response(0.0, 0.1, in_flight=1)
    # Six slow answers of twelve: half the round is slow.
    for index in range(6):
        limit.on_response(1.0 + index / 100, 0.2, in_flight=12)
    assert limit.limit == pytest.approx(12 * 0.9)
    assert limit.decrease_count == 1
    # The rest of the queue built before the decision drains slowly: those
    # requests were sent before it, and do not count.
    for index in range(20):
        limit.on_response(1.1 + index / 200, 0.2, in_flight=10)
    assert limit.limit == pytest.approx(12 * 0.9)
    # Requests sent after the decision that are still slow: a new round.
    for index in range(5):
        limit.on_response(1.3 + index / 100, 0.2, in_flight=10)
    assert limit.limit == pytest.approx(12 * 0.9 * 0.9)
    assert limit.decrease_count == 2


def test_a_decrease_below_ten_is_one_request() -> None:
    limit = LatencyLimit(probe=False, slow_start=False, initial=4.5, maximum=16)
    limit.on_response(0.0, 0.1, in_flight=1)
    limit.on_response(1.0, 0.3, in_flight=4)
    assert limit.limit == 4.5
    limit.on_response(1.01, 0.3, in_flight=4)
    assert limit.limit == 3.5


def test_a_round_with_most_answers_fast_does_not_decrease() -> None:
    limit = LatencyLimit(probe=False, slow_start=False, initial=4.0, maximum=4)
    limit.on_response(0.0, 0.1, in_flight=1)
    for now, latency in [(1.0, 0.3), (1.01, 0.12), (1.02, 0.12), (1.03, 0.12)]:
        limit.on_response(now, latency, in_flight=4)
    assert limit.limit == 4.0
    assert limit.decrease_count == 0


def test_decrease_stops_at_minimum() -> None:
    limit = LatencyLimit(probe=False, slow_start=False, initial=3.0, minimum=2)
    limit.on_response(0.0, 0.1, in_flight=0)
    limit.on_response(1.0, 0.5, in_flight=3)
    limit.on_response(1.01, 0.5, in_flight=3)
    assert limit.limit == 2.0
    limit.on_response(1.6, 0.5, in_flight=2)
    limit.on_response(2.2, 0.5, in_flight=2)
    assert limit.limit == 2.0
    assert limit.current() == 2


def test_overload_halves_at_once() -> None:
    limit = LatencyLimit(probe=False, slow_start=False, initial=8.0, maximum=16)
    limit.on_overload(0.0)
    assert limit.limit == 4.0
    assert limit.current() == 4


def test_overload_halves_once_per_round() -> None:
    limit = LatencyLimit(probe=False, slow_start=False, initial=8.0, maximum=16)
    limit.on_response(0.0, 0.1, in_flight=1)
    limit.on_overload(1.0)
    limit.on_overload(1.01)
    assert limit.limit == 4.0
    # Slow answers to requests sent before the overload count for nothing.
    limit.on_response(1.02, 0.5, in_flight=4)
    limit.on_response(1.03, 0.5, in_flight=4)
    assert limit.limit == 4.0
    limit.on_overload(1.1)
    assert limit.limit == 2.0
    limit.on_overload(2.0)
    limit.on_overload(3.0)
    assert limit.limit == 1.0
    assert limit.overload_count == 5


def test_overload_after_a_slow_round_still_halves() -> None:
    limit = LatencyLimit(probe=False, slow_start=False, initial=8.0, maximum=16)
    limit.on_response(0.0, 0.1, in_flight=1)
    for index in range(4):
        limit.on_response(1.0 + index / 100, 0.3, in_flight=8)
    assert limit.limit == 7.0
    limit.on_overload(1.05)
    assert limit.limit == 3.5


@pytest.mark.parametrize("latency", [math.nan, math.inf, -0.1, 0.0])
def test_unusable_latency_is_ignored(latency: float) -> None:
    limit = LatencyLimit(probe=False, slow_start=False)
    limit.on_response(0.0, latency, in_flight=2)
    limit.on_error_response(0.0, latency)
    assert limit.best is None
    assert limit.last_latency is None
    assert limit.limit == 2.0


def test_fast_error_page_neither_raises_nor_sets_the_best() -> None:
    limit = LatencyLimit(probe=False, slow_start=False, initial=2.0)
    limit.on_response(0.0, 0.1, in_flight=0)
    limit.on_error_response(1.0, 0.01)
    assert limit.best == 0.1
    assert limit.limit == 2.0
    assert limit.last_latency == 0.01


def test_slow_error_pages_count_as_slow_answers() -> None:
    limit = LatencyLimit(probe=False, slow_start=False, initial=4.0)
    limit.on_error_response(0.0, 1.0)  # no best yet: nothing to compare with
    limit.on_response(0.5, 0.1, in_flight=1)
    limit.on_error_response(1.0, 0.5)
    limit.on_error_response(1.01, 0.5)
    assert limit.limit == 3.0


def test_baseline_is_the_median_of_fresh_samples() -> None:
    # The baseline is the (lower) median of the samples, not their minimum:
    # with noisy latency most normal answers are above the minimum.
    limit = LatencyLimit(probe=False, slow_start=False, window=10.0)
    limit.on_response(0.0, 0.1, in_flight=1)
    limit.on_response(5.0, 0.3, in_flight=1)
    assert limit.best == 0.1
    limit.on_response(11.0, 0.3, in_flight=1)
    assert limit.best == 0.3
    # Samples expire after two windows: only those since t=2 count at t=22.
    limit.on_response(22.0, 0.05, in_flight=1)
    limit.on_response(22.1, 0.05, in_flight=1)
    assert limit.best == 0.05


def test_best_expires_after_a_long_gap() -> None:
    limit = LatencyLimit(probe=False, slow_start=False, window=10.0)
    limit.on_response(0.0, 0.1, in_flight=1)
    limit.on_response(25.0, 0.3, in_flight=1)
    assert limit.best == 0.3


def slow_rounds(limit: LatencyLimit, start: float, latencies: list[float]) -> None:
    """One round per latency: ``current()`` answers, sent after the last one."""
    now = start
    for latency in latencies:
        now += latency + 0.01
        for index in range(limit.current()):
            limit.on_response(now + index / 1000, latency, in_flight=limit.current())


def test_a_slowdown_the_limit_cannot_fix_becomes_the_baseline() -> None:
    limit = LatencyLimit(
        probe=False, slow_start=False, initial=12.0, maximum=16, window=30.0
    )
    limit.on_response(0.0, 0.02, in_flight=1)
    limit.on_response(0.01, 0.02, in_flight=1)
    # The first round still has those fast answers (a quarter of it: not
    # mostly slow); three mostly slow rounds follow, whose medians do not get
    # faster.
    slow_rounds(limit, 1.0, [0.08, 0.08, 0.08])
    assert limit.rebaseline_count == 0
    slow_rounds(limit, 2.0, [0.08])
    assert limit.rebaseline_count == 1
    assert limit.best == 0.08
    # Four decreases (12 -> 10.8 -> 9.72 -> 8.72 -> 7.72), then the answers
    # of the last round, no longer slow, raise it again.
    assert limit.decrease_count == 4
    assert limit.limit > 7.72
    slow_rounds(limit, 3.0, [0.085, 0.085])
    assert limit.current() >= 8
    assert limit.decrease_count == 4


@pytest.mark.parametrize(("load", "rebaselined"), [(None, 1), (7, 0)])
def test_flat_rounds_are_a_slowdown_only_while_the_load_follows_the_limit(
    load: int | None, rebaselined: int
) -> None:
    # The slowdown above, with the requests in flight following the limit
    # down (None) or staying at 7 whatever the limit (a shared limit whose
    # processes lag behind it): there, lowering the limit changed nothing
    # at the host yet, so a flat latency is no evidence of a slowdown.
    limit = LatencyLimit(
        probe=False, slow_start=False, initial=12.0, maximum=16, window=30.0
    )
    limit.on_response(0.0, 0.02, in_flight=1)
    limit.on_response(0.01, 0.02, in_flight=1)
    now = 1.0
    for _ in range(5):
        now += 0.09
        for index in range(limit.current()):
            in_flight = limit.current() if load is None else load
            limit.on_response(now + index / 1000, 0.08, in_flight=in_flight)
    assert limit.rebaseline_count == rebaselined
    assert limit.decrease_count >= 4


def test_a_slowdown_reaching_one_request_in_flight_becomes_the_baseline() -> None:
    # A host four times slower, on a small limit: by the time lowering it
    # has shown nothing, it is at its floor of 1 (the second round's median
    # came out faster by chance, so the first two do not count as flat).
    # Rounds at one request in flight can go no lower: they count, as flat.
    # Without that, every later round read "load not lower: no evidence",
    # and the limit stayed at 1 with the old baseline until its samples
    # expired, two windows later.
    limit = LatencyLimit(
        probe=False, slow_start=False, initial=3.0, maximum=16, window=30.0
    )
    for index in range(40):
        limit.on_response(index * 0.021, 0.02, in_flight=1)
    limit.limit = 3.0
    slow_rounds(limit, 1.0, [0.08, 0.06, 0.08])
    assert (limit.current(), limit.rebaseline_count) == (1, 0)
    slow_rounds(limit, 2.0, [0.07])
    assert limit.rebaseline_count == 1
    assert limit.best == 0.07
    # Slow start finds the limit the slower host allows.
    slow_rounds(limit, 3.0, [0.085, 0.075, 0.08])
    assert limit.current() == 8


def test_rounds_at_an_unchanged_load_count_only_at_one_request() -> None:
    # Above one request in flight, rounds at the same load still say
    # nothing (a shared limit's processes lagging behind it), however many.
    speed = SpeedChange()
    for _ in range(6):
        assert speed.after_slow_round([0.08] * 4, mostly_slow=True, load=2.0) is None
    # At one request, the third mostly slow round in a row is a slowdown,
    # whatever its noise.
    speed = SpeedChange()
    assert speed.after_slow_round([0.08] * 4, mostly_slow=True, load=1.0) is None
    assert speed.after_slow_round([0.05] * 4, mostly_slow=True, load=1.0) is None
    assert speed.after_slow_round([0.09] * 4, mostly_slow=True, load=1.0) == 0.09


def test_a_queue_of_our_own_is_not_a_slowdown() -> None:
    limit = LatencyLimit(
        probe=False, slow_start=False, initial=16.0, maximum=16, window=30.0
    )
    limit.on_response(0.0, 0.02, in_flight=1)
    # Every answer is slow, but each decrease makes them faster: the latency
    # is the crawler's own queue at the host.
    slow_rounds(limit, 1.0, [0.08, 0.07, 0.06, 0.05, 0.04])
    assert limit.rebaseline_count == 0
    assert limit.best == 0.02
    assert limit.decrease_count == 5


# -- a limit enforced elsewhere (a shared limit's leader) -------------------------


@pytest.mark.parametrize("held", [False, True])
def test_a_held_decrease_counts_only_answers_sent_after_its_release(
    held: bool,
) -> None:
    limit = LatencyLimit(probe=False, slow_start=False, initial=12.0, maximum=16)
    limit.on_response(0.0, 0.1, in_flight=1)
    for index in range(6):
        limit.on_response(1.0 + index / 100, 0.2, in_flight=12)
    assert limit.decrease_count == 1
    if held:
        # Decided at 1.05 on drained samples; published (enforced) at 1.2.
        limit.hold(1.05)
        assert limit.held
    # Slow answers to requests sent at 1.10-1.14: after the decision, but
    # before the lowered limit was enforced, so they did not test it.
    for index in range(5):
        limit.on_response(1.3 + index / 100, 0.2, in_flight=10)
    assert limit.decrease_count == (1 if held else 2)
    if held:
        limit.release(1.2)
        assert not limit.held
        # Sent at 1.25-1.29, under the lowered limit: a new round.
        for index in range(5):
            limit.on_response(1.45 + index / 100, 0.2, in_flight=10)
        assert limit.decrease_count == 2
    assert limit.limit == pytest.approx(12 * 0.9 * 0.9)


def test_a_held_raise_grows_only_on_answers_sent_after_its_release() -> None:
    limit = LatencyLimit(probe=False, slow_start=False, initial=2.9, maximum=10)
    limit.on_response(1.0, 0.1, in_flight=2)  # 2.9 -> 3.24: raised at 1.0
    limit.hold(1.0)
    # Sent at 1.0, after the raise was decided but before it was enforced
    # (test_answers_to_requests_older_than_a_raise_do_not_raise_again: it
    # raises the limit again without the hold).
    limit.on_response(1.1, 0.1, in_flight=3)
    assert limit.limit == pytest.approx(2.9 + 1 / 2.9)
    limit.release(1.05)
    limit.on_response(1.2, 0.1, in_flight=3)  # sent at 1.1
    assert limit.limit > 3.5


def test_a_held_raise_keeps_the_round_that_ends_slow_start() -> None:
    # Slow start raises the limit on fast answers without ending the round;
    # the slow answers of that round must still end slow start when the
    # raise is held (else slow start runs on to the ceiling).
    limit = LatencyLimit(probe=False, initial=4.0, maximum=16)
    limit.on_response(0.0, 0.1, in_flight=1)
    limit.on_response(0.5, 0.1, in_flight=4)
    assert limit.current() == 5
    limit.hold(0.5)
    for index in range(4):
        limit.on_response(0.6 + index / 100, 0.3, in_flight=5)
    assert not limit.in_slow_start
    assert limit.decrease_count == 1


def test_adopt_goes_on_from_a_limit_and_baseline_learned_elsewhere() -> None:
    limit = LatencyLimit(initial=2.0, maximum=16)
    assert limit.in_slow_start
    limit.adopt(5.0, 9, 0.04)
    assert (limit.current(), limit.best, limit.in_slow_start) == (9, 0.04, False)
    # Loaded answers (9 in flight, 0.07 s) are slow against the adopted
    # baseline: they lower the limit instead of becoming the baseline.
    for index in range(9):
        limit.on_response(5.2 + index / 100, 0.07, in_flight=9)
    assert limit.best == 0.04
    assert limit.current() < 9
    # Out of bounds and without a baseline: clamped, the baseline kept.
    limit.adopt(6.0, 40, None)
    assert (limit.current(), limit.best) == (16, 0.04)


def test_snapshot() -> None:
    limit = LatencyLimit(
        probe=False, slow_start=False, initial=3.5, minimum=2, maximum=6
    )
    limit.on_response(0.0, 0.25, in_flight=1)
    assert limit.snapshot() == {
        "limit": 3.5,
        "current": 3,
        "best": 0.25,
        "minimum": 2,
        "maximum": 6,
    }


# -- a simulated host ---------------------------------------------------------


@pytest.mark.parametrize("turnaround", [0.002, 0.008])
def test_large_host_settles_near_capacity(turnaround: float) -> None:
    limit = LatencyLimit(maximum=64, window=5.0)
    host = SimulatedHost(workers=8, service=0.02)
    result = crawl(limit, host, 10.0, turnaround)
    settled = result.limits(3.0)
    assert result.overloads == []
    # Capacity x service time is 8; the crawler's turnaround needs a few more.
    assert 8 <= mean(settled) <= 16
    assert result.rate(3.0, 10.0) >= 0.95 * host.capacity
    assert result.median_latency(3.0) <= 1.5 * 0.02


@pytest.mark.parametrize("turnaround", [0.002, 0.008])
def test_small_host_settles_near_capacity(turnaround: float) -> None:
    limit = LatencyLimit(maximum=64, window=5.0)
    host = SimulatedHost(workers=2, service=0.05)
    result = crawl(limit, host, 20.0, turnaround)
    settled = result.limits(5.0)
    assert result.overloads == []
    assert 2 <= mean(settled) <= 5
    assert max(settled) <= 6
    assert result.rate(5.0, 20.0) >= 0.9 * host.capacity


def test_high_initial_limit_comes_down_after_503s() -> None:
    limit = LatencyLimit(initial=64, maximum=64, window=5.0)
    result = crawl(limit, SimulatedHost(workers=2, service=0.05), 10.0)
    assert result.overloads
    assert limit.overload_count == len(result.overloads)
    assert max(result.limits(3.0)) <= 6


def test_permanent_slowdown_becomes_the_baseline() -> None:
    window = 30.0
    limit = LatencyLimit(maximum=64, window=window)
    host = SimulatedHost(
        workers=8,
        service=0.02,
        service_at=lambda now: 0.02 if now < 3.0 else 0.08,
    )
    result = crawl(limit, host, 8.0)
    assert mean(result.limits(2.0, 3.0)) >= 8
    # Well before the 30-second window expires, the slower latency is normal
    # and the limit is back where the host's capacity needs it.
    assert limit.rebaseline_count >= 1
    assert limit.best is not None
    assert limit.best >= 0.08 * 0.9
    assert mean(result.limits(4.0)) >= 8
    assert result.rate(3.5, 8.0) >= 0.9 * host.workers / 0.08
    assert result.overloads == []


def test_slowdown_and_recovery_with_a_short_window() -> None:
    limit = LatencyLimit(maximum=64, window=1.0)
    host = SimulatedHost(
        workers=8,
        service=0.02,
        service_at=lambda now: 0.08 if 3.0 <= now < 6.0 else 0.02,
    )
    result = crawl(limit, host, 9.0)
    assert result.rate(3.0, 6.0) >= 0.9 * 100
    assert result.rate(6.5, 9.0) >= 0.9 * 400
    assert result.overloads == []


def test_idle_host_does_not_inflate_the_limit() -> None:
    limit = LatencyLimit(maximum=64)
    for step in range(1000):
        limit.on_response(step * 0.5, 0.02, in_flight=1)
    assert limit.current() <= 3


@settings(max_examples=200, deadline=None)
@given(
    minimum=st.integers(min_value=0, max_value=5),
    maximum=st.integers(min_value=0, max_value=40),
    initial=st.floats(allow_nan=True, allow_infinity=True),
    tolerance=st.floats(min_value=1, max_value=5),
    events=st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=5),
            st.floats(allow_nan=True, allow_infinity=True),
            st.integers(min_value=0, max_value=50),
            st.sampled_from(["response", "error", "overload"]),
        ),
        max_size=80,
    ),
)
def test_limit_stays_within_bounds(
    minimum: int,
    maximum: int,
    initial: float,
    tolerance: float,
    events: list[tuple[float, float, int, str]],
) -> None:
    limit = LatencyLimit(
        initial=initial, minimum=minimum, maximum=maximum, tolerance=tolerance
    )
    low, high = limit.minimum, limit.maximum
    assert 1 <= low <= high
    now = 0.0
    for step, latency, in_flight, kind in events:
        now += step
        if kind == "overload":
            limit.on_overload(now)
        elif kind == "error":
            limit.on_error_response(now, latency)
        else:
            limit.on_response(now, latency, in_flight)
        assert low <= limit.limit <= high
        assert low <= limit.current() <= high


def test_simulated_hosts_are_deterministic() -> None:
    first = crawl(LatencyLimit(maximum=64), SimulatedHost(2, 0.05), 3.0)
    second = crawl(
        LatencyLimit(maximum=64),
        SimulatedHost(2, 0.05, rng=random.Random(1)),
        3.0,
    )
    assert first.trace == second.trace
