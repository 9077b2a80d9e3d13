"""The latency limit on noisy hosts: synthetic traces and a simulated host.

Issue 9: on a host whose service time varies (lognormal, bimodal, heavy
tailed), noise alone must never shrink the limit, and a queue must, within a
couple of rounds. Everything runs on a fake clock, seeded, in a few seconds.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_adaptive_throttle._algorithms import LatencyLimit
from tests.latency_host_model import (
    CrawlResult,
    NotesSlowdowns,
    SimulatedHost,
    bimodal,
    crawl,
    heavy_tailed,
    lognormal,
)

Draw = Callable[[random.Random, float], float]

MEDIAN = 0.02

#: Known gaps, pinned so that a fix shows (strict xfail): the baseline is the
#: median of about 32 early unloaded answers, whose standard error at sigma
#: 0.6-1.0 is 13-22%; a baseline that comes out 15-25% low makes noise read
#: as slow and holds the limit below what the host allows (these seeds: 0.84,
#: 0.75 and 0.92 of the unloaded median).
#: On the bimodal host a request queued behind a miss waits 16 hits: the
#: median at the settled limit is 1.55 x the unloaded one in this seed.
BIMODAL_QUEUE = pytest.mark.xfail(
    strict=True, reason="bimodal host: settled median 1.55 x the unloaded one"
)
LOW_BASELINE = pytest.mark.xfail(
    strict=True, reason="baseline from ~32 early answers came out 8-25% low"
)
DISTRIBUTIONS: dict[str, Draw] = {
    "lognormal-0.3": lognormal(0.3),
    "lognormal-0.6": lognormal(0.6),
    "lognormal-1.0": lognormal(1.0),
    # 70% at 5 ms, 30% at 80 ms (cache hits and misses).
    "bimodal": bimodal(0.005, 0.08, 0.7),
    # 5% of the answers 10-50 times the median.
    "heavy-tailed": heavy_tailed(0.05),
}


def unloaded_median(draw: Draw, service: float = MEDIAN) -> float:
    rng = random.Random(99)
    return statistics.median(draw(rng, service) for _ in range(20000))


class Rounds:
    """Drive a limit in rounds: ``current()`` requests in flight, each
    answered after ``latency_of(in_flight, rng)``; the next round starts when
    the last answer is in (a fluid host: no model of its queue beyond what
    ``latency_of`` says, and a crawler that refills every slot at once)."""

    def __init__(self, limit: LatencyLimit, seed: int = 1) -> None:
        self.limit = limit
        self.rng = random.Random(seed)
        self.now = 0.0
        self.limits: list[int] = []

    def run(
        self, rounds: int, latency_of: Callable[[int, random.Random], float]
    ) -> None:
        limit = self.limit
        for _ in range(rounds):
            count = limit.current()
            sent = self.now
            for _ in range(count):
                limit.on_sent(sent, count)
            answers = sorted(latency_of(count, self.rng) for _ in range(count))
            for latency in answers:
                # The crawler refills each slot at once: count in flight.
                limit.on_response(sent + latency, latency, count)
            self.now = sent + answers[-1] + 0.001
            self.limits.append(limit.current())


def noise_only(draw: Draw) -> Callable[[int, random.Random], float]:
    """A host with more workers than the limit can reach: no queue, ever."""
    return lambda _in_flight, rng: draw(rng, MEDIAN)


def queueing(
    draw: Draw, workers: Callable[[], int]
) -> Callable[[int, random.Random], float]:
    """Each request beyond the workers adds a service time / workers of wait
    (a fluid FIFO queue)."""

    def latency(in_flight: int, rng: random.Random) -> float:
        waiting = max(0, in_flight - workers())
        return draw(rng, MEDIAN) + waiting * MEDIAN / workers()

    return latency


# -- noise alone --------------------------------------------------------------


NOISE_CASES = [
    pytest.param(name, seed, marks=LOW_BASELINE)
    if (name, seed)
    in {("lognormal-0.6", 2), ("lognormal-1.0", 2), ("lognormal-1.0", 3)}
    else pytest.param(name, seed)
    for name in [*DISTRIBUTIONS, "constant"]
    for seed in (1, 2, 3)
]


@pytest.mark.parametrize(("name", "seed"), NOISE_CASES)
def test_noise_alone_never_shrinks_the_limit(name: str, seed: int) -> None:
    draw = DISTRIBUTIONS.get(name, lambda _rng, service: service)
    limit = LatencyLimit(maximum=64, window=30.0)
    driver = Rounds(limit, seed)
    driver.run(300, noise_only(draw))
    # No queue at all: the limit grows to its ceiling and stays there
    # (limit.limit: a probe round may be halving current() right now).
    assert limit.limit == 64
    assert limit.rebaseline_count == 0
    reached = driver.limits.index(64)
    # Once at the ceiling, noise moves it by a decrease at most, now and then
    # (probe rounds, which halve it for a few answers, aside).
    assert limit.decrease_count <= 3
    assert min(driver.limits[reached:]) >= 32


@pytest.mark.parametrize("name", list(DISTRIBUTIONS))
def test_the_baseline_is_the_unloaded_median(name: str) -> None:
    draw = DISTRIBUTIONS[name]
    limit = LatencyLimit(maximum=64, window=30.0)
    Rounds(limit).run(300, noise_only(draw))
    assert limit.best is not None
    assert limit.best == pytest.approx(unloaded_median(draw), rel=0.3)


# -- a queue --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=LOW_BASELINE) if name == "lognormal-1.0" else name
        for name in [*DISTRIBUTIONS, "constant"]
    ],
)
def test_a_growing_queue_shrinks_the_limit_within_a_couple_of_rounds(
    name: str,
) -> None:
    draw = DISTRIBUTIONS.get(name, lambda _rng, service: service)
    workers = [32]
    limit = LatencyLimit(maximum=24, window=30.0)
    driver = Rounds(limit)
    host = queueing(draw, lambda: workers[0])
    driver.run(200, host)
    assert driver.limits[-1] == 24
    before = limit.decrease_count
    # The host loses three quarters of its workers: 24 in flight now wait
    # two service times on average.
    workers[0] = 8
    driver.run(3, host)
    assert limit.decrease_count > before
    driver.run(200, host)
    # 12 in flight on 8 workers: 1.5 x the service time, the tolerance.
    assert statistics.median(driver.limits[-100:]) <= 12


# -- a simulated host (W workers, FIFO queue, crawler turnaround) --------------


HOST_CASES = [
    pytest.param(name, seed, turnaround, marks=BIMODAL_QUEUE)
    if (name, seed, turnaround) == ("bimodal", 2, 0.002)
    else pytest.param(name, seed, turnaround)
    for name in DISTRIBUTIONS
    for seed in (1, 2)
    for turnaround in (0.002, 0.008)
]


@pytest.mark.parametrize(("name", "seed", "turnaround"), HOST_CASES)
def test_noisy_host_settles_near_capacity_within_the_tolerance(
    name: str, seed: int, turnaround: float
) -> None:
    draw = DISTRIBUTIONS[name]
    host = SimulatedHost(workers=8, service=MEDIAN, draw=draw, rng=random.Random(seed))
    limit = LatencyLimit(maximum=32, window=30.0)
    result = crawl(limit, host, 12.0, turnaround)
    assert result.overloads == []
    assert result.rate(4.0, 12.0) >= 0.9 * host.capacity
    # The tolerance's promise: the median latency at the settled limit is
    # within 1.5 times the host's unloaded median.
    assert result.median_latency(4.0) <= 1.5 * unloaded_median(draw)
    # Enough in flight to cover the workers.
    assert statistics.mean(result.limits(4.0)) >= 8


#: Measured gaps after a cold start: on lognormal hosts the sign test of
#: LatencyLimit._supersede misses some seeds (baseline 1.16-1.26 x the
#: unloaded median, settled median 1.57-1.78 x); on the bimodal host at a
#: 2 ms turnaround the baseline is right (1.00-1.02 x) but the settled median
#: is 1.57 x, the bimodal queue of BIMODAL_QUEUE; one heavy-tailed seed
#: takes a tail for a slowdown (rebaseline_count 2) and its median is 1.92 x.
COLD_GAPS = {
    ("lognormal-0.3", 2, 0.008): "lognormal: baseline 1.16 x, median 1.57 x",
    ("lognormal-0.6", 1, 0.002): "lognormal: baseline 1.26 x, median 1.78 x",
    ("lognormal-1.0", 1, 0.002): "lognormal: baseline 0.96 x, median 1.52 x",
    ("lognormal-1.0", 1, 0.008): "lognormal: baseline 1.17 x, median 1.71 x",
    ("lognormal-1.0", 3, 0.002): "lognormal: baseline 1.07 x, median 1.66 x",
    ("lognormal-0.6", 3, 0.008): "lognormal: baseline 1.43 x",
    ("bimodal", 1, 0.002): "bimodal queue: baseline 1.00 x, median 1.57 x",
    ("bimodal", 2, 0.002): "bimodal queue: baseline 1.02 x, median 1.57 x",
}
COLD_START_CASES = [
    pytest.param(
        name,
        seed,
        turnaround,
        marks=pytest.mark.xfail(strict=True, reason=COLD_GAPS[name, seed, turnaround]),
    )
    if (name, seed, turnaround) in COLD_GAPS
    else pytest.param(name, seed, turnaround)
    for name in DISTRIBUTIONS
    for seed in (1, 2, 3)
    for turnaround in (0.002, 0.008)
]


@pytest.mark.parametrize(("name", "seed", "turnaround"), COLD_START_CASES)
def test_a_slow_first_quarter_second_does_not_stay_in_the_baseline(
    name: str, seed: int, turnaround: float
) -> None:
    # A crawl's first answers are slower than the host (new connections, a
    # crawler starting up): here twice the service time for the first
    # 0.25 s, all of slow start. Measured with Scrapy, the baseline stayed at
    # 2.1x and 1.8x the unloaded median on the bimodal and heavy-tailed hosts
    # (slow start's answers outlived the probe rounds), and so did the median
    # latency at the host. Without LatencyLimit._supersede 21 of these 30
    # cases fail; with it 9, and 8 (COLD_GAPS) once a probe checks each
    # suspected slowdown (heavy-tailed seed 3 had taken two queues as
    # slowdowns: median 1.92 x).
    draw = DISTRIBUTIONS[name]
    host = SimulatedHost(
        workers=8,
        service=MEDIAN,
        draw=draw,
        rng=random.Random(seed),
        service_at=lambda now: 2 * MEDIAN if now < 0.25 else MEDIAN,
    )
    limit = LatencyLimit(maximum=32, window=30.0)
    result = crawl(limit, host, 12.0, turnaround)
    # Slow start may overshoot while the host is slow (a 503 within the first
    # second in three seeds); none once it is not.
    assert all(when < 1.0 for when in result.overloads)
    assert limit.best is not None
    assert limit.best == pytest.approx(unloaded_median(draw), rel=0.3)
    assert result.rate(4.0, 12.0) >= 0.9 * host.capacity
    assert result.median_latency(4.0) <= 1.5 * unloaded_median(draw)


def _slowdown_and_recovery(seed: int) -> tuple[SimulatedHost, CrawlResult]:
    """A host four times slower from 3 to 6 s (8 x 20 ms, sigma 0.6)."""
    host = SimulatedHost(
        workers=8,
        service=MEDIAN,
        draw=lognormal(0.6),
        rng=random.Random(seed),
        service_at=lambda now: 0.08 if 3.0 <= now < 6.0 else MEDIAN,
    )
    limit = LatencyLimit(maximum=64, window=1.0)
    return host, crawl(limit, host, 9.0, 0.002)


def test_noisy_slowdown_and_recovery() -> None:
    # Twelve seeds: a round of ten answers at sigma 0.6 decides little, so
    # one seed's rate is luck. Before the flat rule allowed for the noise of
    # two rounds' medians, 6 of these 12 crawls never took the slowdown
    # (rates 0.58-0.85 of the reduced capacity, mean 0.81); now 11 do (mean
    # 0.95, min 0.88).
    during: list[float] = []
    for seed in range(1, 13):
        host, result = _slowdown_and_recovery(seed)
        full = host.capacity
        assert result.overloads == []
        during.append(result.rate(3.0, 6.0) / (full / 4))
        assert result.rate(6.5, 9.0) >= 0.9 * full
    assert statistics.mean(during) >= 0.9
    assert min(during) >= 0.85


@pytest.mark.xfail(
    strict=True,
    reason="the baseline rebuilt after the recovery from 2 s of answers: 1.73x",
)
def test_after_a_recovery_the_host_is_back_within_the_tolerance() -> None:
    # After the slowdown ends the baseline is rebuilt from the answers of
    # the last two windows (2 s here), sent while the limit grew back: it
    # comes out 1.1-1.4x the unloaded median, and the median at the host
    # from 7 s on 1.26-2.40x (mean 1.72x over the 12 seeds above; 1.56x when
    # half of them never took the slowdown and kept the old baseline). A
    # probe right after the speed-up is taken brought the mean to 1.51x
    # (1.15-1.82x); in this seed the baseline came back through the
    # window's expiry, not the speed-up rule, and drifted up to 1.4x.
    _host, result = _slowdown_and_recovery(1)
    assert result.median_latency(7.0) <= 1.5 * unloaded_median(lognormal(0.6))


def test_noisy_permanent_slowdown_becomes_the_baseline() -> None:
    draw = lognormal(0.6)
    host = SimulatedHost(
        workers=8,
        service=MEDIAN,
        draw=draw,
        service_at=lambda now: MEDIAN if now < 3.0 else 0.08,
    )
    limit = LatencyLimit(maximum=64, window=30.0)
    result = crawl(limit, host, 10.0, 0.002)
    assert limit.best is not None
    assert limit.best >= 0.7 * unloaded_median(draw, 0.08)
    assert result.rate(5.0, 10.0) >= 0.9 * host.capacity / 4
    assert result.overloads == []


#: A slowdown the limit reaches its floor of 1 before taking. The 2-worker
#: host at sigma 0.6 takes it 10-18 s after the change, one round of a dozen
#: answers at 2.5 answers a second after another; in this seed, not at all
#: within 25 s.
FLOOR_GAPS = {(2, 0.1, 0.6, 1): "2 workers, sigma 0.6: no new baseline within 25 s"}
FLOOR_CASES = [
    pytest.param(
        workers,
        service,
        sigma,
        seed,
        marks=pytest.mark.xfail(
            strict=True, reason=FLOOR_GAPS[workers, service, sigma, seed]
        ),
    )
    if (workers, service, sigma, seed) in FLOOR_GAPS
    else pytest.param(workers, service, sigma, seed)
    for workers, service, sigma in [
        (2, 0.1, 0.3),
        (2, 0.1, 0.6),
        (4, 0.05, 0.6),
        (8, 0.02, 0.6),
    ]
    for seed in range(1, 7)
]


@pytest.mark.parametrize(("workers", "service", "sigma", "seed"), FLOOR_CASES)
def test_a_slowdown_that_takes_the_limit_down_to_one_becomes_the_baseline(
    workers: int, service: float, sigma: float, seed: int
) -> None:
    # A host four times slower for good: lowering the limit, round after
    # round, brings it to 1 on the smaller hosts before three rounds in a
    # row came out flat. Rounds at one request in flight can go no lower, so
    # they count as they come. Without that, the limit stayed at 1 until
    # the old samples expired (two windows, 60 s): 0.37-0.59 of the slower
    # host's capacity on the 2-worker host, 0.20-0.28 on 4 of these 6 seeds
    # of the 4-worker one, 0.11-0.13 on 2 of the 8-worker one.
    host = SimulatedHost(
        workers=workers,
        service=service,
        draw=lognormal(sigma),
        rng=random.Random(seed),
        service_at=lambda now: service if now < 5.0 else 4 * service,
    )
    limit = NotesSlowdowns(maximum=32, window=30.0)
    result = crawl(limit, host, 30.0, 0.002)
    assert limit.slower_at is not None
    assert limit.slower_at - 5.0 <= 20.0
    assert result.rate(15.0, 30.0) >= 0.7 * host.capacity / 4
    assert result.overloads == []


#: Hosts whose speed never changes: 2 of these 72 had a draining queue come
#: out flat for three rounds in a row, by noise, and kept the slower baseline
#: it was taken for for the rest of the crawl (4 workers x 50 ms, sigma 0.3,
#: seed 1 at 1.9 s; 8 x 20 ms, sigma 1.0, seed 7 at 0.9 s: baseline 2.0x and
#: 2.2x the unloaded median, median latency 2.8x;
#: ``python -m tests.algorithms.host_model_sweep --slowdown``) until a probe
#: at half the limit checked each suspected slowdown.
STEADY_CASES = [
    (workers, service, sigma, seed)
    for workers, service in [(2, 0.1), (4, 0.05), (8, 0.02)]
    for sigma in (0.3, 0.6, 1.0)
    for seed in range(1, 9)
]


@pytest.mark.parametrize(("workers", "service", "sigma", "seed"), STEADY_CASES)
def test_a_host_that_keeps_its_speed_is_never_taken_as_slower(
    workers: int, service: float, sigma: float, seed: int
) -> None:
    # The slowdown rule's false alarm: three mostly slow rounds whose median
    # did not fall while the limit did. A queue the crawler causes drains
    # when the limit falls, so its rounds get faster; with noise, a round
    # of a dozen answers may not. Taken as the baseline, such a round holds
    # the host at a queue for two windows.
    host = SimulatedHost(
        workers=workers,
        service=service,
        draw=lognormal(sigma),
        rng=random.Random(seed),
    )
    limit = NotesSlowdowns(maximum=32, window=30.0)
    crawl(limit, host, 30.0, 0.002)
    assert limit.slower_at is None


# -- bounds ---------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    minimum=st.integers(min_value=0, max_value=5),
    maximum=st.integers(min_value=0, max_value=40),
    sigma=st.floats(min_value=0.0, max_value=2.0),
    seed=st.integers(min_value=0, max_value=1000),
    events=st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=0.2),
            st.integers(min_value=0, max_value=50),
            st.sampled_from(["sent", "response", "error", "overload"]),
        ),
        max_size=150,
    ),
)
def test_noisy_limit_stays_within_bounds(
    minimum: int,
    maximum: int,
    sigma: float,
    seed: int,
    events: list[tuple[float, int, str]],
) -> None:
    limit = LatencyLimit(minimum=minimum, maximum=maximum, window=0.5)
    low, high = limit.minimum, limit.maximum
    rng = random.Random(seed)
    now = 0.0
    for step, in_flight, kind in events:
        now += step
        latency = 0.02 * math.exp(rng.gauss(0.0, sigma))
        if kind == "sent":
            limit.on_sent(now, in_flight)
        elif kind == "overload":
            limit.on_overload(now)
        elif kind == "error":
            limit.on_error_response(now, latency)
        else:
            limit.on_response(now, latency, in_flight)
        assert low <= limit.limit <= high
        assert low <= limit.current() <= high


# -- a trace recorded with Scrapy ----------------------------------------------

TRACE = Path(__file__).parent / "data" / "small_host_slow_start_trace.json"


def test_a_small_host_queueing_after_slow_start_is_seen_within_two_rounds() -> None:
    """Host B (2 workers x 100 ms) as a Scrapy crawl saw it on a loaded
    machine: slow start to 7, a probe round at 3, back to 6. Slow start's
    loaded answers (0.2 s at 3 to 6 in flight) enter the baseline's pool and
    make its noise look like 40-50% of slow answers: rounds of 64 answers,
    32 slow ones per decrease. Then every answer takes 0.3 s, three times
    the baseline and slower than any answer of the pool: a queue of four at
    the host. The limit must come down within two rounds (12 answers).

    The recorded crawl held 6 at the end of the trace; it may be lower now
    (the trace's own 0.3 s answers are a queue too), but still above the
    host's two workers."""
    recorded = json.loads(TRACE.read_text())
    limit = LatencyLimit(**recorded["limit"])
    now = 0.0
    for name, now, *args in recorded["events"]:
        getattr(limit, name)(now, *args)
    assert limit.round_size == 64
    assert limit.current() >= 4
    decreases = limit.decrease_count
    now += 0.35
    for _ in range(12):
        now += 0.05
        limit.on_sent(now, 6)
        limit.on_response(now, 0.3, 6)
    assert limit.decrease_count > decreases


def test_a_late_crawler_measures_its_lateness_on_top_of_the_host() -> None:
    """The host model's ``lateness``: the crawler sees each answer an
    exponential delay (mean 3 ms, median 2.1 ms) after the host gave it, and
    the host's own latencies are recorded apart."""
    host = SimulatedHost(workers=8, service=MEDIAN, lateness=0.003)
    result = crawl(LatencyLimit(maximum=8, window=30.0), host, 2.0)
    seen = statistics.median(latency for _, latency in result.answers)
    at_host = host.median_host_latency(0.0)
    assert MEDIAN * 0.9 <= at_host <= MEDIAN * 1.1
    assert 0.001 <= seen - at_host <= 0.004
