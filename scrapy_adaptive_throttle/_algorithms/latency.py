"""A concurrency limit that adapts to a host's latency (AIMD on latency).

Rule, from the guide "Adapting Crawl Rate to Host Latency"
(``shared/reference/000_3452b3576d47e7cc.txt``, sections 2 to 5), made
robust to hosts whose service time is noisy (issue 9):

* A host's latency at low load is its service time; once requests queue at the
  host, latency rises before errors appear. So compare latencies with a
  **baseline, the host's unloaded median latency**: an answer within
  ``baseline * tolerance`` raises the limit by ``1 / limit`` (about +1 per
  round of requests, TCP's additive increase); a round of answers whose
  median is slower multiplies it by 0.9.
* **The baseline is a median, not a minimum.** The guide's (and this
  module's first) baseline was the fastest single answer of a window. On a
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
* **Probe rounds** (BBR's ProbeRTT): once the crawl settles above the
  host's workers, it sends nothing at low levels any more and the baseline
  would rest on slow start's few answers per level. At the end of slow start
  and then every two windows, the limit is halved for 16 answers; their
  levels are unloaded on any host the limit fits. On the host model
  (``tests/latency_host_model.py``, 8 workers x 20 ms) the baseline went
  from 0.75-1.31 to 0.84-1.01 of the unloaded median at sigma 0.3-1.0. The
  probe's share of answers above the threshold also sizes the rounds (next
  rule), whatever error the baseline's own estimate has.
* **A probe supersedes older samples it shows to be stale.** Slow start's
  answers are the crawl's first: few per level, and they pay for new
  connections and a crawler starting up. Measured with Scrapy, they held the
  baseline at 2.1x and 1.8x the unloaded median on the bimodal and
  heavy-tailed hosts for their two windows, and the median latency with it
  (3.1x and 2.0x). So when a probe ends, the older samples from levels up
  to the probe's are tested against its median: if far more than half of
  them are slower (a sign test, ``_Z`` standard errors; noise alone puts
  half of them there), every sample from before the probe goes. On the host
  model with the first 0.25 s twice as slow, 9 of 30 cases end with the
  baseline or the median latency off, against 21 without the rule.
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
* **The limit only grows while it is used** (in-flight requests close to the
  limit): an idle scope must not inflate a limit it never tested. And it only
  grows on answers to requests sent since the whole-number limit last went
  up: older answers tested the lower limit (on host B, 2 x 50 ms, counting
  them put half the crawl at a limit of 4, past the tolerance).
* **Slow start** (TCP's): until a queue forms, each fast answer adds a whole
  request instead of ``1 / limit``, doubling the limit every round (host A's
  12 in about 0.15 s instead of 0.8 s: +1% to +10% of A's pages/s over a
  2000-page crawl, no 503). A queue forming is one answer in the upper half
  of the tolerance band on a steady host (no unloaded answer there), half of
  the round's answers on a noisy one; a slow round or an overload ends it
  too.
* **Growth slows down near the tolerance**: the full step for answers in the
  lower half of the band, tapering linearly to nothing at its top (on host B
  the median went from 76-83 ms, right at the tolerance of 77, to 74-75 ms at
  the same throughput). **And near the level whose round was last slow**
  (TCP CUBIC's plateau): for a window, growth towards that whole limit is 4x
  slower, so the limit does not spend every other round there. With the
  median baseline, host B's limit spent a third of its time at 4 (95 ms, for
  a tolerance of 75) and its median sat at 75.3 ms; with the plateau 64-65 ms
  at 0.97-0.98 of capacity (host model, three seeds).
* **A slowdown the limit cannot fix becomes the baseline at once.** When
  three rounds in a row are mostly slow (at most a fifth of fast answers),
  and the second and third round's median did not get faster (by 5%) after
  the limit was lowered, the latency is not a queue this crawler causes: the
  host itself got slower. That round's median becomes the baseline, the
  levels start over and slow start finds the limit the slower host needs
  (the guide's one-second window lost 15-18% of a 3-second slowdown; on the
  noisy host model without slow start 0.63-0.69 of the reduced capacity,
  with it 0.93). A queue the crawler causes shrinks when the limit does, and
  never triggers it. **A host that sped up** does the opposite: when three
  quarters of the last 16 or more answers since a slow round are below the
  baseline (and beyond its noise), their median is the new baseline. Every
  answer counts there, not only those that ended a round: the fastest of a
  burst arrive first, and taking only them rebaselined a noise-only trace
  every few seconds.
* **Samples expire**: a latency sample makes the baseline for two windows
  (the guide's ``record_latency``: the current and the previous window), so
  a permanent change of the host's speed becomes the new baseline instead of
  a permanent emergency (the guide's figure "Host A slows down mid-crawl": 12
  pages/s with a best kept forever, 82-86 with a window).
* **A resolution**: an answer is only slow when it is also ``resolution``
  seconds above the baseline. The crawler measures latency on its own event
  loop, which adds milliseconds of noise that grow with its load; for a host
  answering in 1.5 ms, the tolerance of 1.5 is 0.75 ms, far inside that
  noise, and the limit stayed at 3 (0.7-0.85 of the throughput of a fixed
  limit of 16, with no queue at the host at all).
* **An overload halves the limit once per round**: at most once per baseline
  latency, so the burst of 503s shed from one round counts once; and it
  starts a new round (and ends a probe).
* **An error page** (a status that is not a backoff code, e.g. 404 or 500)
  never raises the limit nor makes the baseline, because error pages are
  often much faster than real pages; a slow one still counts as slow.
* Zero, negative and non-finite latencies are ignored: a zero would become a
  baseline that every later answer exceeds.

Known limits (``tests/algorithms/test_latency_traces.py``, strict xfails):
the baseline is the median of about 32 unloaded answers, whose standard error
at sigma 0.6-1.0 is 13-22%; when it comes out 15-25% low, noise reads as
slow and the limit stays below what the host allows (it still grows, slowly).
After a slow first quarter second, the probe's sign test misses some
lognormal seeds (baseline up to 1.43x); on a bimodal host a request queued
behind a miss waits far past the tolerance band, so the settled median is
about 1.55x at a small turnaround and, measured with Scrapy, the limit stays
below a fixed 8 (0.79 of capacity against 0.96).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque

__all__ = ["LatencyLimit"]

#: Samples the baseline is the median of, once that many are fresh: the
#: median of 32 lognormal(sigma 0.6) latencies is within 13% of the true
#: median two times in three (standard error 1.2533 x 0.6 / sqrt(32)).
_POOL = 32
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
_Z = 2.0
#: The smallest spread of log-latency assumed, so that a few identical
#: samples do not make every small difference significant.
_MIN_SPREAD = 0.05
#: The largest number of answers a round may need.
_MAX_ROUND = 64
#: A round whose median is at least this share of the previous slow round's
#: median did not get faster: lowering the limit did not help.
_FLAT = 0.95
#: Rounds in a row that did not get faster (after a first mostly slow round)
#: before the baseline is replaced.
_FLAT_ROUNDS = 2
#: A round with at most this share of fast answers is "mostly slow".
_MOSTLY_SLOW_FAST_SHARE = 0.2
#: A round must be at least this much faster than the baseline (and beyond
#: its noise) to count as the host having sped up.
_SPEEDUP = 0.9
#: Probe answers whose share above the threshold is remembered.
_PROBE_MEMORY = 64
#: Growth speed towards the level whose round was last slow.
_NEAR_FAILED = 0.25
#: Answers a probe round waits for (requests sent during it).
_PROBE_SAMPLES = 16
#: Answers of rounds without a decrease needed to tell a host that sped up.
_SPEEDUP_SAMPLES = 16
#: The expected spread of the median of n samples is this times spread / sqrt(n).
_MEDIAN_EFFICIENCY = 1.2533


def _median(values: list[float]) -> float:
    """The lower median of sorted *values* (a value that was measured)."""
    return values[(len(values) - 1) // 2]


def round_size_for_noise(slow_share: float) -> int:
    """Answers a round needs so that noise alone rarely makes its majority slow.

    *slow_share* is the share of the host's unloaded answers that are slow
    (above the threshold). With ``n`` answers, the slow count is binomial;
    its majority is slow by chance with probability about
    ``P(Z > (0.5 - p) sqrt(n) / sqrt(p (1 - p)))``, which ``_Z`` standard
    errors keep near 2%: 1 answer for a steady host, 12 at p = 0.25, 35 at
    p = 0.34 (lognormal sigma 1.0 with a tolerance of 1.5).
    """
    if slow_share <= 0.0:
        return 1
    margin = 0.5 - slow_share
    if margin <= 0.0:
        return _MAX_ROUND
    size = (_Z * math.sqrt(slow_share * (1.0 - slow_share)) / margin) ** 2
    return min(_MAX_ROUND, math.ceil(size))


class LatencyLimit:
    """The adaptive concurrency limit of one scope.

    Times are monotonic seconds passed in by the caller.

    :param initial: the starting limit, clamped into ``[minimum, maximum]``.
    :param minimum: the floor of the limit (at least 1).
    :param maximum: the ceiling of the limit (raised to *minimum* if lower).
    :param tolerance: how much the median latency may rise above the host's
        unloaded median; a politeness setting (1.5 = at most ~50% added
        latency).
    :param window: seconds after which a latency sample starts to expire
        (samples older than two windows no longer make the baseline).
    :param resolution: the smallest added latency (seconds) that counts as
        slow, whatever the tolerance: differences below the noise of the
        crawler's own measurements say nothing about the host.
    :param slow_start: start by doubling the limit every round until the
        first sign of a queue (TCP's slow start).
    :param probe: run probe rounds (half the limit for a few answers) at the
        end of slow start and every two windows, so that the baseline is
        made of unloaded answers (BBR's ProbeRTT).
    :raises ValueError: on a tolerance below 1, a non-finite window or a
        negative resolution.

    Attributes: ``limit`` (the fractional limit), ``tolerance``, ``window``,
    ``best`` (the baseline latency: the host's estimated unloaded median,
    None before the first sample), ``last_latency``, and the counters
    ``increase_count`` (answers that raised the limit), ``decrease_count``
    (slow rounds), ``overload_count`` (every overload signal) and
    ``rebaseline_count`` (slowdowns and speed-ups taken as the new
    baseline).
    """

    __slots__ = (
        "_baseline_level",
        "_baseline_samples",
        "_deviations",
        "_dirty",
        "_failed_at",
        "_failed_level",
        "_fast",
        "_faster",
        "_flat",
        "_last_overload",
        "_levels",
        "_limits",
        "_mark",
        "_maximum",
        "_minimum",
        "_next_probe_at",
        "_pool_slow_share",
        "_probe_answers",
        "_probe_count",
        "_probe_latencies",
        "_probe_slow",
        "_probe_started",
        "_raised_at",
        "_round_latencies",
        "_round_size",
        "_sends",
        "_slow",
        "_slow_round_median",
        "_slow_start",
        "_sorted",
        "_spread",
        "_steady",
        "_updated_at",
        "_upper",
        "best",
        "decrease_count",
        "increase_count",
        "last_latency",
        "limit",
        "overload_count",
        "rebaseline_count",
        "resolution",
        "tolerance",
        "window",
    )

    def __init__(
        self,
        *,
        initial: float = 2.0,
        minimum: int = 1,
        maximum: int = 8,
        tolerance: float = 1.5,
        window: float = 30.0,
        resolution: float = 0.0,
        slow_start: bool = True,
        probe: bool = True,
    ) -> None:
        if not (math.isfinite(tolerance) and tolerance >= 1):
            raise ValueError(f"tolerance must be >= 1, got {tolerance!r}")
        if not math.isfinite(window):
            raise ValueError(f"window must be a finite number, got {window!r}")
        if not (math.isfinite(resolution) and resolution >= 0):
            raise ValueError(f"resolution must be >= 0, got {resolution!r}")
        self.tolerance = tolerance
        self.resolution = resolution
        self.window = window
        self.limit = float(initial)
        self._minimum = 1
        self._maximum = 1
        self.set_bounds(minimum, maximum)
        self.best: float | None = None
        self.last_latency: float | None = None
        self.increase_count = 0
        self.decrease_count = 0
        self.overload_count = 0
        self.rebaseline_count = 0
        # Recent latencies per in-flight level (requests of the scope in
        # flight when the answer came): the baseline is made of the lowest
        # levels that show no queue.
        self._levels: dict[int, deque[tuple[float, float]]] = {}
        # The same latencies per level, sorted, and their log-deviations from
        # the level's median, computed when the baseline needs them and kept
        # until the level changes: an answer changes one level, so an update
        # sorts and logs that level only.
        self._sorted: dict[int, list[float]] = {}
        self._deviations: dict[int, list[float]] = {}
        # (time, whole limit) at its recent changes.
        self._limits: deque[tuple[float, int]] = deque(maxlen=_LIMIT_HISTORY)
        # (time, requests in flight) of recent sends, from on_sent().
        self._sends: deque[tuple[float, int]] = deque(maxlen=_SEND_HISTORY)
        # The highest level in the baseline's pool, how many samples it had,
        # and whether samples came since it was computed (and when).
        self._baseline_level = 0
        self._baseline_samples = 0
        self._dirty = False
        self._updated_at = -math.inf
        # Noise of the unloaded answers, measured on the baseline's pool: the
        # answers a round needs before its majority means something, the
        # spread of log-latency, and whether no unloaded answer reached the
        # upper half of the tolerance band (a steady host).
        self._round_size = 1
        self._spread = _MIN_SPREAD
        self._steady = True
        self._last_overload = -math.inf
        # When the whole-number limit last went up: answers to requests sent
        # before then tested the lower limit and do not raise it further.
        self._raised_at = -math.inf
        # The current round: answers to requests sent since _mark.
        self._mark = -math.inf
        self._fast = 0
        self._slow = 0
        self._upper = 0
        self._round_latencies: list[float] = []
        # The answers of the last rounds without a decrease, until there are
        # enough to tell whether the host sped up.
        self._faster: list[tuple[float, float]] = []
        # The median of the previous mostly slow round (None: the last round
        # was not), and how many such rounds in a row did not get faster.
        self._slow_round_median: float | None = None
        self._flat = 0
        # The whole limit whose round was last slow, and when.
        self._failed_level = 0
        self._failed_at = -math.inf
        self._slow_start = slow_start
        # Probe rounds (BBR's ProbeRTT): when the next one is due (the first
        # at the end of slow start), when the running one started (None: not
        # probing) and how many of its answers came.
        self._next_probe_at = -math.inf if probe else math.inf
        self._probe_started: float | None = None
        self._probe_answers = 0
        # The latencies of the running probe's answers.
        self._probe_latencies: list[float] = []
        # Probe answers above the threshold, out of how many (halved past
        # _PROBE_MEMORY), and the same share in the baseline's pool.
        self._probe_slow = 0.0
        self._probe_count = 0.0
        self._pool_slow_share = 0.0

    @property
    def in_slow_start(self) -> bool:
        """Whether the limit still doubles every round (no queue seen yet)."""
        return self._slow_start

    @property
    def minimum(self) -> int:
        """The floor of the limit (change it with :meth:`set_bounds`)."""
        return self._minimum

    @property
    def maximum(self) -> int:
        """The ceiling of the limit (change it with :meth:`set_bounds`)."""
        return self._maximum

    @property
    def baseline(self) -> float | None:
        """The baseline latency (same as ``best``): the unloaded median."""
        return self.best

    @property
    def round_size(self) -> int:
        """Answers a round needs at least (more on a noisier host)."""
        return self._round_size

    def set_bounds(self, minimum: int, maximum: int) -> None:
        """Set the floor and ceiling and clamp the limit into them.

        A minimum below 1 counts as 1 (a limit of 0 would never send again);
        a maximum below the minimum counts as the minimum.
        """
        low = max(1, int(minimum))
        high = max(low, int(maximum))
        self._minimum = low
        self._maximum = high
        limit = self.limit
        if limit > high:
            self.limit = float(high)
        # Negated so that a NaN limit ends at the floor too.
        elif not limit >= low:
            self.limit = float(low)

    def current(self) -> int:
        """The whole number of requests allowed in flight.

        Half the limit during a probe (see :attr:`probing`).
        """
        limit = max(self._minimum, min(self._maximum, int(self.limit)))
        if self._probe_started is not None:
            return max(self._minimum, limit // 2)
        return limit

    @property
    def probing(self) -> bool:
        """Whether a probe round runs: half the limit for ``_PROBE_SAMPLES``
        answers, so that the baseline is made of unloaded answers."""
        return self._probe_started is not None

    def _start_probe(self, now: float) -> None:
        if int(self.limit) // 2 < self._minimum or int(self.limit) < 2:
            self._next_probe_at = now + 2 * self.window
            return
        self._probe_started = now
        self._probe_answers = 0
        self._probe_latencies = []
        self._note_limit(now)

    def _probe_share(self) -> float:
        count = self._probe_count
        return self._probe_slow / count if count >= _PROBE_SAMPLES / 2 else 0.0

    def _end_probe(self, now: float) -> None:
        started = self._probe_started
        latencies = self._probe_latencies
        if started is not None and 2 * len(latencies) >= _PROBE_SAMPLES:
            self._supersede(started, self.current(), latencies)
        self._probe_latencies = []
        self._round_size = round_size_for_noise(
            max(self._pool_slow_share, self._probe_share())
        )
        self._probe_started = None
        # Before the samples it brought expire (two windows).
        self._next_probe_at = now + 2 * self.window
        self._note_limit(now)
        self._dirty = True

    def on_sent(self, now: float, in_flight: int) -> None:
        """Note a request sent at *now* with *in_flight* requests of the scope
        in flight, itself included: the load its answer will have measured.

        Optional: without it, the load is estimated from the limit at the
        time the request was sent.
        """
        self._sends.append((now, in_flight))

    def _level_at(self, sent: float, in_flight: int) -> int:
        """Requests in flight when a request sent at *sent* left."""
        sends = self._sends
        for index in range(len(sends) - 1, -1, -1):
            when, level = sends[index]
            if when <= sent:
                return level
        # Not noted (or too old): at most the limit of the time, and at most
        # what is in flight now if the limit was not in use.
        sent_limit = self._limit_at(sent)
        return in_flight if in_flight < sent_limit else sent_limit

    def _limit_at(self, when: float) -> int:
        """The whole limit at time *when* (the oldest one kept if earlier)."""
        history = self._limits
        for index in range(len(history) - 1, -1, -1):
            changed_at, value = history[index]
            if changed_at <= when:
                return value
        return history[0][1] if history else self.current()

    def _note_limit(self, now: float) -> None:
        """Record the whole limit if it changed (for :meth:`_limit_at`)."""
        value = self.current()
        history = self._limits
        if not history or history[-1][1] != value:
            history.append((now, value))

    def _threshold(self, best: float) -> float:
        return max(best * self.tolerance, best + self.resolution)

    # -- the baseline -----------------------------------------------------------

    def _record(self, now: float, latency: float, in_flight: int) -> None:
        # The load a request met is what was in flight when it was sent: at
        # most the whole limit then (requests in flight when it answers may
        # have been sent later, into a different queue).
        level = self._level_at(now - latency, in_flight)
        level = 1 if level < 1 else min(level, _MAX_LEVEL)
        samples = self._levels.get(level)
        if samples is None:
            samples = self._levels[level] = deque(maxlen=_LEVEL_SAMPLES)
        samples.append((now, latency))
        # Sorted again when the baseline is next computed, and only this level.
        self._sorted.pop(level, None)
        self._deviations.pop(level, None)
        if level <= self._baseline_level + 1:
            self._dirty = True

    def _supersede(self, started: float, level: int, probe: list[float]) -> None:
        """Drop the samples a probe round shows to be stale.

        The probe's answers (to requests sent since *started*, at most
        *level* in flight) are the host's latency at low load now. Older
        samples from levels up to *level* measured the same load or less;
        if far more than half of them are slower than the probe's median
        (beyond ``_Z`` standard errors of a sign test: noise alone puts half
        of them there), the host is faster now than when they were taken,
        and every sample from before the probe goes. Slow start's answers
        are like that: few per level, the crawl's first, paying for new
        connections and a crawler starting up; left in the pool for their
        two windows, they held the baseline at about 2x the unloaded median
        on the bimodal and heavy-tailed hosts.
        """
        probe.sort()
        median = _median(probe)
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
        if share <= 0.5 + _Z * 0.5 * math.sqrt(1 / older + 1 / len(probe)):
            return
        for samples in self._levels.values():
            kept = [(t, x) for t, x in samples if t - x >= started]
            samples.clear()
            samples.extend(kept)
        self._sorted.clear()
        self._deviations.clear()
        self._dirty = True

    def _update_baseline(self, now: float) -> None:
        """Recompute the baseline from the lowest in-flight levels.

        Levels are pooled from the lowest up while the next one's median is
        not significantly above the pool's (latency rising with in-flight
        requests is a queue; noise does not depend on them), until the pool
        holds ``_POOL`` samples. Significance is measured against the spread
        of latency *within* levels: the host's noise, whatever its load.
        """
        self._dirty = False
        self._updated_at = now
        horizon = now - 2 * self.window
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
                    center = math.log(_median(latencies))
                    known = cached[level] = [
                        math.log(value) - center for value in latencies
                    ]
                deviations.extend(known)
        if not by_level:
            return
        spread = _MIN_SPREAD
        if len(deviations) >= 4:
            deviations.sort()
            count = len(deviations)
            spread = max(
                _MIN_SPREAD,
                (deviations[(3 * count) // 4] - deviations[count // 4]) / 1.349,
            )
        self._spread = spread
        pool: list[float] = []
        top = 0
        for level, latencies in by_level:
            if pool:
                error = (
                    _Z
                    * _MEDIAN_EFFICIENCY
                    * spread
                    * math.sqrt(1 / len(pool) + 1 / len(latencies))
                )
                if math.log(_median(latencies)) - math.log(_median(pool)) > error:
                    break
            pool.extend(latencies)
            pool.sort()
            top = level
            if len(pool) >= _POOL:
                break
        self._set_baseline(_median(pool), pool, top)

    def _speedup_factor(self, count: int) -> float:
        error = _Z * 1.5 * _MEDIAN_EFFICIENCY * self._spread / math.sqrt(count)
        return min(_SPEEDUP, math.exp(-error))

    def _set_baseline(self, baseline: float, pool: list[float], level: int) -> None:
        """Take *baseline* and the noise of the sorted *pool* behind it."""
        self.best = baseline
        self._baseline_level = level
        self._baseline_samples = len(pool)
        count = len(pool)
        threshold = self._threshold(baseline)
        lower = baseline + (threshold - baseline) / 2
        slow_share = (count - bisect_right(pool, threshold)) / count
        self._pool_slow_share = slow_share
        self._round_size = round_size_for_noise(max(slow_share, self._probe_share()))
        self._steady = bisect_right(pool, lower) == count

    def _rebaseline(
        self,
        now: float,
        baseline: float,
        latencies: list[float],
        *,
        slower: bool = False,
    ) -> None:
        """The host itself changed speed: start the baseline over."""
        self._levels.clear()
        self._sorted.clear()
        self._deviations.clear()
        level = max(1, int(self.limit))
        samples: deque[tuple[float, float]] = deque(maxlen=_LEVEL_SAMPLES)
        samples.extend((now, latency) for latency in latencies)
        self._levels[level] = samples
        self._set_baseline(baseline, latencies, level)
        # Established: the next pools must come from levels as low as this
        # round's, or show another change of speed.
        self._baseline_samples = max(self._baseline_samples, _POOL)
        self._slow_round_median = None
        self._flat = 0
        self._faster = []
        # The host changed: what was too many before says nothing now.
        self._failed_level = 0
        if slower:
            # Three decreases found nothing to fix: the limit the slower
            # host needs is found again by slow start.
            self._slow_start = True
        self.rebaseline_count += 1

    # -- answers ------------------------------------------------------------------

    def on_response(self, now: float, latency: float, in_flight: int) -> None:
        """Adapt to one normal answer.

        :param now: the current time.
        :param latency: the answer's latency in seconds.
        :param in_flight: requests of the scope in flight, including the one
            that just answered.
        """
        if not 0 < latency < math.inf:
            return
        self.last_latency = latency
        self._record(now, latency, in_flight)
        self._faster.append((now, latency))
        started = self._probe_started
        if started is not None:
            if now - latency >= started:
                self._probe_answers += 1
                self._probe_latencies.append(latency)
                # Probe answers are unloaded: their share above the threshold
                # is the noise a round must beat, whatever error the
                # baseline's own estimate has (a baseline that came out low
                # makes more of them slow).
                if self.best is not None and latency > self._threshold(self.best):
                    self._probe_slow += 1.0
                self._probe_count += 1.0
                if self._probe_count > _PROBE_MEMORY:
                    self._probe_slow /= 2
                    self._probe_count /= 2
            if self._probe_answers >= _PROBE_SAMPLES or now - started > max(
                1.0, 20 * (self.best or 0.0)
            ):
                self._end_probe(now)
        if self._baseline_samples < _POOL or now - self._updated_at > self.window:
            # Too few samples yet for a stable median: every one counts.
            self._update_baseline(now)
        best = self.best
        assert best is not None

        limit = self.limit
        sent = now - latency
        counted = sent >= self._mark
        threshold = self._threshold(best)
        if latency <= threshold:
            band = threshold - best
            step = 2.0 * (threshold - latency) / band if 0 < band < math.inf else 1.0
            if step < 1.0 and counted:
                self._upper += 1
            if step < 1.0 and self._slow_start and self._queue_forming():
                self._slow_start = False
            # int(limit) is current(): the limit always lies within its bounds.
            if (
                limit < self._maximum
                and in_flight >= int(limit) - 1
                and (self._slow_start or sent >= self._raised_at)
            ):
                step = min(step, 1.0)
                if self._slow_start:
                    grown = limit + step
                else:
                    if (
                        int(limit) + 1 >= self._failed_level
                        and now - self._failed_at <= self.window
                    ):
                        # Just below the level whose round was slow: approach
                        # it slowly (TCP CUBIC's plateau), so the limit does
                        # not spend every other round there.
                        step *= _NEAR_FAILED
                    grown = limit + step / limit
                if grown >= self._maximum:
                    grown = float(self._maximum)
                raised = int(grown) > int(limit)
                self.limit = limit = grown
                if raised:
                    self._raised_at = now
                    self._note_limit(now)
                self.increase_count += 1
            if counted:
                self._fast += 1
                self._round_latencies.append(latency)
                if 2 * self._fast > self._round_target():
                    self._end_round(now, slow=False)
        else:
            if counted:
                self._upper += 1
            if self._slow_start and self._queue_forming():
                self._slow_start = False
            if counted:
                self._count_slow(now, latency)

    def _queue_forming(self) -> bool:
        # On a steady host one answer in the upper half of the band is a
        # queue forming; on a noisy one, half of the round's answers.
        return self._steady or 2 * self._upper > self._fast + self._slow

    def _round_target(self) -> int:
        size = self._round_size
        limit = int(self.limit)
        return limit if limit > size else size

    def on_error_response(self, now: float, latency: float) -> None:
        """Adapt to an error page (e.g. 404, 500; not a backoff code).

        It never raises the limit nor makes the baseline (error pages are
        often much faster than real pages), but a slow one still counts as a
        slow answer of its round: the host is queueing whatever it answers.
        """
        if not 0 < latency < math.inf:
            return
        self.last_latency = latency
        best = self.best
        if (
            best is not None
            and latency > self._threshold(best)
            and now - latency >= self._mark
        ):
            self._upper += 1
            self._count_slow(now, latency)

    def _count_slow(self, now: float, latency: float) -> None:
        self._slow += 1
        self._round_latencies.append(latency)
        if 2 * self._slow >= self._round_target():
            self._end_round(now, slow=True)

    def _end_round(self, now: float, *, slow: bool) -> None:
        latencies = self._round_latencies
        if slow:
            self._slow_start = False
            limit = limit_before = self.limit
            # x0.9, but at least one request less: at small limits a tenth
            # is less than the +1 a round of growth adds back.
            limit = limit * 0.9 if limit >= 10.0 else limit - 1.0
            minimum = float(self._minimum)
            self.limit = limit if limit > minimum else minimum
            self._note_limit(now)
            self._failed_level = int(limit_before)
            self._failed_at = now
            self.decrease_count += 1
            self._faster = []
            if self._fast > _MOSTLY_SLOW_FAST_SHARE * (self._fast + self._slow):
                self._slow_round_median = None
                self._flat = 0
            else:
                latencies.sort()
                self._on_mostly_slow_round(now, latencies)
        else:
            self._slow_round_median = None
            self._flat = 0
            best = self.best
            faster = self._faster
            # Answers older than the window may mix two speeds of the host.
            if best is not None and faster and now - faster[0][0] <= self.window:
                if len(faster) >= _SPEEDUP_SAMPLES:
                    # Every answer since the last slow round, not only those
                    # that ended a round (the fastest of a burst arrive
                    # first).
                    values = sorted(latency for _, latency in faster)
                    # Three quarters of them below the baseline (and beyond
                    # its noise): the host sped up (e.g. the end of a
                    # slowdown). Noise alone puts half of them there.
                    quartile = values[(3 * len(values)) // 4]
                    if quartile < best * self._speedup_factor(len(values)):
                        self._rebaseline(now, _median(values), values)
                    self._faster = []
            else:
                self._faster = []
            if self._dirty:
                self._update_baseline(now)
        self._mark = now
        self._fast = self._slow = self._upper = 0
        self._round_latencies = []
        if (
            not self._slow_start
            and self._probe_started is None
            and now >= self._next_probe_at
        ):
            self._start_probe(now)

    def _on_mostly_slow_round(self, now: float, latencies: list[float]) -> None:
        median = _median(latencies)
        previous = self._slow_round_median
        self._slow_round_median = median
        if previous is None or median < previous * _FLAT:
            self._flat = 0
            return
        self._flat += 1
        if self._flat >= _FLAT_ROUNDS:
            # Lowering the limit three rounds in a row did not bring the
            # latency down: the host is slower, not queueing our requests.
            self._rebaseline(now, median, latencies, slower=True)

    def on_overload(self, now: float) -> None:
        """Halve the limit on an explicit overload signal (429, 503, ...).

        At most once per baseline latency (the overload answers of one round
        count once); every overload starts a new round.
        """
        self.overload_count += 1
        self._slow_start = False
        if now >= self._last_overload + (self.best or 0.0):
            self.limit = max(float(self._minimum), self.limit / 2)
            self._note_limit(now)
            self._last_overload = now
        self._mark = now
        self._fast = self._slow = self._upper = 0
        self._round_latencies = []
        self._slow_round_median = None
        self._flat = 0
        if self._probe_started is not None:
            self._end_probe(now)

    def snapshot(self) -> dict[str, float | int | None]:
        """The state worth exporting per scope (the guide's diagnostic hook)."""
        return {
            "limit": self.limit,
            "current": self.current(),
            "best": self.best,
            "minimum": self._minimum,
            "maximum": self._maximum,
        }

    def __repr__(self) -> str:
        return (
            f"<LatencyLimit limit={self.limit:.2f} best={self.best}"
            f" bounds=[{self._minimum}, {self._maximum}]>"
        )
