"""Exponential backoff with stepwise recovery, for one scope.

Rule (the backoff section of Scrapy's throttling chapter, pull request #6931,
and ``record_backoff`` / ``_recover`` there):

* A trigger without a server-given delay grows the spacing between requests:
  ``delay = min(max_delay, max(min_delay, delay * delay_factor))``, then jitter.
  From a delay of 0 the first step is ``min_delay``; examples with factor 2 and
  ``min_delay`` 1: 1, 2, 4, 8 ...
* A server-given delay (``Retry-After``, ``RateLimit-Reset``) is a hard
  minimum: nothing is sent before it elapses (a *hold*), capped at
  ``max_delay`` unless told otherwise. It does not grow the spacing: the server
  said exactly how long to wait, and growing on top of that would wait twice.
* Recovery: after each full quiet ``window`` with no new trigger, one step back
  toward the base delay (``delay / delay_factor``); a new trigger restarts the
  countdown. A step that would fall below ``min_delay`` while the base is below
  it lands on the base directly, since the next step down from ``min_delay`` is
  the base.

Differences from the pull request, on purpose: the hard delay is a hold rather
than a new spacing (the pull request kept requests 120 s apart after a single
``Retry-After: 120`` until recovery), jitter is applied to an un-jittered
nominal delay so it does not compound across steps, and backoff never lowers
the spacing below the base delay (a base above ``max_delay`` stays in force).
The caller does not report a retry answered as its request was before as a
trigger, only its server-given delay (:meth:`BackoffState.hold`): one page a
server always fails would otherwise step the delay once per retry.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from .jitter import JitterRange, apply_jitter

__all__ = ["BackoffPolicy", "BackoffState"]


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """The tunables of :class:`BackoffState`, shared by every scope that uses them.

    :param delay_factor: growth per trigger and shrink per recovery step (>= 1).
    :param min_delay: the smallest backed-off delay, in seconds.
    :param max_delay: the largest grown delay and the cap of a capped hold.
    :param jitter: offsets applied to each grown or recovered delay.
    :param window: seconds of quiet per recovery step; <= 0 recovers at once.
    :raises ValueError: on a factor below 1, a negative or non-finite delay
        bound, an inverted jitter range or a NaN window.
    """

    delay_factor: float = 2.0
    min_delay: float = 1.0
    max_delay: float = 300.0
    jitter: JitterRange = (-0.1, 0.1)
    window: float = 60.0

    def __post_init__(self) -> None:
        # A factor below 1 would make backoff speed up and recovery slow down;
        # a factor of 0 would divide by zero during recovery.
        if not (math.isfinite(self.delay_factor) and self.delay_factor >= 1):
            raise ValueError(f"delay_factor must be >= 1, got {self.delay_factor!r}")
        for name in ("min_delay", "max_delay"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        low, high = self.jitter
        if not (math.isfinite(low) and math.isfinite(high) and low <= high):
            raise ValueError(f"jitter must be a (low, high) range, got {self.jitter!r}")
        if math.isnan(self.window):
            raise ValueError(f"window must be a number, got {self.window!r}")


class BackoffState:
    """Backoff level, delay and hold of one scope.

    All times are monotonic seconds passed in by the caller.

    :param policy: the tunables.
    :param base_delay: the scope's configured delay, the floor of recovery.
    :param uniform: the random source for jitter.

    Attributes:

    * ``level``: triggers not yet recovered (0 = not backing off).
    * ``nominal_delay``: the un-jittered current delay (the base at level 0).
    * ``delay``: the spacing to enforce between sends: the jittered nominal
      delay, within ``[0, max(max_delay, base_delay)]``; exactly the base at
      level 0.
    * ``hold_until``: nothing may be sent before this time (0.0 for none).
    * ``last_trigger``: start of the current recovery countdown, None when
      not backing off.
    * ``trigger_count``: all triggers ever.
    """

    __slots__ = (
        "_base_delay",
        "_uniform",
        "delay",
        "hold_until",
        "last_trigger",
        "level",
        "nominal_delay",
        "policy",
        "trigger_count",
    )

    def __init__(
        self,
        policy: BackoffPolicy,
        base_delay: float = 0.0,
        *,
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> None:
        self.policy = policy
        self._uniform = uniform
        self._base_delay = _non_negative(base_delay)
        self.level = 0
        self.nominal_delay = self._base_delay
        self.delay = self._base_delay
        self.hold_until = 0.0
        self.last_trigger: float | None = None
        self.trigger_count = 0

    @property
    def base_delay(self) -> float:
        """The delay recovery returns to (change it with :meth:`set_base_delay`)."""
        return self._base_delay

    def set_base_delay(self, delay: float) -> None:
        """Change the base delay (negative or NaN counts as 0).

        At level 0 the current delay follows it; during backoff the current
        delay is only raised to it (and kept within
        ``max(max_delay, base_delay)``), so that backoff keeps its ground.
        """
        base = self._base_delay = _non_negative(delay)
        if self.level == 0:
            self.nominal_delay = self.delay = base
        else:
            # Backoff keeps its ground, but only up to what it could reach on
            # its own: a lowered base that had held it above max_delay lets go.
            upper = max(self.policy.max_delay, base)
            self.nominal_delay = min(upper, max(self.nominal_delay, base))
            self.delay = min(upper, max(self.delay, base))

    def trigger(
        self,
        now: float,
        hard_delay: float | None = None,
        *,
        cap: bool = True,
        grow: bool = True,
    ) -> None:
        """Record one backoff trigger (a backoff response or exception).

        :param now: the current time.
        :param hard_delay: a server-given delay in seconds: hold every send
            until ``now + hard_delay`` without growing the delay.
        :param cap: cap *hard_delay* at ``max_delay``.
        :param grow: grow the delay when there is no *hard_delay*; False only
            counts the trigger (level and countdown), which rampup uses while
            it is within its target.
        """
        self.recover(now)
        self.level += 1
        self.last_trigger = now
        self.trigger_count += 1
        policy = self.policy
        if hard_delay is not None:
            self.hold(now, hard_delay, cap=cap)
        elif grow:
            nominal = min(
                policy.max_delay,
                max(policy.min_delay, self.nominal_delay * policy.delay_factor),
            )
            # A base above max_delay (e.g. a long Crawl-delay) stays in force.
            nominal = max(self._base_delay, nominal)
            self.nominal_delay = nominal
            self.delay = self._jittered(nominal)

    def hold(self, now: float, seconds: float, *, cap: bool = True) -> None:
        """Hold every send until ``now + seconds`` (capped at ``max_delay``
        with *cap*), without a trigger: no level, no new countdown (the
        server-given delay of an answer that is not a new trigger, such as
        a retry refused again)."""
        hold = min(seconds, self.policy.max_delay) if cap else seconds
        # `hold > 0` is also False for NaN, so a NaN hold is no hold.
        if hold > 0 and now + hold > self.hold_until:
            self.hold_until = now + hold

    def recover(self, now: float) -> int:
        """Apply the recovery steps due by *now*.

        :return: the number of backoff levels removed (0 when nothing changed).
        """
        level = self.level
        last = self.last_trigger
        if level == 0 or last is None:
            return 0
        policy = self.policy
        window = policy.window
        if window <= 0:
            self._reset()
            return level
        # The common case on the hot path: still inside the quiet window.
        if now - last < window:
            return 0
        base = self._base_delay
        factor = policy.delay_factor
        min_delay = policy.min_delay
        nominal = self.nominal_delay
        while level > 0 and now - last >= window:
            level -= 1
            last += window
            nominal = max(base, nominal / factor)
            if nominal < min_delay and base < min_delay:
                level = 0
        removed = self.level - level
        if level == 0:
            self._reset()
            return removed
        self.level = level
        self.last_trigger = last
        # Re-draw the jitter only when the nominal delay moved: a step that
        # keeps it (e.g. after hold-only triggers) should not reshuffle it.
        if nominal != self.nominal_delay:
            self.nominal_delay = nominal
            self.delay = self._jittered(nominal)
        return removed

    def wait(self, now: float) -> float:
        """Seconds until the hold ends (0.0 when there is none)."""
        return max(0.0, self.hold_until - now)

    def in_backoff(self, now: float) -> bool:
        """Whether backoff is in effect: a level to recover or a pending hold."""
        return self.level > 0 or self.hold_until > now

    def _reset(self) -> None:
        # The hold is left alone: it is an absolute time the server asked for,
        # and recovering the spacing does not shorten it.
        self.level = 0
        self.last_trigger = None
        self.nominal_delay = self.delay = self._base_delay

    def _jittered(self, nominal: float) -> float:
        policy = self.policy
        upper = max(policy.max_delay, self._base_delay)
        return min(upper, apply_jitter(nominal, policy.jitter, self._uniform))

    def __repr__(self) -> str:
        return (
            f"<BackoffState level={self.level} delay={self.delay:.3f}"
            f" nominal_delay={self.nominal_delay:.3f}"
            f" base_delay={self._base_delay:.3f} hold_until={self.hold_until:.3f}>"
        )


def _non_negative(value: float) -> float:
    # max() returns its first argument when the comparison is False, so NaN
    # becomes 0.0 as well.
    return max(0.0, float(value))
