"""Probe rounds of the latency limit (BBR's ProbeRTT).

Part of :class:`~scrapy_adaptive_throttle._algorithms.latency.LatencyLimit`.
Once a crawl settles above the host's workers it sends nothing at low levels
any more, and the baseline would rest on slow start's few answers per level.
So at the end of slow start and then every two windows the limit is halved
for ``PROBE_SAMPLES`` answers; their levels are unloaded on any host the limit
fits. On the host model (``tests/latency_host_model.py``, 8 workers x 20 ms)
the baseline went from 0.75-1.31 to 0.84-1.01 of the unloaded median at sigma
0.3-1.0. The probe's share of answers above the threshold also sizes the
limit's rounds, whatever error the baseline's own estimate has.
"""

from __future__ import annotations

import math

from .latency_baseline import LevelSamples

__all__ = ["PROBE_SAMPLES", "ProbeRound"]

#: Answers a probe round waits for (requests sent during it).
PROBE_SAMPLES = 16
#: Answers a probe that checks a suspected slowdown waits for.
CHECK_SAMPLES = 8
#: Probe answers whose share above the threshold is remembered.
_PROBE_MEMORY = 64


class ProbeRound:
    """When probe rounds run, and what their answers measured.

    Attributes: ``next_at`` (when the next probe is due), ``started`` (when
    the running one started; None: not probing), ``answers`` and
    ``latencies`` (the running probe's answers), ``checking`` (the baseline
    when a slowdown was suspected, if the running probe checks it; None
    otherwise) and ``enabled`` (probes run at all).
    """

    __slots__ = (
        "_count",
        "_slow",
        "answers",
        "checking",
        "enabled",
        "latencies",
        "next_at",
        "started",
        "suspected",
    )

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        # The first one at the end of slow start.
        self.next_at = -math.inf if enabled else math.inf
        self.started: float | None = None
        self.answers = 0
        self.latencies: list[float] = []
        # The baseline when a slowdown was suspected, if the running probe
        # checks it (its answers decide whether the host got slower; see
        # LatencyLimit); None otherwise.
        self.checking: float | None = None
        # The slow round's latencies that raised the suspicion.
        self.suspected: list[float] = []
        # Probe answers above the threshold, out of how many (halved past
        # _PROBE_MEMORY).
        self._slow = 0.0
        self._count = 0.0

    def postpone(self, now: float, window: float) -> None:
        """Try again in two windows (the limit is too small to halve)."""
        self.next_at = now + 2 * window

    def try_begin(self, now: float, limit: int, minimum: int, window: float) -> bool:
        """Start a probe round at *now* if the whole *limit* can be halved
        above *minimum* (True), else try again in two windows."""
        if limit // 2 < minimum or limit < 2:
            self.postpone(now, window)
            return False
        self.begin(now)
        return True

    def begin(self, now: float) -> None:
        """Start a probe round at *now*."""
        self.started = now
        self.answers = 0
        self.latencies = []

    def add(self, latency: float, *, slow: bool) -> None:
        """Count an answer to a request sent during the probe.

        Probe answers are unloaded: their share above the threshold (*slow*)
        is the noise a round must beat, whatever error the baseline's own
        estimate has (a baseline that came out low makes more of them slow).
        """
        self.answers += 1
        self.latencies.append(latency)
        if slow:
            self._slow += 1.0
        self._count += 1.0
        if self._count > _PROBE_MEMORY:
            self._slow /= 2
            self._count /= 2

    def is_over(self, now: float, baseline: float | None) -> bool:
        """Whether the running probe has its answers, or has run too long."""
        started = self.started
        assert started is not None
        needed = PROBE_SAMPLES if self.checking is None else CHECK_SAMPLES
        return self.answers >= needed or now - started > max(
            1.0, 20 * (baseline or 0.0)
        )

    def slow_share(self) -> float:
        """The remembered share of probe answers above the threshold (0 with
        fewer than half a probe's answers)."""
        count = self._count
        return self._slow / count if count >= PROBE_SAMPLES / 2 else 0.0

    def finish(self, now: float, window: float) -> None:
        """End the running probe; the next one is due in two windows, before
        the samples it brought expire."""
        self.latencies = []
        self.started = None
        self.checking = None
        self.suspected = []
        self.next_at = now + 2 * window

    def end(self, now: float, window: float, samples: LevelSamples, level: int) -> None:
        """End the running probe: its answers (if at least half a probe's)
        supersede the *samples* of its whole limit *level* sent since it
        started, and the baseline is due again."""
        started = self.started
        latencies = self.latencies
        if started is not None and 2 * len(latencies) >= PROBE_SAMPLES:
            samples.supersede(started, level, latencies)
        self.finish(now, window)
        samples.dirty = True
