"""How much one fast answer raises the latency limit.

Part of :class:`~scrapy_adaptive_throttle._algorithms.latency.LatencyLimit`,
whose module states when the limit grows at all (while it is used, on
answers to requests sent since it last went up); this one states by how much:

* The additive step is ``1 / limit`` (about +1 per round of requests, TCP's
  additive increase), and a whole request per answer in slow start
  (doubling the limit every round).
* **Growth slows down near the tolerance**: the full step for answers in the
  lower half of the band, tapering linearly to nothing at its top (on host B
  the median went from 76-83 ms, right at the tolerance of 77, to 74-75 ms at
  the same throughput). **And near the level whose round was last slow**
  (TCP CUBIC's plateau): for a window, growth towards that whole limit is 4x
  slower, so the limit does not spend every other round there. With the
  median baseline, host B's limit spent a third of its time at 4 (95 ms, for
  a tolerance of 75) and its median sat at 75.3 ms; with the plateau 64-65 ms
  at 0.97-0.98 of capacity (host model, three seeds).
"""

from __future__ import annotations

import math

__all__ = ["Plateau", "grown_limit", "growth_step"]

#: Growth speed towards the level whose round was last slow.
_NEAR_FAILED = 0.25


def growth_step(latency: float, best: float, threshold: float) -> float:
    """The share of a full step a fast answer earns: 1 or more in the lower
    half of the band from *best* to *threshold*, tapering to 0 at its top."""
    band = threshold - best
    return 2.0 * (threshold - latency) / band if 0 < band < math.inf else 1.0


def grown_limit(
    limit: float,
    step: float,
    *,
    slow_start: bool,
    plateau: bool,
    maximum: int,
) -> float:
    """The limit after a fast answer earned *step* (see :func:`growth_step`).

    In *slow_start* the answer adds up to a whole request; otherwise up to
    ``1 / limit``, four times less on a *plateau* (just below the level whose
    round was last slow, within a window). Never above *maximum*.
    """
    step = min(step, 1.0)
    if slow_start:
        grown = limit + step
    else:
        if plateau:
            # Just below the level whose round was slow: approach it slowly
            # (TCP CUBIC's plateau), so the limit does not spend every other
            # round there.
            step *= _NEAR_FAILED
        grown = limit + step / limit
    if grown >= maximum:
        grown = float(maximum)
    return grown


class Plateau:
    """The whole limit whose round was last slow, and when (TCP CUBIC's
    plateau, see :func:`grown_limit`).

    Attributes: ``level`` (0: none, or the host changed speed since) and
    ``at``.
    """

    __slots__ = ("at", "level")

    def __init__(self) -> None:
        self.level = 0
        self.at = -math.inf

    def failed(self, level: int, now: float) -> None:
        """A round at the whole limit *level* was slow at *now*."""
        self.level = level
        self.at = now

    def forget(self) -> None:
        """The host changed speed: what was too many before says nothing."""
        self.level = 0

    def near(self, limit: float, now: float, window: float) -> bool:
        """Whether *limit* grows towards the level last slow, within a
        *window* of it."""
        return int(limit) + 1 >= self.level and now - self.at <= window
