"""A concurrency limit that adapts to a host's latency (AIMD on latency).

Rule, from the guide "Adapting Crawl Rate to Host Latency"
(``shared/reference/000_3452b3576d47e7cc.txt``, sections 2 to 5 and its
decision figure "What should the limiter do with this response?"):

* A host's latency at low load is its service time; once requests queue at the
  host, latency rises before errors appear. So compare each latency with the
  host's *recent best*: an answer within ``best * tolerance`` raises the limit
  by ``1 / limit`` (about +1 per round of requests, TCP's additive increase);
  slower answers multiply it by 0.9.
* "Recent best" is the minimum over a sliding window that expires (the guide's
  ``record_latency``: the current and the previous window), so a permanent
  change of the host's speed becomes the new baseline instead of a permanent
  emergency (the guide's figure "Host A slows down mid-crawl": 12 pages/s with
  a best kept forever, 82-86 with a window).
* An explicit overload (429/503, a backoff exception) halves the limit.

Changes to the guide, each for a measured or structural reason:

* **The limit only grows while it is used** (in-flight requests close to the
  limit): an idle scope must not inflate a limit it never tested. And it only
  grows on answers to requests sent since the whole-number limit last went
  up: older answers tested the lower limit, and counting them let the limit
  run a round ahead of what the host was seen to take (on host B, 2 x 50 ms,
  half the crawl at a limit of 4, whose 100 ms latencies pushed the median
  past the tolerance).
* **Slow start** (TCP's): until the first answer outside the lower half of
  the tolerance band, the first slow round or the first overload, each fast
  answer adds a whole request instead of ``1 / limit``, doubling the limit
  every round, so a crawl that starts at 2 reaches host A's 12 in about
  0.15 s instead of 0.8 s (measured: +1% to +10% of A's pages/s over a
  2000-page crawl, no 503). The first answer that shows a queue forming at
  the host ends it, before the queue gets long.
* **Growth slows down near the tolerance**: the full ``1 / limit`` step for
  answers in the lower half of the tolerance band (up to ``best * (1 +
  (tolerance - 1) / 2)``), tapering linearly to nothing at its top. The limit
  approaches the level it should keep instead of overshooting it every round;
  measured on host B, the median latency went from right at the tolerance
  (76-83 ms for 77) to 74-75 ms at the same throughput.
* **A decrease needs a slow round, not one slow answer.** Answers are counted
  in rounds: the answers to requests sent after the last decision (``now -
  latency`` tells when a request was sent). When half of a round's ``limit``
  answers are slow the limit is multiplied by 0.9 (below 10, lowered by one:
  a tenth of a small limit is less than what one round of growth adds back);
  when more than half are within the tolerance, the round ends without a
  decrease. Measured with Scrapy on 2 shared cores, one answer in ten is
  slow for reasons on the crawler's side (its event loop was busy when the
  answer arrived; p90 is 1.4x p50 with no request queued at the host), and
  the guide's per-answer rule turned that noise into decreases, holding host
  A at a limit of 10-11 and 0.8 of its capacity. Deciding on the round's
  majority follows the median, which is also what the tolerance promises: at
  the settled limit the median latency stays within the tolerance of the
  best. Only answers to requests sent after the last decision count, so a
  queue that built up before a decrease, draining as a burst of slow answers,
  is counted once (TCP's one decrease per round trip).
* **A slowdown the limit cannot fix becomes the baseline at once.** When
  every answer of three rounds in a row is slow, and the fastest answer of a
  round did not get faster (by 5%) after the limit was lowered, the latency is
  not a queue this crawler causes: the host itself got slower. Its fastest
  recent answer then becomes the best latency, without waiting for the window
  to expire. The guide's one-second window lost 15-18% of the throughput of a
  3-second slowdown while every answer looked slow against the old best; this
  takes three rounds. A queue the crawler causes shrinks when the limit
  does, and never triggers it.
* **A resolution**: an answer is only slow when it is also ``resolution``
  seconds above the best. The crawler measures latency on its own event
  loop, which adds milliseconds of noise that grow with its load; for a host
  answering in 1.5 ms, the tolerance of 1.5 is 0.75 ms, far inside that
  noise, and the limit stayed at 3 (0.7-0.85 of the throughput of a fixed
  limit of 16, with no queue at the host at all).
* **An overload halves the limit once per round**: at most once per recent
  best latency, so the burst of 503s shed from one round counts once; and it
  starts a new round.
* **An error page** (a status that is not a backoff code, e.g. 404 or 500)
  never raises the limit nor sets the best latency, because error pages are
  often much faster than real pages; a slow one still counts as slow.
* Zero, negative and non-finite latencies are ignored: a zero would become a
  best that every later answer exceeds, collapsing the limit for two windows.
"""

from __future__ import annotations

import math

__all__ = ["LatencyLimit"]

#: A round whose fastest answer is at least this share of the previous round's
#: fastest answer did not get faster: lowering the limit did not help.
_FLAT = 0.95
#: Rounds in a row that did not get faster (after a first all-slow round)
#: before the recent best is replaced.
_FLAT_ROUNDS = 2


class LatencyLimit:
    """The adaptive concurrency limit of one scope.

    Times are monotonic seconds passed in by the caller.

    :param initial: the starting limit, clamped into ``[minimum, maximum]``.
    :param minimum: the floor of the limit (at least 1).
    :param maximum: the ceiling of the limit (raised to *minimum* if lower).
    :param tolerance: how much latency above the recent best counts as
        normal; a politeness setting (1.5 = at most ~50% added latency).
    :param window: seconds after which a best latency starts to expire.
    :param resolution: the smallest added latency (seconds) that counts as
        slow, whatever the tolerance: differences below the noise of the
        crawler's own measurements say nothing about the host.
    :param slow_start: start by doubling the limit every round until the
        first sign of a queue (TCP's slow start).
    :raises ValueError: on a tolerance below 1, a non-finite window or a
        negative resolution.

    Attributes: ``limit`` (the fractional limit), ``tolerance``, ``window``,
    ``best`` (the recent best latency, None before the first sample),
    ``last_latency``, and the counters ``increase_count`` (answers that
    raised the limit), ``decrease_count`` (slow rounds), ``overload_count``
    (every overload signal) and ``rebaseline_count`` (slowdowns taken as the
    new baseline).
    """

    __slots__ = (
        "_current_min",
        "_fast",
        "_flat",
        "_last_overload",
        "_mark",
        "_maximum",
        "_minimum",
        "_previous_min",
        "_raised_at",
        "_round_min",
        "_slow",
        "_slow_round_min",
        "_slow_start",
        "_window_start",
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
        self._current_min: float | None = None
        self._previous_min: float | None = None
        self._window_start: float | None = None
        self._last_overload = -math.inf
        # When the whole-number limit last went up: answers to requests sent
        # before then tested the lower limit and do not raise it further.
        self._raised_at = -math.inf
        # The current round: answers to requests sent since _mark.
        self._mark = -math.inf
        self._fast = 0
        self._slow = 0
        self._round_min = math.inf
        # The fastest answer of the previous all-slow round (None: the last
        # round was not all slow), and how many all-slow rounds in a row did
        # not get faster.
        self._slow_round_min: float | None = None
        self._flat = 0
        self._slow_start = slow_start

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
        """The whole number of requests allowed in flight."""
        return max(self._minimum, min(self._maximum, int(self.limit)))

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
        start = self._window_start
        if start is None:
            self._window_start = now
        elif now - start > self.window:
            # More than two windows without samples: the previous window's
            # minimum is older than a window too, and must go as well.
            fresh = now - start <= 2 * self.window
            self._previous_min = self._current_min if fresh else None
            self._current_min = None
            self._window_start = now
        current_min = self._current_min
        if current_min is None or latency < current_min:
            current_min = self._current_min = latency
        previous_min = self._previous_min
        best = (
            previous_min
            if previous_min is not None and previous_min < current_min
            else current_min
        )
        self.best = best

        limit = self.limit
        sent = now - latency
        threshold = max(best * self.tolerance, best + self.resolution)
        if latency <= threshold:
            band = threshold - best
            step = 2.0 * (threshold - latency) / band if band > 0 else 1.0
            if step < 1.0:
                self._slow_start = False
            # int(limit) is current(): the limit always lies within its bounds.
            if (
                limit < self._maximum
                and in_flight >= int(limit) - 1
                and (self._slow_start or sent >= self._raised_at)
            ):
                if self._slow_start:
                    grown = limit + 1.0
                else:
                    grown = limit + (step if step < 1.0 else 1.0) / limit
                if grown >= self._maximum:
                    grown = float(self._maximum)
                if int(grown) > int(limit):
                    self._raised_at = now
                self.limit = limit = grown
                self.increase_count += 1
            if sent >= self._mark:
                self._fast += 1
                if 2 * self._fast > int(limit):
                    self._end_round(now, slow=False)
        else:
            self._slow_start = False
            if sent >= self._mark:
                self._count_slow(now, latency)

    def on_error_response(self, now: float, latency: float) -> None:
        """Adapt to an error page (e.g. 404, 500; not a backoff code).

        It never raises the limit nor becomes the best latency (error pages
        are often much faster than real pages), but a slow one still counts
        as a slow answer of its round: the host is queueing whatever it
        answers.
        """
        if not 0 < latency < math.inf:
            return
        self.last_latency = latency
        best = self.best
        if (
            best is not None
            and latency > max(best * self.tolerance, best + self.resolution)
            and now - latency >= self._mark
        ):
            self._count_slow(now, latency)

    def _count_slow(self, now: float, latency: float) -> None:
        self._slow += 1
        self._round_min = min(self._round_min, latency)
        if 2 * self._slow >= int(self.limit):
            self._end_round(now, slow=True)

    def _end_round(self, now: float, *, slow: bool) -> None:
        if slow:
            self._slow_start = False
            limit = self.limit
            # x0.9, but at least one request less: at small limits a tenth
            # is less than the +1 a round of growth adds back.
            limit = limit * 0.9 if limit >= 10.0 else limit - 1.0
            minimum = float(self._minimum)
            self.limit = limit if limit > minimum else minimum
            self.decrease_count += 1
            if self._fast:
                self._slow_round_min = None
                self._flat = 0
            else:
                self._on_all_slow_round(now)
        else:
            self._slow_round_min = None
            self._flat = 0
        self._mark = now
        self._fast = self._slow = 0
        self._round_min = math.inf

    def _on_all_slow_round(self, now: float) -> None:
        fastest = self._round_min
        previous = self._slow_round_min
        self._slow_round_min = fastest
        if previous is None or fastest < previous * _FLAT:
            self._flat = 0
            return
        self._flat += 1
        if self._flat >= _FLAT_ROUNDS:
            # Lowering the limit three rounds in a row did not bring the
            # latency down: the host is slower, not queueing our requests.
            self._current_min = self.best = fastest
            self._previous_min = None
            self._window_start = now
            self._slow_round_min = None
            self._flat = 0
            self.rebaseline_count += 1

    def on_overload(self, now: float) -> None:
        """Halve the limit on an explicit overload signal (429, 503, ...).

        At most once per recent-best latency (the overload answers of one
        round count once); every overload starts a new round.
        """
        self.overload_count += 1
        self._slow_start = False
        if now >= self._last_overload + (self.best or 0.0):
            self.limit = max(float(self._minimum), self.limit / 2)
            self._last_overload = now
        self._mark = now
        self._fast = self._slow = 0
        self._round_min = math.inf
        self._slow_round_min = None
        self._flat = 0

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
