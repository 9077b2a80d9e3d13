"""Traffic per scope (responses and latency percentiles) and the timeline file.

Scope managers keep what they need to decide (the baseline latency), not
what a person needs to judge a crawl (how latency was distributed, how many
pages each scope served). :class:`ScopeTraffic` records that, cheaply enough
for 100 000 scopes: a response costs a dict update, and a latency histogram
has one entry per occupied bucket (a quarter of an octave wide, so a
percentile is within 10 % of the exact value).

:class:`TimelineWriter` writes, every :setting:`THROTTLING_TIMELINE_INTERVAL`
seconds, one JSON line per busy scope (see :ref:`observability`), which
``python -m scrapy_adaptive_throttle.plot`` draws.
"""

from __future__ import annotations

import heapq
import json
import math
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from ._types import ScopeID

__all__ = ["LatencyHistogram", "ScopeTraffic", "TimelineWriter"]

#: Buckets per doubling of latency.
_BUCKETS_PER_OCTAVE = 4
#: The lower bound of bucket 0, in seconds; faster answers count there.
_SMALLEST = 0.0005
_LOG_STEP = math.log(2) / _BUCKETS_PER_OCTAVE


def _bucket(latency: float) -> int:
    if latency <= _SMALLEST:
        return 0
    return int(math.log(latency / _SMALLEST) / _LOG_STEP)


def _bucket_value(bucket: int) -> float:
    # The geometric middle of the bucket.
    return _SMALLEST * math.exp((bucket + 0.5) * _LOG_STEP)


class LatencyHistogram:
    """Latency samples in logarithmic buckets (sparse: a dict)."""

    __slots__ = ("buckets", "count")

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}
        self.count = 0

    def add(self, latency: float) -> None:
        bucket = _bucket(latency)
        buckets = self.buckets
        buckets[bucket] = buckets.get(bucket, 0) + 1
        self.count += 1

    def percentiles(self, *shares: float) -> list[float | None]:
        """The latency below which each share (0-1) of samples fell."""
        if not self.count:
            return [None for _ in shares]
        ordered = sorted(self.buckets.items())
        results: list[float | None] = []
        for share in shares:
            rank = share * self.count
            seen = 0
            value = _bucket_value(ordered[-1][0])
            for bucket, count in ordered:
                seen += count
                if seen >= rank:
                    value = _bucket_value(bucket)
                    break
            results.append(value)
        return results


class ScopeTraffic:
    """Responses and latencies of every scope, since the start and since the
    last :meth:`take_interval`."""

    def __init__(self, *, track_interval: bool = False) -> None:
        self.responses: dict[ScopeID, int] = {}
        self.latencies: dict[ScopeID, LatencyHistogram] = {}
        self.track_interval = track_interval
        self.interval_responses: dict[ScopeID, int] = {}
        self.interval_latencies: dict[ScopeID, LatencyHistogram] = {}

    def record(self, scopes: Iterable[ScopeID], latency: float | None) -> None:
        """Count one response of *scopes* that took *latency* seconds."""
        responses = self.responses
        for scope in scopes:
            responses[scope] = responses.get(scope, 0) + 1
            if latency is not None:
                histogram = self.latencies.get(scope)
                if histogram is None:
                    histogram = self.latencies[scope] = LatencyHistogram()
                histogram.add(latency)
            if self.track_interval:
                interval = self.interval_responses
                interval[scope] = interval.get(scope, 0) + 1
                if latency is not None:
                    histogram = self.interval_latencies.get(scope)
                    if histogram is None:
                        histogram = self.interval_latencies[scope] = LatencyHistogram()
                    histogram.add(latency)

    def take_interval(
        self,
    ) -> tuple[dict[ScopeID, int], dict[ScopeID, LatencyHistogram]]:
        """The interval's responses and latencies; a new interval starts."""
        taken = (self.interval_responses, self.interval_latencies)
        self.interval_responses = {}
        self.interval_latencies = {}
        return taken

    def top(self, count: int) -> list[ScopeID]:
        """The *count* scopes with the most responses since the start."""
        return heapq.nlargest(count, self.responses, key=self.responses.__getitem__)

    def prune(self, keep: Iterable[ScopeID], top: int) -> None:
        """Forget every scope but *keep* and the *top* busiest (bounded memory
        when scopes come and go by the hundred thousand)."""
        kept = set(keep)
        kept.update(self.top(top))
        self.responses = {s: n for s, n in self.responses.items() if s in kept}
        self.latencies = {s: h for s, h in self.latencies.items() if s in kept}


#: Fields of a scope's state copied into its timeline line (when present).
_STATE_FIELDS = (
    "limit",
    "floor",
    "ceiling",
    "in_flight",
    "delay",
    "backoff_level",
    "backoff_wait",
    "best_latency",
    "waiting",
)


class TimelineWriter:
    """Write sampled per-scope state as JSON lines to *stream*.

    Each :meth:`sample` picks the *scopes* busiest scopes (most responses in
    the interval; the scopes of the previous sample compete too, so a line
    does not vanish from a chart the moment a host pauses) and writes one
    line per scope.
    """

    def __init__(self, stream: IO[str], scopes: int) -> None:
        self.stream = stream
        self.scopes = scopes
        self._previous: list[ScopeID] = []

    def sample(
        self,
        elapsed: float,
        interval: float,
        traffic: ScopeTraffic,
        states: Callable[[ScopeID], dict[str, Any] | None],
    ) -> list[ScopeID]:
        """Write one sample; return the scopes written.

        :param elapsed: seconds since the crawl started.
        :param interval: seconds since the previous sample.
        :param states: ``scope -> state`` (``None``: the scope is gone), a
            scope manager's ``get_state()`` plus ``"waiting"``, the reason
            the scope holds requests back (see :func:`explain`).
        """
        responses, latencies = traffic.take_interval()
        candidates = set(responses) | set(self._previous)
        total = traffic.responses
        chosen = heapq.nlargest(
            self.scopes,
            candidates,
            key=lambda scope: (responses.get(scope, 0), total.get(scope, 0)),
        )
        lines = []
        written = []
        for scope in chosen:
            state = states(scope)
            if state is None:
                continue
            count = responses.get(scope, 0)
            histogram = latencies.get(scope)
            p50, p90, p99 = (
                histogram.percentiles(0.5, 0.9, 0.99)
                if histogram is not None
                else (None, None, None)
            )
            line: dict[str, Any] = {
                "time": round(elapsed, 3),
                "scope": scope,
                "responses": count,
                "pages_per_second": round(count / interval, 3) if interval else None,
                "latency_p50": _round(p50),
                "latency_p90": _round(p90),
                "latency_p99": _round(p99),
            }
            for name in _STATE_FIELDS:
                if name in state:
                    value = state[name]
                    line[name] = _round(value) if isinstance(value, float) else value
            lines.append(json.dumps(line, separators=(",", ":")))
            written.append(scope)
        if lines:
            self.stream.write("\n".join(lines) + "\n")
            self.stream.flush()
        self._previous = written
        return written


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
