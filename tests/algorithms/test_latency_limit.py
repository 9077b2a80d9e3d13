from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_adaptive_throttle._algorithms import LatencyLimit

# -- unit rules ---------------------------------------------------------------


def test_defaults() -> None:
    limit = LatencyLimit()
    assert (limit.limit, limit.minimum, limit.maximum) == (2.0, 1, 8)
    assert (limit.tolerance, limit.window) == (1.5, 30.0)
    assert limit.best is None
    assert limit.last_latency is None
    assert limit.current() == 2
    assert (limit.increase_count, limit.decrease_count, limit.overload_count) == (
        0,
        0,
        0,
    )


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
    "kwargs", [{"tolerance": 0.9}, {"tolerance": math.nan}, {"window": math.inf}]
)
def test_invalid_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        LatencyLimit(**kwargs)


def test_current_is_the_integer_part() -> None:
    limit = LatencyLimit(initial=3.99)
    assert limit.current() == 3


def test_fast_answers_grow_by_one_over_limit() -> None:
    limit = LatencyLimit(initial=2.0)
    limit.on_response(0.0, 0.1, in_flight=2)
    assert limit.limit == 2.5
    assert limit.best == limit.last_latency == 0.1
    limit.on_response(0.1, 0.14, in_flight=2)
    assert limit.limit == pytest.approx(2.9)
    assert limit.increase_count == 2


def test_growth_needs_the_limit_in_use() -> None:
    limit = LatencyLimit(initial=4.0)
    limit.on_response(0.0, 0.1, in_flight=2)
    assert limit.limit == 4.0
    limit.on_response(0.0, 0.1, in_flight=3)
    assert limit.limit == 4.25


def test_growth_stops_at_maximum() -> None:
    limit = LatencyLimit(initial=3.9, maximum=4)
    limit.on_response(0.0, 0.1, in_flight=4)
    assert limit.limit == 4.0
    limit.on_response(0.1, 0.1, in_flight=4)
    assert limit.limit == 4.0
    assert limit.increase_count == 1


def test_slow_answer_decreases_once_per_round() -> None:
    limit = LatencyLimit(initial=8.0, maximum=16)
    limit.on_response(0.0, 0.1, in_flight=1)
    limit.on_response(1.0, 0.2, in_flight=8)
    assert limit.limit == pytest.approx(7.2)
    # The rest of the same round: one recent-best latency has not passed.
    limit.on_response(1.05, 0.2, in_flight=7)
    assert limit.limit == pytest.approx(7.2)
    limit.on_response(1.1, 0.2, in_flight=7)
    assert limit.limit == pytest.approx(6.48)
    assert limit.decrease_count == 2


def test_decrease_stops_at_minimum() -> None:
    limit = LatencyLimit(initial=2.0, minimum=1)
    limit.on_response(0.0, 0.1, in_flight=2)
    for second in range(1, 20):
        limit.on_response(second, 1.0, in_flight=1)
    assert limit.limit == 1.0
    assert limit.current() == 1


def test_overload_halves_at_once() -> None:
    limit = LatencyLimit(initial=8.0, maximum=16)
    limit.on_overload(0.0)
    assert limit.limit == 4.0
    assert limit.current() == 4


def test_overload_halves_once_per_round() -> None:
    limit = LatencyLimit(initial=8.0, maximum=16)
    limit.on_response(0.0, 0.1, in_flight=1)
    limit.on_overload(1.0)
    limit.on_overload(1.01)
    assert limit.limit == 4.0
    # A slow answer of the same round does not decrease again either.
    limit.on_response(1.02, 0.5, in_flight=4)
    assert limit.limit == 4.0
    limit.on_overload(1.1)
    assert limit.limit == 2.0
    limit.on_overload(2.0)
    limit.on_overload(3.0)
    assert limit.limit == 1.0
    assert limit.overload_count == 5


@pytest.mark.parametrize("latency", [math.nan, math.inf, -0.1, 0.0])
def test_unusable_latency_is_ignored(latency: float) -> None:
    limit = LatencyLimit()
    limit.on_response(0.0, latency, in_flight=2)
    assert limit.best is None
    assert limit.last_latency is None
    assert limit.limit == 2.0


def test_best_expires_after_the_previous_window() -> None:
    limit = LatencyLimit(window=10.0)
    limit.on_response(0.0, 0.1, in_flight=1)
    limit.on_response(5.0, 0.3, in_flight=1)
    assert limit.best == 0.1
    # A new window starts; the previous window's best still counts.
    limit.on_response(11.0, 0.3, in_flight=1)
    assert limit.best == 0.1
    # And another one: now only samples since t=11 count.
    limit.on_response(22.0, 0.4, in_flight=1)
    assert limit.best == 0.3


def test_best_expires_after_a_long_gap() -> None:
    limit = LatencyLimit(window=10.0)
    limit.on_response(0.0, 0.1, in_flight=1)
    limit.on_response(25.0, 0.3, in_flight=1)
    assert limit.best == 0.3


def test_snapshot() -> None:
    limit = LatencyLimit(initial=3.5, minimum=2, maximum=6)
    limit.on_response(0.0, 0.25, in_flight=1)
    assert limit.snapshot() == {
        "limit": 3.5,
        "current": 3,
        "best": 0.25,
        "minimum": 2,
        "maximum": 6,
    }


# -- a simulated host ---------------------------------------------------------


@dataclass
class SimulatedHost:
    """``workers`` parallel workers taking ``service`` seconds per page, FIFO,
    answering 503 at once when ``queue`` requests already wait."""

    workers: int
    service: float
    queue: int = 16
    noise: float = 0.1
    rng: random.Random = field(default_factory=lambda: random.Random(1))
    _free_at: list[float] = field(default_factory=list)
    _waiting_starts: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._free_at = [0.0] * self.workers

    def submit(self, now: float) -> tuple[float, bool]:
        """Return when the answer arrives and whether it is a 503."""
        self._waiting_starts = [s for s in self._waiting_starts if s > now]
        if len(self._waiting_starts) >= self.queue:
            return now + 0.001, True
        start = max(now, heapq.heappop(self._free_at))
        service = self.service * self.rng.uniform(1 - self.noise, 1 + self.noise)
        heapq.heappush(self._free_at, start + service)
        if start > now:
            self._waiting_starts.append(start)
        return start + service, False


@dataclass
class CrawlResult:
    trace: list[tuple[float, float]]
    overloads: int
    pages: int

    def limits(self, start: float, end: float = math.inf) -> list[float]:
        return [limit for time, limit in self.trace if start <= time < end]


def crawl(
    limit: LatencyLimit,
    host: SimulatedHost,
    duration: float,
    *,
    turnaround: float = 0.002,
    service_at: Callable[[float], float] | None = None,
) -> CrawlResult:
    """A client that keeps ``limit.current()`` requests in flight; each
    answer frees its slot ``turnaround`` seconds later (the crawler's own
    processing time)."""
    events: list[tuple[float, int, str, float, bool]] = []
    sequence = 0
    in_flight = 0
    trace: list[tuple[float, float]] = []
    overloads = pages = 0

    def schedule(time: float, kind: str, sent: float = 0.0, over: bool = False) -> None:
        nonlocal sequence
        sequence += 1
        heapq.heappush(events, (time, sequence, kind, sent, over))

    def fill(now: float) -> None:
        nonlocal in_flight
        while in_flight < limit.current():
            in_flight += 1
            if service_at is not None:
                host.service = service_at(now)
            answer_at, over = host.submit(now)
            schedule(answer_at, "answer", now, over)

    fill(0.0)
    while events:
        now, _, kind, sent, over = heapq.heappop(events)
        if now > duration:
            break
        if kind == "answer":
            if over:
                overloads += 1
                limit.on_overload(now)
            else:
                pages += 1
                limit.on_response(now, now - sent, in_flight)
            trace.append((now, limit.limit))
            schedule(now + turnaround, "free")
        else:
            in_flight -= 1
            fill(now)
    return CrawlResult(trace, overloads, pages)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_large_host_settles_near_its_parallelism() -> None:
    limit = LatencyLimit(maximum=64, window=5.0)
    result = crawl(limit, SimulatedHost(workers=8, service=0.02), 10.0)
    settled = result.limits(3.0)
    assert result.overloads == 0
    assert 8 <= mean(settled) <= 12
    assert min(settled) >= 7
    assert max(settled) <= 15
    assert result.pages / 10.0 >= 0.9 * 400


def test_small_host_settles_near_its_parallelism() -> None:
    limit = LatencyLimit(maximum=64, window=5.0)
    result = crawl(limit, SimulatedHost(workers=2, service=0.05), 20.0)
    settled = result.limits(5.0)
    assert result.overloads == 0
    assert 2 <= mean(settled) <= 5
    assert max(settled) <= 6
    assert result.pages / 20.0 >= 0.9 * 40


def test_high_initial_limit_comes_down_after_503s() -> None:
    limit = LatencyLimit(initial=64, maximum=64, window=5.0)
    result = crawl(limit, SimulatedHost(workers=2, service=0.05), 10.0)
    assert result.overloads > 0
    assert limit.overload_count == result.overloads
    assert max(result.limits(3.0)) <= 6


def test_permanent_slowdown_becomes_the_baseline() -> None:
    window = 2.0
    limit = LatencyLimit(maximum=64, window=window)
    result = crawl(
        limit,
        SimulatedHost(workers=8, service=0.02),
        12.0,
        service_at=lambda now: 0.02 if now < 3.0 else 0.08,
    )
    assert mean(result.limits(2.0, 3.0)) >= 8
    # The old best makes every answer look slow for a while ...
    assert min(result.limits(3.0, 3.0 + 2 * window)) < 3
    # ... until it expires and the slower latency is the new normal.
    recovered = result.limits(3.0 + 3 * window)
    assert mean(recovered) >= 8
    assert limit.best is not None
    assert limit.best >= 0.08 * 0.9
    assert result.overloads == 0


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
            st.booleans(),
        ),
        max_size=60,
    ),
)
def test_limit_stays_within_bounds(
    minimum: int,
    maximum: int,
    initial: float,
    tolerance: float,
    events: list[tuple[float, float, int, bool]],
) -> None:
    limit = LatencyLimit(
        initial=initial, minimum=minimum, maximum=maximum, tolerance=tolerance
    )
    low, high = limit.minimum, limit.maximum
    assert 1 <= low <= high
    now = 0.0
    for step, latency, in_flight, overload in events:
        now += step
        if overload:
            limit.on_overload(now)
        else:
            limit.on_response(now, latency, in_flight)
        assert low <= limit.limit <= high
        assert low <= limit.current() <= high
