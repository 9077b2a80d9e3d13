"""Concurrency-limit strategies of a scope, behind one small interface.

Rule: a scope admits a request while fewer than :attr:`ConcurrencyLimit.limit`
of its requests are in flight (``None``: no scope limit). The *ceiling* is
the limit the configuration asks for (the scope's concurrency, a robots.txt
Crawl-delay, :meth:`ThrottlingManager.set_scope_concurrency`); a strategy may
enforce less:

* :class:`FixedLimit` enforces the ceiling itself (Scrapy's
  ``CONCURRENT_REQUESTS_PER_DOMAIN``);
* :class:`AdaptiveLimit` follows the host's latency under the ceiling
  (:class:`~.latency.LatencyLimit`, the guide "Adapting Crawl Rate to Host
  Latency");
* :class:`RampupLimit` moves the ceiling of another strategy as rampup
  (:class:`~.rampup.RampupState`, the pull request's chapter) decides, and
  with it the scope's delay, so latency adaptation within a rampup scope is
  ``RampupLimit(state, AdaptiveLimit(...))``.

Strategies take ``now`` and samples as arguments; the caller wakes waiters
when :attr:`~ConcurrencyLimit.limit` rises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .latency import LatencyLimit
from .rampup import RampupState

if TYPE_CHECKING:
    from .backoff import BackoffState
    from .delay_gate import DelayGate

__all__ = [
    "AdaptiveLimit",
    "ConcurrencyLimit",
    "FixedLimit",
    "RampupChange",
    "RampupLimit",
]


class ConcurrencyLimit(Protocol):
    """What a scope asks of its concurrency-limit strategy."""

    @property
    def limit(self) -> int | None:
        """The limit enforced now (``None``: no scope limit)."""

    @property
    def ceiling(self) -> int | None:
        """The highest limit the strategy may enforce (``None``: none)."""

    def set_ceiling(self, ceiling: int | None) -> None:
        """Set the ceiling (configuration, robots.txt, the manager's API)."""

    def on_sent(self, now: float, in_flight: int) -> None:
        """A request was sent; *in_flight* requests are in flight now."""

    def on_overload(self, now: float) -> None:
        """A backoff trigger (the host said it is overloaded)."""

    def on_response(
        self, now: float, latency: float, in_flight: int, *, error: bool
    ) -> bool:
        """A response that is not a backoff; return whether the limit changed."""


class FixedLimit:
    """The ceiling, enforced as it is (no adaptation)."""

    __slots__ = ("ceiling",)

    def __init__(self, ceiling: int | None) -> None:
        self.ceiling = ceiling

    @property
    def limit(self) -> int | None:
        return self.ceiling

    def set_ceiling(self, ceiling: int | None) -> None:
        self.ceiling = ceiling

    def on_sent(self, now: float, in_flight: int) -> None:
        pass

    def on_overload(self, now: float) -> None:
        pass

    def on_response(
        self, now: float, latency: float, in_flight: int, *, error: bool
    ) -> bool:
        return False

    def __repr__(self) -> str:
        return f"FixedLimit({self.ceiling})"


class AdaptiveLimit:
    """A limit that follows the scope's latency, between a floor and the ceiling.

    :param algorithm: the adaptive limit, built with *ceiling* as its maximum.
    :param ceiling: the initial ceiling (see :meth:`to_ceiling`).
    :param no_ceiling: the ceiling to use when the configuration sets none
        (``CONCURRENT_REQUESTS``: an adaptive limit always has a ceiling).
    """

    __slots__ = (
        "_ceiling",
        "_current",
        "_no_ceiling",
        "algorithm",
        "at_ceiling",
        "at_floor",
        "samples",
    )

    def __init__(
        self, algorithm: LatencyLimit, *, ceiling: int, no_ceiling: int
    ) -> None:
        self.algorithm = algorithm
        self._no_ceiling = no_ceiling
        self._ceiling = ceiling
        self._current = algorithm.current()
        # Latency samples, and those taken at the floor or at the ceiling: a
        # scope that spends most of its crawl at either bound is worth a look
        # (the guide's diagnostic hook).
        self.samples = 0
        self.at_floor = 0
        self.at_ceiling = 0

    @staticmethod
    def to_ceiling(value: int | None, no_ceiling: int) -> int:
        """The ceiling an adaptive limit enforces for a configured *value*."""
        return max(1, int(no_ceiling if value is None else value))

    @property
    def limit(self) -> int:
        return self._current

    @property
    def ceiling(self) -> int:
        return self._ceiling

    def set_ceiling(self, ceiling: int | None) -> None:
        algorithm = self.algorithm
        self._ceiling = self.to_ceiling(ceiling, self._no_ceiling)
        algorithm.set_bounds(algorithm.minimum, self._ceiling)
        self._current = algorithm.current()

    def set_limit(self, limit: int) -> None:
        """Enforce *limit* until the next adaptation (tests and tools)."""
        self._current = limit

    def on_sent(self, now: float, in_flight: int) -> None:
        # The in-flight count at send time is the load the answer's latency
        # measures (the baseline is made of the least loaded answers).
        self.algorithm.on_sent(now, in_flight)

    def on_overload(self, now: float) -> None:
        self.algorithm.on_overload(now)
        self._current = self.algorithm.current()

    def on_response(
        self, now: float, latency: float, in_flight: int, *, error: bool
    ) -> bool:
        algorithm = self.algorithm
        if error:
            # Error pages may lower the limit but never raise it.
            algorithm.on_error_response(now, latency)
        else:
            algorithm.on_response(now, latency, in_flight)
        current = algorithm.current()
        changed = current != self._current
        self._current = current
        self.samples += 1
        if current <= algorithm.minimum:
            self.at_floor += 1
        elif current >= self._ceiling:
            self.at_ceiling += 1
        return changed

    def __repr__(self) -> str:
        algorithm = self.algorithm
        return (
            f"AdaptiveLimit({self._current}: {algorithm.limit:.2f} in "
            f"[{algorithm.minimum}, {self._ceiling}])"
        )


@dataclass(frozen=True)
class RampupChange:
    """What one rampup decision changed (see :meth:`RampupLimit.apply`)."""

    old_delay: float
    delay: float
    old_concurrency: int | None
    concurrency: int | None
    faster_steps: int
    slower_steps: int


class RampupLimit:
    """Rampup's concurrency as the ceiling of an inner strategy, and its delay.

    Values set from outside (:meth:`set_ceiling`, :meth:`set_base_delay`, a
    floor) rebase rampup at once; :meth:`apply` hands back what rampup itself
    decided since the last call, for the caller to enforce on the delay.
    """

    __slots__ = ("_applied", "_steps", "inner", "state")

    def __init__(self, state: RampupState, inner: ConcurrencyLimit) -> None:
        self.state = state
        self.inner = inner
        #: The delay and concurrency rampup last enforced.
        self._applied: tuple[float, int | None] = (state.delay, state.concurrency)
        self._steps = (0, 0)

    @property
    def limit(self) -> int | None:
        return self.inner.limit

    @property
    def ceiling(self) -> int | None:
        return self.inner.ceiling

    def set_ceiling(self, ceiling: int | None) -> None:
        self.inner.set_ceiling(ceiling)
        value = self.inner.ceiling
        if value is not None and value != self._applied[1]:
            self.state.set_concurrency(value)

    def set_base_delay(self, delay: float) -> None:
        """A base delay set from outside becomes rampup's starting point."""
        if delay != self._applied[0]:
            self.state.set_delay(delay)

    def set_floor(self, floor: float) -> None:
        """A delay enforced anyway: rampup does not go below it."""
        self.state.delay_floor = floor

    def on_sent(self, now: float, in_flight: int) -> None:
        self.inner.on_sent(now, in_flight)
        self.state.observe_send(now, in_flight)

    def on_done(self, now: float, in_flight: int) -> None:
        self.state.observe_done(now, in_flight)

    def on_overload(self, now: float) -> None:
        self.inner.on_overload(now)

    def on_response(
        self, now: float, latency: float, in_flight: int, *, error: bool
    ) -> bool:
        return self.inner.on_response(now, latency, in_flight, error=error)

    def apply(self) -> RampupChange | None:
        """Enforce rampup's concurrency on the inner strategy and return what
        rampup changed since the last call (``None``: nothing)."""
        state = self.state
        delay, concurrency = state.delay, state.concurrency
        old_delay, old_concurrency = self._applied
        if delay == old_delay and concurrency == old_concurrency:
            return None
        self._applied = (delay, concurrency)
        self.inner.set_ceiling(concurrency)
        faster, slower = self._steps
        self._steps = (state.faster_steps, state.slower_steps)
        return RampupChange(
            old_delay=old_delay,
            delay=delay,
            old_concurrency=old_concurrency,
            concurrency=concurrency,
            faster_steps=state.faster_steps - faster,
            slower_steps=state.slower_steps - slower,
        )

    def check(
        self, now: float, backoff: BackoffState, gate: DelayGate, in_flight: int
    ) -> RampupChange | None:
        """Close finished windows, enforce what rampup decided on *backoff*
        and *gate*, and note what holds requests back; return the change."""
        state = self.state
        state.roll(now)
        change = self.enforce(now, backoff, gate)
        # Only a request held back by the delay or the concurrency that
        # rampup controls tests them; a server-given hold tests nothing, nor
        # does a lower limit under it (the adaptive one, whose ceiling
        # rampup's value is).
        delay_held = gate.next_send_at > now >= backoff.hold_until
        ceiling = self.ceiling
        concurrency_held = ceiling is not None and in_flight >= ceiling
        if delay_held or concurrency_held:
            state.observe_hold(now, delay=delay_held, concurrency=concurrency_held)
        return change

    def trigger(
        self, now: float, backoff: BackoffState, gate: DelayGate
    ) -> tuple[bool, RampupChange | None]:
        """Count a backoff trigger; return whether rampup slowed down for it
        (else the delay should grow exponentially) and what it changed."""
        slowed = self.state.trigger(now)
        return slowed, self.enforce(now, backoff, gate)

    def enforce(
        self, now: float, backoff: BackoffState, gate: DelayGate
    ) -> RampupChange | None:
        """Enforce rampup's delay on *backoff* and *gate* and its concurrency
        on the inner strategy, if it changed anything."""
        change = self.apply()
        if change is None:
            return None
        if change.delay != backoff.base_delay:
            backoff.set_base_delay(change.delay)
        if change.delay < change.old_delay:
            # The spacing of the last send was drawn from the old delay.
            spacing = gate.spacing(backoff.delay, backed_off=bool(backoff.level))
            gate.pull_in(now + spacing)
        return change

    def __repr__(self) -> str:
        return f"RampupLimit({self.state!r}, {self.inner!r})"
