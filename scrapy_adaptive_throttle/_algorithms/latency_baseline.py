"""The baseline of the latency limit: a host's unloaded median latency.

Part of :class:`~scrapy_adaptive_throttle._algorithms.latency.LatencyLimit`
(whose module states the rules of its rounds); this module holds the two
records the baseline is estimated from, and the baseline's own rules:

* :class:`LoadHistory`: how many requests were in flight when each request
  was sent (the load its answer measured), from the sends noted by the caller
  or, for older ones, from the whole limit of the time.
* :class:`LevelSamples`: recent latencies per in-flight level, and the
  baseline estimated from them.

* **The baseline is a median, not a minimum.** The guide's (and this
  limit's first) baseline was the fastest single answer of a window. On a
  host whose service time is lognormal (median 20 ms, sigma 0.6) the minimum
  of N answers falls like ``exp(-sigma sqrt(2 ln N))``, so nearly every
  normal answer looked slow and the limit sat at its floor: 52 pages/s of a
  probed 316 (issue 9; tolerance 3.0 still only 0.40 of capacity). Noise does
  not depend on load; queueing does. So the baseline is the median of the
  answers of the **lowest in-flight levels** (requests in flight when each
  request was sent, :meth:`LatencyLimit.on_sent`), pooled from the lowest
  level up while the next level's median is not significantly higher (two
  standard errors of a median, ``1.2533 x spread / sqrt(n)``, with the spread
  of log-latency measured within levels), up to 32 samples. A level whose
  latency rises is a queue, and stays out.
* **A probe supersedes older samples it shows to be stale.** Slow start's
  answers are the crawl's first: few per level, and they pay for new
  connections and a crawler starting up. Measured with Scrapy, they held the
  baseline at 2.1x and 1.8x the unloaded median on the bimodal and
  heavy-tailed hosts for their two windows, and the median latency with it
  (3.1x and 2.0x). So when a probe ends, the older samples from levels up
  to the probe's are tested against its median: if far more than half of
  them are slower (a sign test, ``Z`` standard errors; noise alone puts
  half of them there), every sample from before the probe goes. On the host
  model with the first 0.25 s twice as slow, 9 of 30 cases end with the
  baseline or the median latency off, against 21 without the rule.
* **Samples expire**: a latency sample makes the baseline for two windows
  (the guide's ``record_latency``: the current and the previous window), so
  a permanent change of the host's speed becomes the new baseline instead of
  a permanent emergency (the guide's figure "Host A slows down mid-crawl": 12
  pages/s with a best kept forever, 82-86 with a window).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from collections.abc import Callable

__all__ = ["LevelSamples", "LoadHistory", "UnloadedBaseline", "lower_median"]

#: Samples the baseline is the median of, once that many are fresh: the
#: median of 32 lognormal(sigma 0.6) latencies is within 13% of the true
#: median two times in three (standard error 1.2533 x 0.6 / sqrt(32)).
POOL = 32
#: Latencies kept per in-flight level (the newest ones).
_LEVEL_SAMPLES = 32
#: In-flight levels above this one are kept together.
_MAX_LEVEL = 256
#: Changes of the whole limit remembered, to tell the limit a request was
#: sent under.
_LIMIT_HISTORY = 32
#: Sends remembered (with the requests in flight then); answers to older ones
#: fall back on the limit of the time.
_SEND_HISTORY = 512
#: Standard errors a difference must exceed to count (about 2% one-sided).
Z = 2.0
#: The smallest spread of log-latency assumed, so that a few identical
#: samples do not make every small difference significant.
MIN_SPREAD = 0.05
#: The expected spread of the median of n samples is this times spread / sqrt(n).
MEDIAN_EFFICIENCY = 1.2533
#: The interquartile range of a normal distribution, in standard deviations:
#: a spread from quartiles, robust to a few outliers.
NORMAL_IQR = 1.349


def lower_median(values: list[float]) -> float:
    """The lower median of sorted *values* (a value that was measured)."""
    return values[(len(values) - 1) // 2]


class LoadHistory:
    """Requests in flight at recent sends, and the whole limit's changes."""

    __slots__ = ("_limits", "_sends")

    def __init__(self) -> None:
        # (time, whole limit) at its recent changes.
        self._limits: deque[tuple[float, int]] = deque(maxlen=_LIMIT_HISTORY)
        # (time, requests in flight) of recent sends.
        self._sends: deque[tuple[float, int]] = deque(maxlen=_SEND_HISTORY)

    def on_sent(self, now: float, in_flight: int) -> None:
        """Note a request sent at *now* with *in_flight* requests in flight."""
        self._sends.append((now, in_flight))

    def note_limit(self, now: float, value: int) -> None:
        """Record the whole limit *value* at *now* if it changed."""
        history = self._limits
        if not history or history[-1][1] != value:
            history.append((now, value))

    def limit_at(self, when: float, current: int) -> int:
        """The whole limit at time *when* (the oldest one kept if earlier;
        *current* if none was recorded)."""
        history = self._limits
        for index in range(len(history) - 1, -1, -1):
            changed_at, value = history[index]
            if changed_at <= when:
                return value
        return history[0][1] if history else current

    def level_at(self, sent: float) -> int | None:
        """Requests in flight when a request sent at *sent* left (None: not
        noted, or too old; see :meth:`limit_at`)."""
        sends = self._sends
        for index in range(len(sends) - 1, -1, -1):
            when, level = sends[index]
            if when <= sent:
                return level
        return None


class LevelSamples:
    """Recent latencies per in-flight level, and the baseline they give.

    Attributes: ``level`` (the highest level in the last baseline's pool),
    ``count`` (how many samples that pool had), ``dirty`` (samples came at
    levels that may change the pool since it was computed), ``updated_at``
    (when it was) and ``spread`` (the spread of log-latency within levels:
    the host's noise, whatever its load).
    """

    __slots__ = (
        "_deviations",
        "_levels",
        "_sorted",
        "count",
        "dirty",
        "level",
        "spread",
        "updated_at",
    )

    def __init__(self) -> None:
        self._levels: dict[int, deque[tuple[float, float]]] = {}
        # The same latencies per level, sorted, and their log-deviations from
        # the level's median, computed when the baseline needs them and kept
        # until the level changes: an answer changes one level, so an update
        # sorts and logs that level only.
        self._sorted: dict[int, list[float]] = {}
        self._deviations: dict[int, list[float]] = {}
        self.level = 0
        self.count = 0
        self.dirty = False
        self.updated_at = -math.inf
        self.spread = MIN_SPREAD

    def record(self, now: float, latency: float, level: int) -> None:
        """Add an answer at *now* to a request sent with *level* in flight."""
        level = 1 if level < 1 else min(level, _MAX_LEVEL)
        samples = self._levels.get(level)
        if samples is None:
            samples = self._levels[level] = deque(maxlen=_LEVEL_SAMPLES)
        samples.append((now, latency))
        # Sorted again when the baseline is next computed, and only this level.
        self._sorted.pop(level, None)
        self._deviations.pop(level, None)
        if level <= self.level + 1:
            self.dirty = True

    def supersede(self, started: float, level: int, probe: list[float]) -> None:
        """Drop the samples a probe round shows to be stale.

        The probe's answers (to requests sent since *started*, at most
        *level* in flight) are the host's latency at low load now. Older
        samples from levels up to *level* measured the same load or less;
        if far more than half of them are slower than the probe's median
        (beyond ``Z`` standard errors of a sign test: noise alone puts half
        of them there), the host is faster now than when they were taken,
        and every sample from before the probe goes.
        """
        probe.sort()
        median = lower_median(probe)
        above = older = 0
        for key, samples in self._levels.items():
            if key <= level:
                for when, latency in samples:
                    if when - latency < started:
                        older += 1
                        if latency > median:
                            above += 1
        if not older:
            return
        share = above / older
        if share <= 0.5 + Z * 0.5 * math.sqrt(1 / older + 1 / len(probe)):
            return
        for samples in self._levels.values():
            kept = [(t, x) for t, x in samples if t - x >= started]
            samples.clear()
            samples.extend(kept)
        self._sorted.clear()
        self._deviations.clear()
        self.dirty = True

    def reset(self, now: float, latencies: list[float], level: int) -> None:
        """Start over from *latencies*, answered at *now* at *level*."""
        self._levels.clear()
        self._sorted.clear()
        self._deviations.clear()
        samples: deque[tuple[float, float]] = deque(maxlen=_LEVEL_SAMPLES)
        samples.extend((now, latency) for latency in latencies)
        self._levels[level] = samples

    def estimate(self, now: float, window: float) -> tuple[list[float], int] | None:
        """The sorted pool of the lowest levels and its highest level.

        Samples older than two *windows* expire first. Levels are pooled
        from the lowest up while the next one's median is not significantly
        above the pool's (latency rising with in-flight requests is a queue;
        noise does not depend on them), until the pool holds ``POOL``
        samples. Significance is measured against :attr:`spread`. None when
        no sample is left.
        """
        self.dirty = False
        self.updated_at = now
        horizon = now - 2 * window
        levels = self._levels
        cached = self._deviations
        by_level: list[tuple[int, list[float]]] = []
        deviations: list[float] = []
        ordered = self._sorted
        for level in sorted(levels):
            samples = levels[level]
            if not samples or samples[0][0] < horizon:
                while samples and samples[0][0] < horizon:
                    samples.popleft()
                ordered.pop(level, None)
                cached.pop(level, None)
                if not samples:
                    del levels[level]
                    continue
            latencies = ordered.get(level)
            if latencies is None:
                latencies = ordered[level] = sorted(x for _, x in samples)
            by_level.append((level, latencies))
            if len(latencies) > 1:
                known = cached.get(level)
                if known is None:
                    center = math.log(lower_median(latencies))
                    known = cached[level] = [
                        math.log(value) - center for value in latencies
                    ]
                deviations.extend(known)
        if not by_level:
            return None
        spread = MIN_SPREAD
        if len(deviations) >= 4:
            deviations.sort()
            count = len(deviations)
            spread = max(
                MIN_SPREAD,
                (deviations[(3 * count) // 4] - deviations[count // 4]) / NORMAL_IQR,
            )
        self.spread = spread
        pool: list[float] = []
        top = 0
        for level, latencies in by_level:
            if pool:
                error = (
                    Z
                    * MEDIAN_EFFICIENCY
                    * spread
                    * math.sqrt(1 / len(pool) + 1 / len(latencies))
                )
                if (
                    math.log(lower_median(latencies)) - math.log(lower_median(pool))
                    > error
                ):
                    break
            pool.extend(latencies)
            pool.sort()
            top = level
            if len(pool) >= POOL:
                break
        return pool, top


class UnloadedBaseline:
    """The baseline latency and the noise of the unloaded answers behind it.

    Attributes: ``best`` (the baseline: the median of the pool of the lowest
    in-flight levels; None before the first answer), ``samples`` and
    ``load`` (the records it is estimated from), ``pool_slow_share`` (the
    share of the pool above the threshold), ``steady`` (no answer of the
    pool in the upper half of the tolerance band) and ``unloaded_max`` (the
    pool's slowest answer).
    """

    __slots__ = ("best", "load", "pool_slow_share", "samples", "steady", "unloaded_max")

    def __init__(self) -> None:
        self.best: float | None = None
        self.samples = LevelSamples()
        self.load = LoadHistory()
        self.pool_slow_share = 0.0
        self.steady = True
        self.unloaded_max = math.inf

    def record(self, now: float, latency: float, in_flight: int, current: int) -> None:
        """Add an answer; *in_flight* and the whole limit *current* give its
        level when its send was not noted."""
        # The load a request met is what was in flight when it was sent: at
        # most the whole limit then (requests in flight when it answers may
        # have been sent later, into a different queue).
        sent = now - latency
        level = self.load.level_at(sent)
        if level is None:
            # Not noted (or too old): at most the limit of the time, and at
            # most what is in flight now if the limit was not in use.
            sent_limit = self.load.limit_at(sent, current)
            level = in_flight if in_flight < sent_limit else sent_limit
        self.samples.record(now, latency, level)

    def is_due(self, now: float, window: float) -> bool:
        """Too few samples yet for a stable median (every one counts), or
        none taken for a *window*."""
        samples = self.samples
        return samples.count < POOL or now - samples.updated_at > window

    def update(
        self, now: float, window: float, threshold: Callable[[float], float]
    ) -> bool:
        """Recompute the baseline from the lowest in-flight levels (False:
        no sample is left, nothing changed)."""
        estimate = self.samples.estimate(now, window)
        if estimate is None:
            return False
        pool, top = estimate
        self.take(lower_median(pool), pool, top, threshold)
        return True

    def take(
        self,
        baseline: float,
        pool: list[float],
        level: int,
        threshold: Callable[[float], float],
    ) -> None:
        """Take *baseline* and the noise of the sorted *pool* behind it."""
        self.best = baseline
        samples = self.samples
        samples.level = level
        samples.count = count = len(pool)
        limit = threshold(baseline)
        lower = baseline + (limit - baseline) / 2
        self.pool_slow_share = (count - bisect_right(pool, limit)) / count
        self.steady = bisect_right(pool, lower) == count
        self.unloaded_max = pool[-1]

    def restart(
        self,
        now: float,
        baseline: float,
        latencies: list[float],
        level: int,
        threshold: Callable[[float], float],
    ) -> None:
        """The host itself changed speed: start over from *latencies*."""
        self.samples.reset(now, latencies, level)
        self.take(baseline, latencies, level, threshold)
        # Established: the next pools must come from levels as low as this
        # round's, or show another change of speed.
        self.samples.count = max(self.samples.count, POOL)

    def speedup_factor(self, count: int, speedup: float) -> float:
        """How much faster than the baseline *count* answers must be to show
        a host that sped up: *speedup*, and beyond their noise."""
        error = Z * 1.5 * MEDIAN_EFFICIENCY * self.samples.spread / math.sqrt(count)
        return min(speedup, math.exp(-error))
