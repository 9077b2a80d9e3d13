"""The state of one scope: where it is kept, and the typed snapshot of it.

A scope's state is its counters (:class:`ScopeCounters`: in flight, last
use), its delay gate (next send time), its backoff state (hold, level,
delay) and its quota window; the adaptive limit is its concurrency-limit
strategy. A :class:`ScopeStore` builds these parts for each scope;
:class:`LocalScopeStore` (this process's memory) is the default, so that a
shared backend can provide parts of its own (the same interfaces, kept
elsewhere) without touching the algorithms or the scope that drives them.
Today the Redis backend (``_shared_state.py``) works beside the local
parts, through the scope managers' ``next_spacing``, ``backoff_wait`` and
``refund_send``.

:class:`ScopeState` is a snapshot taken by
:meth:`~scrapy_adaptive_throttle.ThrottlingScopeManager.scope_state`;
:meth:`ScopeState.as_dict` is the ``get_state()`` dictionary the scope-manager
protocol documents, key for key.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ._algorithms import BackoffState, QuotaWindow
from ._algorithms.concurrency import AdaptiveLimit
from ._algorithms.delay_gate import DelayGate

if TYPE_CHECKING:
    from ._scope import Scope
    from ._settings import ScopeSettings
    from ._types import ScopeID

__all__ = [
    "AdaptiveLimitState",
    "LocalScopeCounters",
    "LocalScopeStore",
    "RampupSnapshot",
    "ScopeCounters",
    "ScopeParts",
    "ScopeState",
    "ScopeStore",
    "snapshot",
]


class ScopeCounters(Protocol):
    """The counters of one scope that are not an algorithm's own state."""

    #: Requests of the scope in flight.
    in_flight: int
    #: When the scope was last used (monotonic seconds; ``None``: never).
    last_seen: float | None


class LocalScopeCounters:
    """:class:`ScopeCounters` in this process's memory (the default)."""

    __slots__ = ("in_flight", "last_seen")

    def __init__(self) -> None:
        self.in_flight = 0
        self.last_seen: float | None = None


@dataclass(frozen=True)
class ScopeParts:
    """The state of one scope, part by part, as a :class:`ScopeStore` keeps it."""

    counters: ScopeCounters
    #: The next send time, the jitter and the floor.
    gate: DelayGate
    #: The backoff hold, level and delay.
    backoff: BackoffState
    #: The quota window (``None``: the scope has no quota).
    quota: QuotaWindow | None


class ScopeStore(Protocol):
    """Where the state of each scope is kept."""

    def parts(self, scope_id: ScopeID, config: ScopeSettings) -> ScopeParts:
        """The state of a new scope *scope_id* configured by *config*."""


class LocalScopeStore:
    """:class:`ScopeStore` in this process's memory (the default).

    :param uniform: the random source of the jitter.
    """

    def __init__(
        self, uniform: Callable[[float, float], float] = random.uniform
    ) -> None:
        self.uniform = uniform

    def parts(self, scope_id: ScopeID, config: ScopeSettings) -> ScopeParts:
        quota = config.quota
        return ScopeParts(
            counters=LocalScopeCounters(),
            gate=DelayGate(config.jitter, uniform=self.uniform),
            backoff=BackoffState(config.backoff, config.delay),
            quota=QuotaWindow(quota, config.window) if quota is not None else None,
        )


@dataclass(frozen=True)
class RampupSnapshot:
    """Rampup's window of a scope (see :ref:`rampup`)."""

    window_triggers: int
    latency: float | None
    too_fast_delay: float | None
    faster_count: int
    slower_count: int


@dataclass(frozen=True)
class AdaptiveLimitState:
    """The latency-adaptive limit of a scope (:class:`LatencyScopeManager`)."""

    limit_value: float
    floor: int
    ceiling: int
    best_latency: float | None
    last_latency: float | None
    latency_tolerance: float
    latency_window: float
    increase_count: int
    decrease_count: int
    overload_count: int
    rebaseline_count: int
    slow_start: bool
    probing: bool
    round_size: int
    latency_samples: int
    at_floor_share: float
    at_ceiling_share: float


@dataclass(frozen=True)
class ScopeState:
    """A snapshot of one scope's throttling state.

    Times are seconds of the throttler's clock; waits are seconds from the
    snapshot's time.
    """

    scope: ScopeID
    #: The scope manager's class name.
    manager: str
    #: The concurrency limit enforced now (``None``: none).
    limit: int | None
    in_flight: int
    #: The spacing between two sends now (grown by backoff).
    delay: float
    base_delay: float
    backoff_level: int
    #: Seconds left of the server-given (or ``delay_scope``) hold.
    backoff_wait: float
    backoff_count: int
    #: The robots.txt Crawl-delay floor (0.0: none).
    delay_floor: float
    #: Seconds until the delay gate opens.
    delay_wait: float
    #: ``(interval, accepted)`` of the pace learned from 429s, if any.
    learned_interval: float | None = None
    learned_accepted: float | None = None
    quota_consumed: float | None = None
    quota: float | None = None
    rampup: RampupSnapshot | None = None
    adaptive: AdaptiveLimitState | None = None

    def as_dict(self) -> dict[str, Any]:
        """The ``get_state()`` dictionary (the documented keys, as before)."""
        state: dict[str, Any] = {
            "scope": self.scope,
            "manager": self.manager,
            "limit": self.limit,
            "in_flight": self.in_flight,
            "delay": self.delay,
            "base_delay": self.base_delay,
            "backoff_level": self.backoff_level,
            "backoff_wait": self.backoff_wait,
            "backoff_count": self.backoff_count,
            "delay_floor": self.delay_floor,
        }
        if self.learned_interval is not None:
            state["learned_interval"] = self.learned_interval
            state["learned_accepted"] = self.learned_accepted
        if self.quota is not None:
            state["quota_consumed"] = self.quota_consumed
            state["quota"] = self.quota
        rampup = self.rampup
        if rampup is not None:
            state.update(
                rampup_window_triggers=rampup.window_triggers,
                rampup_latency=rampup.latency,
                rampup_too_fast_delay=rampup.too_fast_delay,
                rampup_faster_count=rampup.faster_count,
                rampup_slower_count=rampup.slower_count,
            )
        adaptive = self.adaptive
        if adaptive is not None:
            state.update(
                limit_value=adaptive.limit_value,
                floor=adaptive.floor,
                ceiling=adaptive.ceiling,
                best_latency=adaptive.best_latency,
                last_latency=adaptive.last_latency,
                latency_tolerance=adaptive.latency_tolerance,
                latency_window=adaptive.latency_window,
                increase_count=adaptive.increase_count,
                decrease_count=adaptive.decrease_count,
                overload_count=adaptive.overload_count,
                rebaseline_count=adaptive.rebaseline_count,
                slow_start=adaptive.slow_start,
                probing=adaptive.probing,
                round_size=adaptive.round_size,
                latency_samples=adaptive.latency_samples,
                at_floor_share=adaptive.at_floor_share,
                at_ceiling_share=adaptive.at_ceiling_share,
            )
        return state


def snapshot(scope: Scope, now: float, manager: str) -> ScopeState:
    """The state of *scope* at *now*; *manager* names its scope manager."""
    backoff = scope.backoff
    learned = scope.learned
    quota = scope.quota
    return ScopeState(
        scope=scope.id,
        manager=manager,
        limit=scope.limit.limit,
        in_flight=scope.counters.in_flight,
        delay=backoff.delay,
        base_delay=backoff.base_delay,
        backoff_level=backoff.level,
        backoff_wait=backoff.wait(now),
        backoff_count=backoff.trigger_count,
        delay_floor=scope.gate.floor,
        delay_wait=scope.gate.wait(now),
        learned_interval=learned.interval if learned is not None else None,
        learned_accepted=learned.accepted if learned is not None else None,
        quota_consumed=quota.consumed if quota is not None else None,
        quota=quota.quota if quota is not None else None,
        rampup=_rampup_snapshot(scope),
        adaptive=_adaptive_state(scope),
    )


def _rampup_snapshot(scope: Scope) -> RampupSnapshot | None:
    if scope.rampup is None:
        return None
    state = scope.rampup.state
    return RampupSnapshot(
        window_triggers=state.triggers,
        latency=state.latency,
        too_fast_delay=state.too_fast_delay,
        faster_count=state.faster_steps,
        slower_count=state.slower_steps,
    )


def _adaptive_state(scope: Scope) -> AdaptiveLimitState | None:
    adaptive = scope.strategy
    if not isinstance(adaptive, AdaptiveLimit):
        return None
    limit = adaptive.algorithm
    samples = adaptive.samples
    return AdaptiveLimitState(
        limit_value=limit.limit,
        floor=limit.minimum,
        ceiling=adaptive.ceiling,
        best_latency=limit.best,
        last_latency=limit.last_latency,
        latency_tolerance=limit.tolerance,
        latency_window=limit.window,
        increase_count=limit.increase_count,
        decrease_count=limit.decrease_count,
        overload_count=limit.overload_count,
        rebaseline_count=limit.rebaseline_count,
        slow_start=limit.in_slow_start,
        probing=limit.probing,
        round_size=limit.round_size,
        latency_samples=samples,
        at_floor_share=adaptive.at_floor / samples if samples else 0.0,
        at_ceiling_share=adaptive.at_ceiling / samples if samples else 0.0,
    )
