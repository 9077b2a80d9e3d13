"""The latency limit on the host model, over many cases: a sweep, not a test.

``python -m tests.algorithms.host_model_sweep [--lateness] [--fixed | --slowdown]``

Six kinds of service time x two hosts (8 workers x 20 ms, 2 workers x
100 ms) x four seeds x two crawler turnarounds (2 and 8 ms) x a cold start
(the first 0.25 s twice as slow) or not: 192 crawls of 12 s on a fake clock,
each measured from 4 s on. Prints, per kind and host, the rate as a share of
the host's capacity and the median latency as a multiple of the unloaded
median, then every case that misses 0.9 of capacity or a median within 1.5x
(the figures of issue 9), so that a change of the limit can be compared case
by case (``diff`` the output of two revisions).

``--lateness`` runs the same cases with a crawler that sees each answer
late (an exponential delay of 1 or 3 ms on average, in place of the two
turnarounds; see :class:`~tests.latency_host_model.SimulatedHost`) and the
plugin's 5 ms resolution, and measures the median latency at the host, as
the benchmarks' ``srv p50`` does. Without lateness the model holds the
8-worker bimodal host's median at 1.44x its unloaded one (mean of its 16
cases); with it at 2.35x, past the tolerance as real crawls are (1.84-2.83x
in bench/RESULTS.md).

``--slowdown`` runs 2, 4 and 8 workers (100, 50 and 20 ms) at sigma 0.3,
0.6 and 1.0, eight seeds each, for 30 s: once with the host four times
slower from 5 s on, printing per host how many crawls took the slowdown
as the baseline, how long after the change, and the rate from 15 to 30 s
over the slower capacity; once with a host that never changes, printing
every crawl that took a slowdown all the same (a false alarm), with its
baseline and median latency from 15 to 30 s over the unloaded median.

``--fixed`` prints instead what a fixed limit of 8 to 20 reaches on the
8-worker host (no 503 queue limit) at turnarounds of 2, 8 and 15 ms: the
rate as a share of capacity and the median latency as a multiple of the
unloaded median, from 2 s on, so that the figures of issue 9 can be checked
for reachability at a given turnaround; ``--fixed --lateness`` at a
turnaround of 2 ms and a lateness of 0, 1 and 3 ms, with the median at the
host.
"""

from __future__ import annotations

import random
import statistics
import sys
from collections.abc import Callable

from scrapy_adaptive_throttle._algorithms import LatencyLimit
from scrapy_adaptive_throttle._latency_scope_manager import LATENCY_RESOLUTION
from tests.latency_host_model import (
    NotesSlowdowns,
    SimulatedHost,
    bimodal,
    crawl,
    heavy_tailed,
    lognormal,
    simulate,
)

KINDS = {
    "constant": lambda _rng, service: service,
    "lognormal-0.3": lognormal(0.3),
    "lognormal-0.6": lognormal(0.6),
    "lognormal-1.0": lognormal(1.0),
    "bimodal": bimodal(0.005, 0.08, 0.7),
    "heavy-tailed": heavy_tailed(0.05),
}


def unloaded_median(
    draw: Callable[[random.Random, float], float], service: float
) -> float:
    rng = random.Random(99)
    return statistics.median(draw(rng, service) for _ in range(20000))


def main(*, late: bool = False) -> None:
    rates: list[float] = []
    misses: list[str] = []
    # (turnaround, mean lateness) of each case.
    crawlers = (
        ((0.002, 0.001), (0.002, 0.003)) if late else ((0.002, 0.0), (0.008, 0.0))
    )
    for name, draw in KINDS.items():
        for workers, service in ((8, 0.02), (2, 0.1)):
            unloaded = unloaded_median(draw, service)
            host_rates: list[float] = []
            medians: list[float] = []
            for seed in (1, 2, 3, 4):
                for turnaround, lateness in crawlers:
                    for cold in (False, True):
                        host = SimulatedHost(
                            workers=workers,
                            service=service,
                            draw=draw,
                            rng=random.Random(seed),
                            service_at=(
                                (lambda now, s=service: 2 * s if now < 0.25 else s)
                                if cold
                                else (lambda _now, s=service: s)
                            ),
                            lateness=lateness,
                        )
                        limit = LatencyLimit(
                            maximum=32,
                            window=30.0,
                            resolution=LATENCY_RESOLUTION if late else 0.0,
                        )
                        result = crawl(limit, host, 12.0, turnaround)
                        rate = result.rate(4.0, 12.0) / host.capacity
                        median = (
                            host.median_host_latency(4.0)
                            if late
                            else result.median_latency(4.0)
                        ) / unloaded
                        host_rates.append(rate)
                        medians.append(median)
                        if rate < 0.9 or median > 1.5:
                            misses.append(
                                f"{name} {workers}x{service} seed {seed} turnaround"
                                f" {turnaround} lateness {lateness} cold {cold}:"
                                f" rate {rate:.3f}, median {median:.2f}x"
                            )
            print(
                f"{name:14} {workers}x{service}: rate mean"
                f" {statistics.mean(host_rates):.3f} min {min(host_rates):.3f};"
                f" median/unloaded mean {statistics.mean(medians):.2f}"
                f" max {max(medians):.2f}"
            )
            rates.extend(host_rates)
    print(f"mean rate {statistics.mean(rates):.3f}; {len(misses)} of {len(rates)} miss")
    for line in misses:
        print("miss:", line)


def slowdowns() -> None:
    false_alarms: list[str] = []
    steady_runs = 0
    for workers, service in ((2, 0.1), (4, 0.05), (8, 0.02)):
        for sigma in (0.3, 0.6, 1.0):
            draw = lognormal(sigma)
            unloaded = unloaded_median(draw, service)
            delays: list[float] = []
            rates: list[float] = []
            for seed in range(1, 9):
                for change in (True, False):
                    host = SimulatedHost(
                        workers=workers,
                        service=service,
                        draw=draw,
                        rng=random.Random(seed),
                        service_at=(
                            (lambda now, s=service: s if now < 5.0 else 4 * s)
                            if change
                            else (lambda _now, s=service: s)
                        ),
                    )
                    limit = NotesSlowdowns(maximum=32, window=30.0)
                    result = crawl(limit, host, 30.0, 0.002)
                    slower_at = limit.slower_at
                    if change:
                        if slower_at is not None and slower_at >= 5.0:
                            delays.append(slower_at - 5.0)
                        rates.append(result.rate(15.0, 30.0) / (host.capacity / 4))
                        continue
                    steady_runs += 1
                    if slower_at is not None:
                        assert limit.best is not None
                        false_alarms.append(
                            f"{workers}x{service} sigma {sigma} seed {seed} at"
                            f" {slower_at:.2f} s: baseline"
                            f" {limit.best / unloaded:.2f}x, median from 15 s"
                            f" {result.median_latency(15.0) / unloaded:.2f}x"
                        )
            taken = (
                f"median {statistics.median(delays):.1f} s, max {max(delays):.1f} s"
                if delays
                else "never"
            )
            print(
                f"{workers}x{service} sigma {sigma}: slowdown taken in"
                f" {len(delays)} of 8 ({taken} after it); rate from 15 s mean"
                f" {statistics.mean(rates):.2f} min {min(rates):.2f}"
            )
    print(f"false alarms: {len(false_alarms)} of {steady_runs} steady hosts")
    for line in false_alarms:
        print("false alarm:", line)


class FixedLimit:
    """A client that keeps *limit* requests in flight."""

    def __init__(self, limit: int) -> None:
        self._limit = limit

    def limit(self) -> int:
        return self._limit

    def wait(self, now: float) -> float:
        return 0.0

    def sent(self, now: float) -> None:
        pass

    def answered(self, now: float, latency: float, overloaded: bool) -> None:
        pass

    def freed(self, now: float) -> None:
        pass


def fixed_limits(*, late: bool = False) -> None:
    # (turnaround, mean lateness) of each row; with lateness, the median is
    # the host's.
    crawlers = (
        ((0.002, 0.0), (0.002, 0.001), (0.002, 0.003))
        if late
        else ((0.002, 0.0), (0.008, 0.0), (0.015, 0.0))
    )
    for name in ("lognormal-0.3", "lognormal-1.0", "bimodal"):
        draw = KINDS[name]
        unloaded = unloaded_median(draw, 0.02)
        for turnaround, lateness in crawlers:
            cells = []
            for limit in (8, 9, 10, 11, 12, 14, 16, 20):
                host = SimulatedHost(
                    workers=8,
                    service=0.02,
                    draw=draw,
                    rng=random.Random(1),
                    queue=10**6,
                    lateness=lateness,
                )
                result = simulate(FixedLimit(limit), host, 12.0, turnaround=turnaround)
                rate = result.rate(2.0, 12.0) / host.capacity
                median = (
                    host.median_host_latency(2.0)
                    if late
                    else result.median_latency(2.0)
                ) / unloaded
                cells.append(f"{limit}: {rate:.2f}/{median:.2f}x")
            print(
                f"{name:14} turnaround {turnaround * 1000:2.0f} ms"
                + (f" lateness {lateness * 1000:.0f} ms" if late else "")
                + "  "
                + "  ".join(cells)
            )


if __name__ == "__main__":
    late = "--lateness" in sys.argv[1:]
    if "--slowdown" in sys.argv[1:]:
        slowdowns()
    elif "--fixed" in sys.argv[1:]:
        fixed_limits(late=late)
    else:
        main(late=late)
