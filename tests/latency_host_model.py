"""A simulated host and a fake-clock crawl loop, for the latency-limit tests.

The host is the guide's ("Adapting Crawl Rate to Host Latency"): ``workers``
parallel workers taking ``service`` seconds per page, FIFO, answering 503 at
once when ``queue`` requests already wait. The crawl loop keeps as many
requests in flight as the client allows; each answer frees its slot
``turnaround`` seconds later (the crawler's own processing time, which is what
makes a small queue at the host necessary to reach its capacity), and the
client may hold sends back (a pause after a 503).

Everything runs on a fake clock, in microseconds of real time.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from scrapy_adaptive_throttle._algorithms import LatencyLimit

__all__ = [
    "Client",
    "CrawlResult",
    "SimulatedHost",
    "bimodal",
    "heavy_tailed",
    "lognormal",
    "mean",
    "simulate",
]


def lognormal(sigma: float) -> Callable[[random.Random, float], float]:
    """Service times lognormal around the base (its median), shape *sigma*."""

    def draw(rng: random.Random, service: float) -> float:
        return service * math.exp(rng.gauss(0.0, sigma))

    return draw


def bimodal(
    fast: float, slow: float, fast_share: float
) -> Callable[[random.Random, float], float]:
    """Cache hits and misses: *fast* or *slow* seconds (x the base / 0.02,
    so that ``service=0.02`` gives them as given), +-10%."""

    def draw(rng: random.Random, service: float) -> float:
        value = fast if rng.random() < fast_share else slow
        return value * service / 0.02 * rng.uniform(0.9, 1.1)

    return draw


def heavy_tailed(
    share: float, low: float = 10.0, high: float = 50.0
) -> Callable[[random.Random, float], float]:
    """A *share* of answers *low* to *high* times the base, the rest +-10%."""

    def draw(rng: random.Random, service: float) -> float:
        if rng.random() < share:
            return service * rng.uniform(low, high)
        return service * rng.uniform(0.9, 1.1)

    return draw


@dataclass
class SimulatedHost:
    """``workers`` x ``service`` seconds, a FIFO queue of ``queue`` requests.

    ``service_at(now)``, if given, changes the service time of requests
    starting service at ``now`` (a slowdown). ``draw(rng, service)``, if
    given, draws one request's service time around the base ``service``
    (a noisy host: see :func:`lognormal`, :func:`bimodal`,
    :func:`heavy_tailed`); without it, the service time is spread uniformly
    by ``noise`` around the base.

    ``lateness`` (seconds, 0: none) is the mean of an exponential delay
    before the crawler sees each answer: its event loop was busy, so the
    latency it measures (and the moment it frees the slot) comes later than
    the host's answer, as Scrapy's ``download_latency`` does on a loaded
    machine. ``host_latencies`` records ``(answered at, latency at the
    host)`` of every normal answer, what the host itself would measure.
    """

    workers: int
    service: float
    queue: int = 16
    noise: float = 0.1
    service_at: Callable[[float], float] | None = None
    draw: Callable[[random.Random, float], float] | None = None
    rng: random.Random = field(default_factory=lambda: random.Random(1))
    lateness: float = 0.0
    lateness_rng: random.Random = field(default_factory=lambda: random.Random(7))
    host_latencies: list[tuple[float, float]] = field(default_factory=list)
    _free_at: list[float] = field(default_factory=list)
    _waiting_starts: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._free_at = [0.0] * self.workers

    @property
    def capacity(self) -> float:
        """Pages per second with every worker busy (at the mean service time)."""
        return self.workers / self.mean_service()

    def mean_service(self, samples: int = 20000) -> float:
        """The mean service time (estimated with a separate seeded draw)."""
        if self.draw is None:
            return self.service
        rng = random.Random(12345)
        return sum(self.draw(rng, self.service) for _ in range(samples)) / samples

    def submit(self, now: float) -> tuple[float, bool]:
        """Return when the answer arrives and whether it is a 503."""
        self._waiting_starts = [s for s in self._waiting_starts if s > now]
        if len(self._waiting_starts) >= self.queue:
            return now + 0.001, True
        start = max(now, heapq.heappop(self._free_at))
        base = self.service_at(start) if self.service_at is not None else self.service
        if self.draw is not None:
            service = self.draw(self.rng, base)
        else:
            service = base * self.rng.uniform(1 - self.noise, 1 + self.noise)
        heapq.heappush(self._free_at, start + service)
        if start > now:
            self._waiting_starts.append(start)
        answered = start + service
        self.host_latencies.append((answered, answered - now))
        if self.lateness > 0:
            answered += self.lateness_rng.expovariate(1 / self.lateness)
        return answered, False

    def median_host_latency(self, start: float) -> float:
        """The median latency at the host of the answers from *start* on."""
        latencies = sorted(lat for at, lat in self.host_latencies if at >= start)
        return latencies[len(latencies) // 2]


class Client(Protocol):
    """What the crawl loop needs from the throttling under test."""

    def limit(self) -> int:
        """Requests allowed in flight now."""

    def wait(self, now: float) -> float:
        """Seconds before the next send is allowed (0: now)."""

    def sent(self, now: float) -> None:
        """A request was sent."""

    def answered(self, now: float, latency: float, overloaded: bool) -> None:
        """An answer arrived (its slot is still taken)."""

    def freed(self, now: float) -> None:
        """The slot of an answered request is free again."""


@dataclass
class CrawlResult:
    """What a simulated crawl did: ``trace`` is ``(time, fractional limit)``
    after each answer, ``answers`` is ``(time, latency)`` per page."""

    trace: list[tuple[float, float]]
    answers: list[tuple[float, float]]
    overloads: list[float]
    sends: list[float]

    @property
    def pages(self) -> int:
        return len(self.answers)

    def limits(self, start: float, end: float = math.inf) -> list[float]:
        return [limit for time, limit in self.trace if start <= time < end]

    def rate(self, start: float, end: float) -> float:
        """Pages per second answered in ``[start, end)``."""
        count = sum(1 for time, _ in self.answers if start <= time < end)
        return count / (end - start)

    def median_latency(self, start: float, end: float = math.inf) -> float:
        latencies = sorted(lat for time, lat in self.answers if start <= time < end)
        return latencies[len(latencies) // 2]


def simulate(
    client: Client,
    host: SimulatedHost,
    duration: float,
    *,
    turnaround: float = 0.002,
    limit_of: Callable[[], float] | None = None,
) -> CrawlResult:
    """Crawl ``host`` for ``duration`` seconds of fake time with ``client``.

    ``limit_of`` returns the fractional limit recorded in the trace (the
    whole-number limit by default).
    """
    events: list[tuple[float, int, str, float, bool]] = []
    sequence = 0
    in_flight = 0
    result = CrawlResult([], [], [], [])
    read_limit = limit_of or (lambda: float(client.limit()))
    wake_at = math.inf

    def schedule(time: float, kind: str, sent: float = 0.0, over: bool = False) -> None:
        nonlocal sequence
        sequence += 1
        heapq.heappush(events, (time, sequence, kind, sent, over))

    def fill(now: float) -> None:
        nonlocal in_flight, wake_at
        while in_flight < client.limit():
            wait = client.wait(now)
            if wait > 0:
                if now + wait < wake_at:
                    wake_at = now + wait
                    schedule(wake_at, "wake")
                return
            in_flight += 1
            client.sent(now)
            result.sends.append(now)
            answer_at, over = host.submit(now)
            schedule(answer_at, "answer", now, over)

    fill(0.0)
    while events:
        now, _, kind, sent, over = heapq.heappop(events)
        if now > duration:
            break
        if kind == "answer":
            client.answered(now, now - sent, over)
            if over:
                result.overloads.append(now)
            else:
                result.answers.append((now, now - sent))
            result.trace.append((now, read_limit()))
            schedule(now + turnaround, "free")
        elif kind == "free":
            in_flight -= 1
            client.freed(now)
            fill(now)
        else:
            if now >= wake_at:
                wake_at = math.inf
            fill(now)
    return result


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


class LimitClient:
    """Drive a bare :class:`LatencyLimit` (no pause after a 503)."""

    def __init__(self, limit: LatencyLimit) -> None:
        self.latency_limit = limit
        self.in_flight = 0

    def limit(self) -> int:
        return self.latency_limit.current()

    def wait(self, now: float) -> float:
        return 0.0

    def sent(self, now: float) -> None:
        self.in_flight += 1
        self.latency_limit.on_sent(now, self.in_flight)

    def answered(self, now: float, latency: float, overloaded: bool) -> None:
        if overloaded:
            self.latency_limit.on_overload(now)
        else:
            self.latency_limit.on_response(now, latency, self.in_flight)

    def freed(self, now: float) -> None:
        self.in_flight -= 1


def crawl(
    limit: LatencyLimit,
    host: SimulatedHost,
    duration: float,
    turnaround: float = 0.002,
) -> CrawlResult:
    """Crawl *host* with a bare *limit*, tracing its fractional value."""
    return simulate(
        LimitClient(limit),
        host,
        duration,
        turnaround=turnaround,
        limit_of=lambda: limit.limit,
    )


class NotesSlowdowns(LatencyLimit):
    """A limit that notes when it first takes a slowdown as its baseline
    (``slower_at``; None: never)."""

    __slots__ = ("slower_at",)

    def __init__(self, **kwargs: float) -> None:
        super().__init__(**kwargs)
        self.slower_at: float | None = None

    def _rebaseline(
        self,
        now: float,
        baseline: float,
        latencies: list[float],
        *,
        slower: bool = False,
    ) -> None:
        if slower and self.slower_at is None:
            self.slower_at = now
        super()._rebaseline(now, baseline, latencies, slower=slower)
