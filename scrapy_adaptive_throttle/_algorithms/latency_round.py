"""Rounds of the latency limit: when enough answers came to decide.

Part of :class:`~scrapy_adaptive_throttle._algorithms.latency.LatencyLimit`
(whose module states the rest of its rules):

* **A round needs enough answers to beat the noise.** Answers are counted
  in rounds: the answers to requests sent after the last decision (``now -
  latency`` tells when a request was sent). When half of a round's answers
  are slow the limit is multiplied by 0.9 (below 10, lowered by one: a tenth
  of a small limit is less than what one round of growth adds back); when
  more than half are within the tolerance, the round ends without a
  decrease. That is the round's median against the threshold, which is what
  the tolerance promises (at the settled limit the median latency stays
  within the tolerance of the unloaded median). A round has at least
  ``limit`` answers, and on a noisy host more: with a share ``p`` of unloaded
  answers above the threshold, the slow count is binomial and its majority
  slow by chance about 2% of the time (two standard errors) with ``n >= (2
  sqrt(p (1 - p)) / (0.5 - p))^2`` answers (:func:`round_size_for_noise`): 1
  on a steady host, 12 at p = 0.25 (lognormal sigma 0.6, tolerance 1.5), 35
  at p = 0.34 (sigma 1.0); rounds pool answers across physical rounds when
  the limit is small. Measured with Scrapy on 2 shared cores, one answer in
  ten is slow for reasons on the crawler's side (its event loop was busy),
  and the guide's per-answer rule turned that noise into decreases, holding
  host A at 0.8 of its capacity; the majority rule does not.
* **A round slower than every unloaded answer needs few answers.** When a
  round needs 24 answers or more (a noise share of about 0.3 and up), its
  slow answers may also end it early: once more than half of its last
  ``max(limit, 3)`` answers are slower than the slowest answer of the
  baseline's pool. Noise puts about one answer in ``len(pool)`` there however
  noisy the pool is, so that is a queue. The case it is for: Scrapy on a
  loaded machine overshooting a 2-worker host in slow start, whose queued
  answers (2x the service time at 3-6 in flight) entered the pool and made
  its noise share 0.4-0.5: rounds of 64 answers, and 32 answers at 3x the
  baseline before a decrease (``tests/algorithms/data/
  small_host_slow_start_trace.json``); now 3. On the host model (6 kinds of
  service time x 2 hosts x 4 seeds x 2 turnarounds x cold start or not) the
  mean rate is 0.949 of capacity against 0.950 before; 95 of the 192 cases
  miss 0.9 of capacity or a median within 1.5x before and after, one
  heavy-tailed case now meets both (median 2.44x to 1.44x) and one
  lognormal-0.3 case on the 2-worker host now misses (0.974 to 0.896 of
  capacity).
"""

from __future__ import annotations

import math

from .latency_baseline import Z

__all__ = ["FAR_RULE_TARGET", "Round", "lowered_limit", "round_size_for_noise"]

#: The largest number of answers a round may need.
_MAX_ROUND = 64
#: Answers a round needs at least when its majority is slower than every
#: answer of the baseline's pool.
_FAR_ROUND = 3
#: Round sizes from which that rule applies (a noise share of about 0.3).
FAR_RULE_TARGET = 24
#: A round with at most this share of fast answers is "mostly slow".
_MOSTLY_SLOW_FAST_SHARE = 0.2


def round_size_for_noise(slow_share: float) -> int:
    """Answers a round needs so that noise alone rarely makes its majority slow.

    *slow_share* is the share of the host's unloaded answers that are slow
    (above the threshold). With ``n`` answers, the slow count is binomial;
    its majority is slow by chance with probability about
    ``P(Z > (0.5 - p) sqrt(n) / sqrt(p (1 - p)))``, which ``Z`` standard
    errors keep near 2%: 1 answer for a steady host, 12 at p = 0.25, 35 at
    p = 0.34 (lognormal sigma 1.0 with a tolerance of 1.5).
    """
    if slow_share <= 0.0:
        return 1
    margin = 0.5 - slow_share
    if margin <= 0.0:
        return _MAX_ROUND
    size = (Z * math.sqrt(slow_share * (1.0 - slow_share)) / margin) ** 2
    return min(_MAX_ROUND, math.ceil(size))


def lowered_limit(limit: float, minimum: int) -> float:
    """The limit after a slow round: x0.9, but at least one request less (at
    small limits a tenth is less than the +1 a round of growth adds back),
    and never below *minimum*."""
    limit = limit * 0.9 if limit >= 10.0 else limit - 1.0
    floor = float(minimum)
    return limit if limit > floor else floor


class Round:
    """The answers of the current round: to requests sent since ``mark``.

    Attributes: ``mark`` (when the round started), ``fast`` and ``slow``
    (its answers within and above the threshold), ``upper`` (its answers in
    the upper half of the tolerance band or above), ``latencies`` (its
    answers' latencies, in the order they came) and ``loads`` (the requests
    in flight at each of its normal answers).
    """

    __slots__ = ("fast", "latencies", "loads", "mark", "slow", "upper")

    def __init__(self) -> None:
        self.mark = -math.inf
        self.fast = 0
        self.slow = 0
        self.upper = 0
        self.latencies: list[float] = []
        self.loads: list[int] = []

    def start(self, now: float) -> None:
        """Start a new round at *now*."""
        self.mark = now
        self.fast = self.slow = self.upper = 0
        self.latencies = []
        self.loads = []

    def load(self) -> float | None:
        """The median of :attr:`loads` (None: no normal answer)."""
        loads = sorted(self.loads)
        return float(loads[(len(loads) - 1) // 2]) if loads else None

    def add_fast(self, latency: float) -> None:
        """Count an answer within the threshold."""
        self.fast += 1
        self.latencies.append(latency)

    def add_slow(self, latency: float) -> None:
        """Count an answer above the threshold."""
        self.slow += 1
        self.latencies.append(latency)

    def slow_majority(
        self, latency: float, target: int, limit: int, unloaded_max: float
    ) -> bool:
        """Whether the slow answer just counted (*latency*) ends the round
        slow: half of *target* answers are slow, or (for rounds of
        ``FAR_RULE_TARGET`` answers and more) most of the last ones are
        slower than *unloaded_max*, the slowest answer of the baseline's pool
        (see :meth:`recent_far_majority`)."""
        return 2 * self.slow >= target or (
            latency > unloaded_max
            and target >= FAR_RULE_TARGET
            and self.recent_far_majority(limit, unloaded_max)
        )

    def queue_forming(self, *, steady: bool) -> bool:
        """Whether a queue is forming: on a *steady* host one answer in the
        upper half of the band; on a noisy one, half of the round's answers."""
        return steady or 2 * self.upper > self.fast + self.slow

    def mostly_slow(self) -> bool:
        """At most a fifth of the round's answers were fast."""
        return self.fast <= _MOSTLY_SLOW_FAST_SHARE * (self.fast + self.slow)

    def recent_far_majority(self, limit: int, highest: float) -> bool:
        """More than half of the last ``max(limit, 3)`` answers are slower
        than *highest* (the slowest answer of the baseline's pool).

        Noise puts about one answer in ``len(pool)`` there, however noisy
        the pool: that majority is a queue, seen without waiting for the
        answers a noisy pool asks.
        """
        count = max(limit, _FAR_ROUND)
        latencies = self.latencies
        if len(latencies) < count:
            return False
        far = sum(1 for value in latencies[-count:] if value > highest)
        return 2 * far > count
