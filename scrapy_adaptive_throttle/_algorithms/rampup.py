"""Rampup: probe for the fastest rate a scope tolerates, one step per window.

Rule (the rampup section of Scrapy's throttling chapter, pull request #6931),
counted per window of ``window`` seconds (:setting:`BACKOFF_WINDOW`):

* fewer backoff triggers than the low bound of the target -> one step
  *faster*: lower the delay by ``delay_factor`` while the delay is what limits
  the scope, else raise the concurrency by one, up to the ceiling;
* a count within ``[low, high]`` -> hold the current rate;
* a trigger that takes the count above ``high`` -> one step *slower* at once:
  undo the last faster step (or, with none to undo, one concurrency slot less,
  else the rate reached slowed by one ``delay_factor`` step).

Differences from the pull request, on purpose (PROTOCOL.md 2.6):

* *When the delay stops being the bottleneck.* With ``c`` requests in flight
  that each hold their slot ``latency`` seconds, a scope cannot send faster
  than one request per ``latency / c`` seconds whatever its delay; a delay
  below that limits nothing, so lowering it further is a wasted step. The
  delay is therefore lowered only while ``delay * c > latency`` (or, before
  any latency is known, while the delay gate actually held requests back);
  after that each step raises the concurrency, and lowers the delay to the
  new ``latency / c`` so that the extra slot is really usable. The latency is
  measured here, by Little's law (time-averaged requests in flight divided by
  completions per second), so it covers everything that holds a slot, not
  only the download. The pull request halved the delay forever when
  ``min_delay`` was 0, so concurrency never rose.
* *The upper bound of the target is used*: within the range the rate holds.
* *Idle windows cause no step*: a window in which nothing was sent, or in
  which neither the delay nor the concurrency limit ever held a request back,
  tested nothing, and stepping faster would inflate a limit nobody tried.
  Windows missed while idle are skipped, not caught up.
* *A gentle slower step.* Rather than an exponential backoff step (which with
  :setting:`BACKOFF_MIN_DELAY` 1 s throws a 50-requests/s scope down to one
  request per second for a whole window), a count above the target undoes the
  last faster step, and remembers the delay (or concurrency) that was too
  fast. The next faster steps then stop half-way (geometric mean) between the
  current delay and that one: a bisection that settles just under the limit.
  Once within ``finest_factor`` of it, the rate holds for a number of quiet
  windows (1, then 2, 4, up to 8 after each failed probe) before one step
  probes just past the known limit, so that a limit that was raised is found
  again without paying for a probe every window; a successful probe resumes
  the search with steps that double from ``finest_factor`` up to
  ``delay_factor``. A step toward a pace already found too fast (bisection or
  probe) is tentative: the trigger that *reaches* the top of the target
  undoes it (with the default target of 1, its first trigger), where a free
  step holds with that many. A failed probe then costs one refusal, not two,
  and every refusal behind a ``Retry-After`` pauses the scope.
  ``gentle=False`` keeps the exponential step (``bench/ratelimit.py``
  measures both).

Server-given waits (``Retry-After``) are the caller's to honour, whatever
rampup decides; the caller reports them with :meth:`RampupState.pause`, and
a window does not count the time the scope was held: a window measures
``window`` seconds in which the scope could send. Otherwise a ``Retry-After``
as long as the window would let only one trigger fit in each window, and a
target of 1 would hold, for good, a rate that is paused once per window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .rampup_steps import RampupSteps

__all__ = ["RampupPolicy", "RampupState"]


@dataclass(frozen=True, slots=True)
class RampupPolicy:
    """The tunables of :class:`RampupState`.

    :param target: ``(low, high)`` backoff triggers per window to aim for.
    :param delay_factor: the delay is multiplied by this on a faster step
        (0 < factor < 1).
    :param min_delay: rampup never lowers the delay below this.
    :param window: seconds per window (<= 0 disables rampup steps).
    :param min_concurrency: the concurrency rampup starts from and never
        goes below.
    :param max_concurrency: the ceiling of the concurrency (None: none).
    :param gentle: slow down by undoing the last faster step (True) or let
        the caller take an exponential backoff step (False).
    :param finest_factor: the finest delay step the search refines to.
    :raises ValueError: on an inverted or negative target, a factor outside
        (0, 1), a negative minimum delay or inconsistent concurrency bounds.
    """

    target: tuple[float, float] = (1.0, 1.0)
    delay_factor: float = 0.5
    min_delay: float = 0.0
    window: float = 60.0
    min_concurrency: int = 1
    max_concurrency: int | None = None
    gentle: bool = True
    finest_factor: float = 0.98

    def __post_init__(self) -> None:
        low, high = self.target
        if not (0 <= low <= high) or math.isnan(high):
            raise ValueError(
                f"target must be a (low, high) range >= 0, got {self.target!r}"
            )
        for name in ("delay_factor", "finest_factor"):
            value = getattr(self, name)
            if not 0 < value < 1:
                raise ValueError(f"{name} must be between 0 and 1, got {value!r}")
        if not (math.isfinite(self.min_delay) and self.min_delay >= 0):
            raise ValueError(
                f"min_delay must be finite and >= 0, got {self.min_delay!r}"
            )
        if math.isnan(self.window):
            raise ValueError(f"window must be a number, got {self.window!r}")
        if self.min_concurrency < 1:
            raise ValueError(
                f"min_concurrency must be >= 1, got {self.min_concurrency!r}"
            )
        if (
            self.max_concurrency is not None
            and self.max_concurrency < self.min_concurrency
        ):
            raise ValueError(
                f"max_concurrency ({self.max_concurrency!r}) is below "
                f"min_concurrency ({self.min_concurrency!r})"
            )


class RampupState(RampupSteps):
    """The delay and concurrency rampup has settled on for one scope.

    The caller feeds it what happens (:meth:`observe_send`,
    :meth:`observe_done`, :meth:`observe_hold`, :meth:`trigger`), calls
    :meth:`roll` before each decision to close finished windows, and enforces
    ``delay`` and ``concurrency``.

    :param policy: the tunables.
    :param delay: the starting delay (the scope's configured delay).
    :param concurrency: the starting concurrency (default: the policy's
        minimum, as the chapter documents).

    Attributes:

    * ``delay``, ``concurrency``: the current values to enforce.
    * ``delay_floor``: a delay the caller enforces anyway (e.g. a robots.txt
      Crawl-delay): rampup does not lower its delay below it.
    * ``window_start``: start of the current window (None until first use).
    * ``triggers``, ``sends``: counts in the current window.
    * ``latency``: how long a request holds its slot, averaged over the past
      windows (None: unknown yet).
    * ``too_fast_delay``, ``too_fast_concurrency``: the delay and the
      concurrency last found too fast (None: none known).
    * ``faster_steps``, ``slower_steps``: steps taken so far.
    """

    __slots__ = (
        "_active",
        "_area",
        "_dones",
        "_last_change",
        "_paused_until",
        "_settle_until",
        "sends",
        "triggers",
        "window_start",
    )

    def __init__(
        self, policy: RampupPolicy, delay: float = 0.0, concurrency: int | None = None
    ) -> None:
        self.policy = policy
        self.delay = max(0.0, float(delay))
        self.delay_floor = 0.0
        self.concurrency = self._clamp(
            policy.min_concurrency if concurrency is None else concurrency
        )
        self.window_start: float | None = None
        self.triggers = 0
        self.sends = 0
        self._delay_held = False
        self._concurrency_held = False
        self.latency: float | None = None
        self._active = 0
        self._area = 0.0
        self._dones = 0
        self._last_change: float | None = None
        self.too_fast_delay: float | None = None
        self.too_fast_concurrency: int | None = None
        self._factor = policy.delay_factor
        self._patience = 1
        self._waited = 0
        self._history: list[tuple[float, int]] = []
        self._settle_until = -math.inf
        self._tentative = False
        self._paused_until = -math.inf
        self.faster_steps = 0
        self.slower_steps = 0

    # -- observations -----------------------------------------------------

    def observe_send(self, now: float, active: int) -> None:
        """A request was sent; *active* requests are in flight now."""
        self.roll(now)
        self._integrate(now, active)
        self.sends += 1

    def observe_done(self, now: float, active: int) -> None:
        """A request finished; *active* requests are in flight now."""
        self.roll(now)
        self._integrate(now, active)
        self._dones += 1

    def observe_hold(
        self, now: float, *, delay: bool = False, concurrency: bool = False
    ) -> None:
        """A request was held back by the delay and/or the concurrency limit.

        Only such windows test the current rate (see the module docstring).
        """
        self.roll(now)
        if delay:
            self._delay_held = True
        if concurrency:
            self._concurrency_held = True

    def pause(self, now: float, until: float) -> None:
        """The scope may send nothing before *until* (a server-given wait).

        The current window is extended by the part of the pause that is not
        already covered by an earlier one.
        """
        start = max(now, self._paused_until)
        if until <= start:
            return
        self._paused_until = until
        if self.window_start is not None:
            self.window_start += until - start

    def _integrate(self, now: float, active: int) -> None:
        # Little's law: the area under "requests in flight" over time,
        # divided by the completions, is the average time in flight.
        last = self._last_change
        if last is not None and now > last:
            self._area += self._active * (now - last)
        self._last_change = now
        self._active = active

    def _window_latency(self) -> float | None:
        if self._dones:
            return self._area / self._dones
        return self.latency

    def trigger(self, now: float) -> bool:
        """Count one backoff trigger; take a slower step above the target.

        :return: False when the caller should take an exponential backoff
            step instead (a count above the target with ``gentle=False``, or
            nothing left to slow down gently); True when rampup handled it
            (the caller only honours server-given waits).
        """
        self.roll(now)
        if now < self._settle_until:
            # Sent before the last slower step: it says nothing of the new rate.
            return True
        self.triggers += 1
        high = self.policy.target[1]
        if self._tentative:
            # A step toward a pace already found too fast must stay below
            # the top of the target to be kept.
            high = max(high, 1.0) - 1.0
        if self.triggers <= high:
            return True
        if not self.policy.gentle:
            self._restart(now)
            return False
        self._integrate(now, self._active)
        latency = self._window_latency()
        slowed = self._slower(latency)
        self._restart(now)
        self._settle_until = now + (latency or 0.0)
        return slowed

    # -- external changes -----------------------------------------------------

    def set_delay(self, delay: float) -> None:
        """Rebase on a delay set from outside (e.g. ``set_scope_delay``)."""
        self.delay = max(0.0, float(delay))
        self.too_fast_delay = None
        self._factor = self.policy.delay_factor
        self._history.clear()

    def set_concurrency(self, concurrency: int) -> None:
        """Rebase on a concurrency set from outside (e.g. a Crawl-delay)."""
        self.concurrency = self._clamp(concurrency)
        self.too_fast_concurrency = None
        self._history.clear()

    # -- windows --------------------------------------------------------------

    def roll(self, now: float) -> int:
        """Close the windows that ended by *now*, stepping faster if due.

        :return: 1 when a faster step was taken, else 0.
        """
        start = self.window_start
        if start is None:
            self.window_start = now
            return 0
        window = self.policy.window
        if window <= 0 or now - start < window:
            return 0
        self._integrate(now, self._active)
        if self._dones:
            sample = self._area / self._dones
            self.latency = (
                sample if self.latency is None else (self.latency + sample) / 2
            )
        stepped = 0
        # A window that ended without a slower step accepted the last step.
        self._tentative = False
        if self.triggers < self.policy.target[0] and self._tested():
            stepped = int(self._faster())
        # Windows after the first one saw nothing (any activity would have
        # closed them earlier): they are skipped, not stepped.
        start += ((now - start) // window) * window
        if now - start >= window:  # floor division of floats can land short
            start += window
        self._restart(start)
        return stepped

    def _tested(self) -> bool:
        return self.sends > 0 and (self._delay_held or self._concurrency_held)

    def _restart(self, start: float) -> None:
        self.window_start = start
        self.triggers = 0
        self.sends = 0
        self._delay_held = False
        self._concurrency_held = False
        self._area = 0.0
        self._dones = 0

    def _clamp(self, concurrency: int) -> int:
        policy = self.policy
        value = max(policy.min_concurrency, int(concurrency))
        if policy.max_concurrency is not None:
            value = min(value, policy.max_concurrency)
        return value

    def __repr__(self) -> str:
        return (
            f"<RampupState delay={self.delay:.4f} concurrency={self.concurrency}"
            f" triggers={self.triggers} sends={self.sends}"
            f" too_fast_delay={self.too_fast_delay}>"
        )
