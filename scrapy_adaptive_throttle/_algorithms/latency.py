"""A concurrency limit that adapts to a host's latency (AIMD on latency).

Rule, from the guide "Adapting Crawl Rate to Host Latency"
(``shared/reference/000_3452b3576d47e7cc.txt``, sections 2 to 5 and its
decision figure "What should the limiter do with this response?"):

* A host's latency at low load is its service time; once requests queue at the
  host, latency rises before errors appear. So compare each latency with the
  host's *recent best*: at most ``best * tolerance`` → ``limit += 1 / limit``
  (about +1 per round of requests, TCP's additive increase); above it →
  ``limit * 0.9``.
* "Recent best" is the minimum over a sliding window that expires (the guide's
  ``record_latency``: the current and the previous window), so a permanent
  change of the host's speed becomes the new baseline within a few windows
  instead of a permanent emergency (the guide's figure "Host A slows down
  mid-crawl": 12 pages/s with a best kept forever, 82-86 with a window).
* An explicit overload (429/503, a backoff exception) halves the limit.

Additions to the guide, each for a measured or structural reason:

* The limit only grows while it is used (in-flight requests close to the
  limit): an idle scope must not inflate a limit it never tested.
* At most one decrease per round: after a decrease, no other decrease (slow
  answer or overload) until one recent-best latency has passed, so a burst of
  slow answers from one round of requests counts once (TCP's one decrease per
  round-trip).
* Zero, negative and non-finite latencies are ignored: a zero would become a
  best that every later answer exceeds, collapsing the limit for two windows.
"""

from __future__ import annotations

import math

__all__ = ["LatencyLimit"]


class LatencyLimit:
    """The adaptive concurrency limit of one scope.

    Times are monotonic seconds passed in by the caller.

    :param initial: the starting limit, clamped into ``[minimum, maximum]``.
    :param minimum: the floor of the limit (at least 1).
    :param maximum: the ceiling of the limit (raised to *minimum* if lower).
    :param tolerance: how much latency above the recent best counts as
        normal; a politeness setting (1.5 = at most ~50% added latency).
    :param window: seconds after which a best latency starts to expire.
    :raises ValueError: on a tolerance below 1 or a non-finite window.

    Attributes: ``limit`` (the fractional limit), ``tolerance``, ``window``,
    ``best`` (the recent best latency, None before the first sample),
    ``last_latency``, and the counters ``increase_count``, ``decrease_count``
    (slow answers) and ``overload_count`` (every overload signal).
    """

    __slots__ = (
        "_current_min",
        "_last_decrease",
        "_maximum",
        "_minimum",
        "_previous_min",
        "_window_start",
        "best",
        "decrease_count",
        "increase_count",
        "last_latency",
        "limit",
        "overload_count",
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
    ) -> None:
        if not (math.isfinite(tolerance) and tolerance >= 1):
            raise ValueError(f"tolerance must be >= 1, got {tolerance!r}")
        if not math.isfinite(window):
            raise ValueError(f"window must be a finite number, got {window!r}")
        self.tolerance = tolerance
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
        self._current_min: float | None = None
        self._previous_min: float | None = None
        self._window_start: float | None = None
        self._last_decrease = -math.inf

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

        if latency <= best * self.tolerance:
            limit = self.limit
            if limit < self._maximum and in_flight >= self.current() - 1:
                self.limit = min(float(self._maximum), limit + 1.0 / limit)
                self.increase_count += 1
        elif now >= self._last_decrease + best:
            self.limit = max(float(self._minimum), self.limit * 0.9)
            self._last_decrease = now
            self.decrease_count += 1

    def on_overload(self, now: float) -> None:
        """Halve the limit on an explicit overload signal (429, 503, ...)."""
        self.overload_count += 1
        if now >= self._last_decrease + (self.best or 0.0):
            self.limit = max(float(self._minimum), self.limit / 2)
            self._last_decrease = now

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
