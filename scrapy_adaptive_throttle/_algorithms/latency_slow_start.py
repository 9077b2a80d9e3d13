"""Slow start of the latency limit (TCP's).

Part of :class:`~scrapy_adaptive_throttle._algorithms.latency.LatencyLimit`,
whose module states the rules of its rounds; this one states when the limit
stops adding a whole request per fast answer:

* Until a queue forms, each fast answer adds a whole request instead of
  ``1 / limit``, doubling the limit every round (host A's 12 in about 0.15 s
  instead of 0.8 s: +1% to +10% of A's pages/s over a 2000-page crawl, no
  503).
* **A queue forming ends it**: one answer in the upper half of the tolerance
  band on a steady host (no unloaded answer there), half of the round's
  answers on a noisy one. A slow round or an overload ends it too, and a
  slowdown the limit could not fix starts it again (the limit the slower
  host needs is found again).
"""

from __future__ import annotations

from .latency_round import Round

__all__ = ["SlowStart"]


class SlowStart:
    """Whether the limit still doubles every round.

    Attribute: ``active`` (True until the first sign of a queue).
    """

    __slots__ = ("active",)

    def __init__(self, *, enabled: bool = True) -> None:
        self.active = enabled

    def answered_high(self, current_round: Round, *, steady: bool) -> None:
        """An answer in the upper half of the tolerance band or above came:
        end slow start if it shows a queue forming (see the module)."""
        if self.active and current_round.queue_forming(steady=steady):
            self.active = False

    def end(self) -> None:
        """A slow round or an overload: the host is queueing."""
        self.active = False

    def restart(self) -> None:
        """The host got slower: find the limit it needs again."""
        self.active = True
