"""Slow start must stop when the host starts to queue (issue 9): a pin.

On an 8-worker host with a 16-deep queue (503 when full), slow start's
doublings put 16 to 24 requests at the host before the first queued answers
come back: at the edge of the host's 24 places on the host model, and past
it in real crawls, where the crawler's clock noise keeps those answers
inside the threshold (``tests/test_latency_crawl.py`` raised host A's queue
to 40 for that). The peak is counted at the host (requests sent and not yet
answered, at each send made during slow start), not with the limit's own
numbers.

Bounds: on a constant host at most 2 x workers (a queue as long as the
host's parallelism); on noisy hosts at most 2.5 x workers (20 of the 24
places, 4 left for the crawler's clock noise), where a queued request with
a short service time reads as unqueued. Measured with the code of this
commit: 16-24 on the constant host, up to 24 on lognormal ones; the cases
over the bound are strict xfails (``OVERSHOOT``), so that a fix shows.

A fix tried and not kept: a ceiling on slow start at 1.4x the median
in-flight level of 4 answers whose median latency lay in the lower quarter
of the tolerance band. It met
both bounds on all 90 cases (11-15 and at most 19), but by slowing slow
start it let noise end it early (bimodal hosts at 2-5 instead of 10-13) and
broke 29 existing tests (exact doubling, noise-only traces reaching 64,
slowdown traces); the host-model sweep went from 0.949 / 95 misses to
0.956 / 96.

Narrower fixes tried next and not kept (issue 9, cause a: the queued answer
joins the pool, and the host reads as noisy, before the answer is judged;
cause b: doubling's one-round lag):

* Judging each answer on the pool's ``steady`` as it was before the answer:
  10 constant-host pins pass (8 and 15 ms turnarounds; peaks 10-15), but the
  first miss of a bimodal host then ends slow start as a queue (pool share
  0.22 -> 0.37, rounds of 61 answers), failing two bimodal cases of
  ``test_noisy_host_settles_near_capacity_within_the_tolerance`` (median
  1.54-1.63 x); sweep 0.949 / 104 misses.
* The same once the pool holds 16 answers (fewer: the answer counts as
  noise; 12 and 20 give the same sweep): every existing test passes and the
  same 10 pins pass, but the sweep goes to 0.949 / 102: the 8 cases of the
  constant 8 x 20 ms host at an 8 ms turnaround settle at a median of 1.60 x
  instead of 1.40 x. Both settle on the same limit (about 13.6, a slow round
  every 0.36-0.38 s); the host is deterministic and the median lands on its
  1.6 x latency step instead of 1.4 x, but the sweep's figure got worse.
* Counting, during slow start, the upper-half answers to requests sent
  before the round's mark towards the noisy-host rule (the other half of
  cause a): 15 pins pass (all but the 5 constant ones at a 2 ms
  turnaround), but the same two bimodal cases and
  ``test_noisy_slowdown_and_recovery`` fail; sweep 0.949 / 103.
* Cause b, a ceiling on slow start's growth at 1.5-2 x the in-flight level
  each answer was sent at: all constant cases within 2 x workers at 1.5-1.6
  x, but 7 to 24 existing tests fail (exact doubling, noise-only traces,
  slowdown traces, the scope manager's logged limits). At 2 x the answers of
  the last baseline latency (plus 0-3): the sweep has 102-108 misses, and
  at plus 0 bimodal hosts end slow start at 2 in flight (the tests were not
  run on it).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable

import pytest

from scrapy_adaptive_throttle._algorithms import LatencyLimit
from tests.latency_host_model import (
    LimitClient,
    SimulatedHost,
    bimodal,
    heavy_tailed,
    lognormal,
    simulate,
)

Draw = Callable[[random.Random, float], float]

WORKERS = 8
QUEUE = 16
KINDS: dict[str, Draw | None] = {
    "constant": None,
    "lognormal-0.6": lognormal(0.6),
    "lognormal-1.0": lognormal(1.0),
    # 70% at 5 ms, 30% at 80 ms (x the base / 20 ms).
    "bimodal": bimodal(0.005, 0.08, 0.7),
    # 5% of the answers 10-50 times the median.
    "heavy-tailed": heavy_tailed(0.05),
}


def count_at_host(
    host: SimulatedHost, counting: Callable[[], bool]
) -> Callable[[], int]:
    """Count the requests at *host* (sent, not yet answered) at each send
    made while *counting* says so; return a reader of the peak."""
    at_host: list[float] = []
    peak = 0
    submit = host.submit

    def counted_submit(now: float) -> tuple[float, bool]:
        nonlocal peak
        answer_at, overloaded = submit(now)
        while at_host and at_host[0] <= now:
            heapq.heappop(at_host)
        if not overloaded:
            heapq.heappush(at_host, answer_at)
        if counting():
            peak = max(peak, len(at_host))
        return answer_at, overloaded

    host.submit = counted_submit  # type: ignore[method-assign]
    return lambda: peak


def slow_start_peak(
    draw: Draw | None, service: float, turnaround: float, seed: int
) -> tuple[int, int, float, bool]:
    """Crawl the host for 3 s: the peak at the host during slow start, the
    503s, the rate from 1 s on as a share of capacity, and whether slow
    start ended."""
    host = SimulatedHost(
        workers=WORKERS,
        service=service,
        queue=QUEUE,
        draw=draw,
        rng=random.Random(seed),
    )
    limit = LatencyLimit(maximum=32, window=30.0)
    peak = count_at_host(host, lambda: limit.in_slow_start)
    result = simulate(
        LimitClient(limit),
        host,
        3.0,
        turnaround=turnaround,
        limit_of=lambda: limit.limit,
    )
    rate = result.rate(1.0, 3.0) / host.capacity
    return peak(), len(result.overloads), rate, not limit.in_slow_start


#: The cases over the bound with the code of this commit (kind, service,
#: turnaround, seed).
OVERSHOOT = {
    *(
        ("constant", 0.02, turnaround, seed)
        for turnaround, seed in (
            (0.002, 1),
            (0.002, 2),
            (0.008, 1),
            (0.008, 2),
            (0.008, 3),
            (0.015, 1),
            (0.015, 3),
        )
    ),
    *(
        ("constant", 0.04, turnaround, seed)
        for turnaround in (0.002, 0.008, 0.015)
        for seed in (1, 2, 3)
        if (turnaround, seed) != (0.008, 1)
    ),
    ("lognormal-0.6", 0.02, 0.002, 3),
    ("lognormal-0.6", 0.04, 0.002, 3),
    ("lognormal-0.6", 0.04, 0.008, 3),
    ("lognormal-0.6", 0.04, 0.015, 3),
    ("lognormal-1.0", 0.02, 0.015, 3),
}
PINNED = pytest.mark.xfail(
    strict=True, reason="slow start overshoots the host before a queue shows"
)
CASES = [
    pytest.param(
        *case,
        marks=[PINNED] if case in OVERSHOOT else [],
        id="-".join(str(value) for value in case),
    )
    for case in (
        (kind, service, turnaround, seed)
        for kind in KINDS
        for service in (0.02, 0.04)
        for turnaround in (0.002, 0.008, 0.015)
        for seed in (1, 2, 3)
    )
]


@pytest.mark.parametrize(("kind", "service", "turnaround", "seed"), CASES)
def test_slow_start_stops_before_the_host_queue_fills(
    kind: str, service: float, turnaround: float, seed: int
) -> None:
    peak, overloads, rate, ended = slow_start_peak(
        KINDS[kind], service, turnaround, seed
    )
    assert overloads == 0
    bound = 2 * WORKERS if kind == "constant" else 2.5 * WORKERS
    assert peak <= bound, f"{peak} at the host during slow start"
    assert ended
    if kind == "constant":
        assert rate >= 0.9


def test_the_peak_is_counted_at_the_host() -> None:
    """The measure itself: a client that keeps 24 in flight fills the
    host's 8 workers and 16 places in its queue, and the count says so."""
    host = SimulatedHost(workers=WORKERS, service=0.02, queue=QUEUE)
    peak = count_at_host(host, lambda: True)

    class Greedy(LimitClient):
        def limit(self) -> int:
            return 24

    simulate(Greedy(LatencyLimit()), host, 0.5, turnaround=0.002)
    assert peak() == WORKERS + QUEUE
