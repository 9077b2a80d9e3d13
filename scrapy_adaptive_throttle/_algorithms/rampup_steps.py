"""The steps of rampup: when and how far a window's verdict moves the rate.

The faster and slower steps of :class:`~.rampup.RampupState` (the rules in
the docstring of :mod:`~.rampup`): lower the delay while it limits the rate,
else add a concurrency slot; bisect toward the pace last found too fast;
probe past a known limit after quiet windows; undo the last faster step on
a count above the target. Kept apart from the window accounting so that
each reads on its own; the state they change is :class:`~.rampup.RampupState`'s.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .rampup import RampupPolicy

__all__ = ["RampupSteps"]

#: How many faster steps can be undone.
_HISTORY_LIMIT = 64
#: The most quiet windows spent at a known limit before probing past it.
_MAX_PATIENCE = 8
#: How far above ``latency / concurrency`` the delay must be to be the
#: bottleneck.
_BOUNDARY = 1.01


class RampupSteps:
    """The step rules, mixed into :class:`~.rampup.RampupState`."""

    # The state the steps change; RampupState's own slots hold the rest.
    __slots__ = (
        "_concurrency_held",
        "_delay_held",
        "_factor",
        "_history",
        "_patience",
        "_tentative",
        "_waited",
        "concurrency",
        "delay",
        "delay_floor",
        "faster_steps",
        "latency",
        "policy",
        "slower_steps",
        "too_fast_concurrency",
        "too_fast_delay",
    )

    policy: RampupPolicy
    delay: float
    concurrency: int
    delay_floor: float
    latency: float | None
    too_fast_delay: float | None
    too_fast_concurrency: int | None
    faster_steps: int
    slower_steps: int
    _delay_held: bool
    _concurrency_held: bool
    _factor: float
    _patience: int
    _waited: int
    _history: list[tuple[float, int]]
    _tentative: bool

    def _min_delay(self) -> float:
        return max(self.policy.min_delay, self.delay_floor)

    def _delay_limits(self) -> bool:
        """Whether the delay, rather than the concurrency, limits the rate."""
        if self.delay <= self._min_delay():
            return False
        if self.latency is None:
            return self._delay_held
        # At the boundary both limits bind and only a concurrency step (which
        # also lowers the delay) gains anything; the margin keeps rounding
        # from choosing the other.
        return self.delay * self.concurrency > self.latency * _BOUNDARY

    def _faster(self) -> bool:
        policy = self.policy
        before = (self.delay, self.concurrency)
        if self._delay_limits():
            tentative = self.too_fast_delay is not None
            delay = self._faster_delay()
            if delay is None:
                return False
            self.delay = max(self._min_delay(), delay)
        elif self._concurrency_held and (
            policy.max_concurrency is None or self.concurrency < policy.max_concurrency
        ):
            too_fast = self.too_fast_concurrency
            tentative = too_fast is not None
            if too_fast is not None and self.concurrency + 1 >= too_fast:
                if not self._probe_due():
                    return False
                self.too_fast_concurrency = None
            else:
                self._patience = 1
            self.concurrency += 1
            if self.latency is not None:
                # Make the new slot usable: a delay above latency / c would
                # keep the rate where it was.
                usable = max(self._min_delay(), self.latency / self.concurrency)
                self.delay = min(self.delay, usable)
        else:
            return False
        self._history.append(before)
        del self._history[:-_HISTORY_LIMIT]
        self._tentative = tentative
        self.faster_steps += 1
        return True

    def _faster_delay(self) -> float | None:
        """The delay of the next faster step (None: hold at a known limit)."""
        policy = self.policy
        delay = self.delay
        too_fast = self.too_fast_delay
        if too_fast is not None and too_fast >= delay:
            # Already past it (e.g. after a rebase): it no longer tells much.
            too_fast = self.too_fast_delay = None
        if too_fast is None:
            # Free search: steps double from where the last probe left them.
            lowered = delay * self._factor
            self._factor = max(policy.delay_factor, self._factor**2)
            self._patience = 1
            return lowered
        # (The margin keeps rounding from reading a failed probe of exactly
        # one finest step as a bracket still open.)
        if too_fast < delay * policy.finest_factor * (1 - 1e-9):
            return math.sqrt(delay * too_fast)
        if not self._probe_due():
            return None
        # Probe just past the known limit, in case it went up.
        self.too_fast_delay = None
        self._factor = policy.finest_factor
        return delay * policy.finest_factor

    def _probe_due(self) -> bool:
        """Count a quiet window at a known limit; say when to probe past it."""
        self._waited += 1
        if self._waited < self._patience:
            return False
        self._waited = 0
        self._patience = min(_MAX_PATIENCE, self._patience * 2)
        return True

    def _slower(self, latency: float | None) -> bool:
        policy = self.policy
        self._waited = 0
        self._tentative = False
        if self._history:
            delay, concurrency = self._history.pop()
            if concurrency < self.concurrency:
                self.too_fast_concurrency = self.concurrency
            else:
                self.too_fast_delay = self.delay
            self.delay, self.concurrency = delay, concurrency
        elif self.concurrency > policy.min_concurrency:
            self.too_fast_concurrency = self.concurrency
            self.concurrency -= 1
        else:
            # The starting point was already too fast: slow down from the
            # rate actually reached, by one delay_factor step (the bisection
            # then climbs back toward it). Slowing only to the rate the
            # server accepted was measured worse: a rate limiter's initial
            # burst allowance inflates it, and each extra round of refusals
            # costs a Retry-After pause.
            interval = self.delay
            if latency is not None:
                interval = max(interval, latency / self.concurrency)
            if interval <= 0:
                return False
            self.too_fast_delay = interval
            self.delay = interval / policy.delay_factor
        self.slower_steps += 1
        return True
