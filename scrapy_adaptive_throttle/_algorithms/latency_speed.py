"""A host that changed speed: when the latency limit takes a new baseline.

Part of :class:`~scrapy_adaptive_throttle._algorithms.latency.LatencyLimit`,
whose module states the rules of its rounds; this one keeps the evidence
that the host itself changed speed:

* **A slowdown the limit cannot fix becomes the baseline.** When
  three rounds in a row are mostly slow (at most a fifth of fast answers),
  and the second and third round's median did not get faster after the
  limit was lowered, the latency is probably not a queue this crawler
  causes: the host itself got slower. "Faster" is by 5%, or by the noise of
  two rounds' medians if that is more (1.645 standard errors of the
  difference of their logarithms, from the rounds' quartiles): with the 5%
  alone, a round of ten answers at sigma 0.6 came out faster by noise
  about every other time, and a slowdown went untaken for seconds (6 of 12
  crawls of a 3-second slowdown on the host model, at 0.58-0.85 of the
  reduced capacity; with the noise allowed for, 1 of 12, mean 0.95). A
  probe at half the limit then checks it (``LatencyLimit._suspect_slowdown``):
  a draining queue's rounds can come out flat three times in a row too
  (before the check, 2 of 72 hosts that kept their speed on the host model
  were taken as slower, and held at about twice their unloaded median for
  the rest of the crawl; with it, none, also with the noise allowed for).
  When the probe's first 4 answers are all beyond the tolerance of the
  baseline the rounds were judged by, or the median of its 8 is, the
  median of the probe's and that round's answers together becomes the
  baseline, the levels start over and slow start finds the limit the slower
  host needs
  (the guide's one-second window lost 15-18% of a 3-second slowdown; on the
  noisy host model without slow start 0.63-0.69 of the reduced capacity,
  with it 0.93). A queue the crawler causes shrinks when the limit does, and
  its rounds get faster. A round counts only at a lower load (median requests
  in flight at its answers) than the previous slow round's: until the
  requests in flight follow the lowered limit down, a flat latency says
  nothing (the processes of a shared limit lag behind it: 3 such rounds
  at one load read as a slowdown in 5 of 30 crawls of
  ``tests/test_shared_state_adaptive_crawl.py``, and the 1.6x baseline
  taken then held the host at about twice one process's load).
  **One request in flight is the lowest load there is**: rounds at a load
  of 1 count one after the other, and none of them can be made faster by
  lowering the limit, so their medians count as flat however the noise
  moves them. Before this rule, a slowdown that brought the limit down to
  1 before three flat rounds was never taken (their load could not go
  lower), and the limit stayed at 1 until the old samples expired, two
  windows later: on the host model, a host four times slower from 5 s on
  was crawled, from 10 to 25 s after the change, at 0.37-0.59 of its new
  capacity in 16 of 16 crawls of a 2-worker host (sigma 0.3 and 0.6), at
  0.20-0.28 in 6 of 8 of a 4-worker one and at 0.11-0.13 in 2 of 8 of an
  8-worker one (sigma 0.6); with it, at 0.73-1.09 but for one crawl
  (``tests/algorithms/test_latency_traces.py``). A load above 1 keeps the
  rule above, also at a configured floor above 1: there the crawler's own
  requests may be what queues at the host.

* **A host that sped up** does the opposite: when three quarters of the
  last 16 or more answers since a slow round are below the baseline (and
  beyond its noise), their median is the new baseline. Every
  answer counts there, not only those that ended a round: the fastest of a
  burst arrive first, and taking only them rebaselined a noise-only trace
  every few seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .latency_baseline import MEDIAN_EFFICIENCY, NORMAL_IQR, lower_median

__all__ = ["SPEEDUP_SAMPLES", "SpeedChange"]

#: A round whose median is at least this share of the previous slow round's
#: median did not get faster: lowering the limit did not help.
_FLAT = 0.95
#: Rounds in a row that did not get faster (after a first mostly slow round)
#: before the baseline is replaced.
_FLAT_ROUNDS = 2
#: Answers of rounds without a decrease needed to tell a host that sped up.
SPEEDUP_SAMPLES = 16
#: Those answers must be at least this much faster than the baseline (and
#: beyond its noise) to count as the host having sped up.
_SPEEDUP = 0.9


class SpeedChange:
    """The evidence, round after round, that the host itself changed speed."""

    __slots__ = (
        "_faster",
        "_flat",
        "_slow_round_load",
        "_slow_round_median",
        "_slow_round_noise",
    )

    def __init__(self) -> None:
        # The answers of the last rounds without a decrease, until there are
        # enough to tell whether the host sped up.
        self._faster: list[tuple[float, float]] = []
        # The median of the previous mostly slow round (None: the last round
        # was not), and how many such rounds in a row did not get faster.
        self._slow_round_median: float | None = None
        self._slow_round_load: float | None = None
        # That round's log-spread and answers (its median's noise).
        self._slow_round_noise = (0.0, 0)
        self._flat = 0

    def reset(self) -> None:
        """Forget everything (a new baseline was taken)."""
        self._slow_round_median = None
        self._slow_round_load = None
        self._flat = 0
        self._faster = []

    def answered(self, now: float, latency: float) -> None:
        """Note a normal answer."""
        self._faster.append((now, latency))

    def interrupted(self) -> None:
        """A round ended without a verdict (an overload): slow rounds in a
        row start over."""
        self._slow_round_median = None
        self._slow_round_load = None
        self._flat = 0

    def after_slow_round(
        self,
        latencies: list[float],
        *,
        mostly_slow: bool,
        load: float | None = None,
    ) -> float | None:
        """A round ended with a decrease; *latencies* are its answers and
        *load* the median of the requests in flight at them (None: unknown).

        Returns the round's median when the host itself got slower (the
        third mostly slow round in a row that did not get faster, each at a
        lower load than the one before, or at a load of one request, which
        nothing can lower), else None.
        """
        self._faster = []
        if not mostly_slow:
            self.interrupted()
            return None
        previous_load = self._slow_round_load
        # One request in flight: the lowest load there is (see the module).
        alone = load is not None and load <= 1.0
        if (
            not alone
            and self._slow_round_median is not None
            and load is not None
            and previous_load is not None
            and load >= previous_load
        ):
            # The last decrease has not lowered the load yet: no evidence
            # either way.
            return None
        latencies.sort()
        median = lower_median(latencies)
        previous = self._slow_round_median
        spread, count = self._slow_round_noise
        noise = (_log_spread(latencies), len(latencies))
        self._slow_round_median = median
        self._slow_round_load = load
        self._slow_round_noise = noise
        if previous is None or (
            not alone and median < previous * _faster_than(noise, (spread, count))
        ):
            self._flat = 0
            return None
        self._flat += 1
        return median if self._flat >= _FLAT_ROUNDS else None

    def after_fast_round(self, now: float, window: float) -> list[float] | None:
        """A round ended without a decrease.

        Returns every answer since the last slow round, sorted, once there
        are ``SPEEDUP_SAMPLES`` of them within *window* seconds (older ones
        may mix two speeds of the host), for the caller to test; else None.
        """
        self.interrupted()
        faster = self._faster
        if not faster or now - faster[0][0] > window:
            self._faster = []
            return None
        if len(faster) < SPEEDUP_SAMPLES:
            return None
        self._faster = []
        return sorted(latency for _, latency in faster)

    def sped_up(
        self,
        now: float,
        window: float,
        best: float | None,
        factor: Callable[[int, float], float],
    ) -> list[float] | None:
        """A round ended without a decrease: the sorted answers since the
        last slow round when three quarters of them are below the baseline
        *best* times ``factor(len(answers), 0.9)`` (beyond its noise; noise
        alone puts half of them there), else None (see
        :meth:`after_fast_round`)."""
        values = self.after_fast_round(now, window)
        if best is None or values is None:
            return None
        quartile = values[(3 * len(values)) // 4]
        return values if quartile < best * factor(len(values), _SPEEDUP) else None


#: How many standard errors of the difference of two rounds' log-medians a
#: round must be faster by to count as faster (one-sided 95 %).
_FLAT_Z = 1.645


def _log_spread(latencies: list[float]) -> float:
    """The standard deviation of log-latency, from the quartiles of the
    sorted *latencies* (robust to a few outliers)."""
    count = len(latencies)
    if count < 4:
        return 0.0
    low = latencies[count // 4]
    high = latencies[(3 * count) // 4]
    if low <= 0:
        return 0.0
    return math.log(high / low) / NORMAL_IQR


def _faster_than(noise: tuple[float, int], previous: tuple[float, int]) -> float:
    """The factor a round's median must fall below the previous round's by
    to count as faster: 5 %, or the noise of the two medians if larger."""
    spread = (noise[0] + previous[0]) / 2
    if not spread or not noise[1] or not previous[1]:
        return _FLAT
    error = MEDIAN_EFFICIENCY * spread * math.sqrt(1 / noise[1] + 1 / previous[1])
    return min(_FLAT, math.exp(-_FLAT_Z * error))
