"""One scope, as one object composed of the pure parts.

A :class:`Scope` is a delay gate (base delay, floor, jitter:
:class:`~._algorithms.delay_gate.DelayGate`), a backoff state
(:class:`~._algorithms.BackoffState`), an optional quota window, an optional
pace learned from 429s, a concurrency-limit strategy
(:mod:`~._algorithms.concurrency`: fixed, latency-adaptive, either within
rampup) and its counters (:class:`~._scope_state.ScopeCounters`). It counts
stats and logs decisions; waking whoever waits for a raised limit is the
caller's, through *on_slots_raised*. The scope managers
(:class:`~scrapy_adaptive_throttle.ThrottlingScopeManager`,
:class:`~scrapy_adaptive_throttle.LatencyScopeManager`) are thin shells over it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ._algorithms import LearnedRate
from ._algorithms.concurrency import ConcurrencyLimit, RampupChange, RampupLimit
from ._decisions import refused_again
from ._scope_state import ScopeCounters, ScopeParts, ScopeState, snapshot

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

    from ._algorithms.ratelimit import LearnedState
    from ._settings import ScopeSettings
    from ._shared_pace import SharedPace
    from ._types import ScopeID

__all__ = ["Scope"]

logger = logging.getLogger(__name__)


class Scope:
    """The throttling state and rules of one scope.

    :param limit: the concurrency-limit strategy (wrapped by the caller in
        :class:`~._algorithms.concurrency.RampupLimit` for a rampup scope).
    :param on_slots_raised: called with the number of slots when the
        enforced limit rises.
    """

    def __init__(
        self,
        scope_id: ScopeID,
        config: ScopeSettings,
        *,
        limit: ConcurrencyLimit,
        parts: ScopeParts,
        total_concurrency: int,
        clock: Callable[[], float],
        on_slots_raised: Callable[[int], None],
        stats: StatsCollector | None = None,
        debug: bool = False,
    ) -> None:
        self.id = scope_id
        self.config = config
        self.limit = limit
        self.rampup = limit if isinstance(limit, RampupLimit) else None
        self.backoff = parts.backoff
        self.gate = parts.gate
        self.quota = parts.quota
        #: The pace learned from 429 answers; created by the first one, so
        #: that scopes never refused cost nothing.
        self.learned: LearnedRate | None = None
        #: The pace shared with other processes (:setting:`THROTTLING_STATE_URL`),
        #: set by the scope manager that builds this scope.
        self.shared_pace: SharedPace | None = None
        self.counters: ScopeCounters = parts.counters
        self.clock = clock
        self._on_slots_raised = on_slots_raised
        self._total_concurrency = total_concurrency
        self.stats = stats
        self.debug = debug
        #: Whether the limit already counted the answer that triggered the
        #: last backoff (halved for it): its latency is no sample. Cleared
        #: by that answer, or by the release of its request.
        self._answer_counted = False

    # -- time gates -------------------------------------------------------

    def can_send(self, now: float, amount: float | None = None) -> float:
        """Seconds until a request consuming *amount* may be sent (0 = now)."""
        gate = self.gate
        # Drawn for a send that did not happen: the state may change first.
        gate.forget_draw()
        backoff = self.backoff
        if backoff.level:
            self._recover(now)
        if self.rampup is not None:
            self._rampup_check(self.rampup, now)
        wait = max(gate.next_send_at - now, backoff.hold_until - now)
        if self.quota is not None:
            wait = max(wait, self.quota.wait(now, amount))
        return wait if wait > 0 else 0.0

    def record_sent(self, now: float, amount: float | None = None) -> None:
        """Record a send: start the delay, take a slot, consume quota."""
        counters = self.counters
        counters.last_seen = now
        counters.in_flight += 1
        backoff = self.backoff
        learned = self.learned
        # Paced on a schedule, so the crawler's lag does not add up.
        paced = None
        if learned is not None:
            shared = self.shared_pace
            processes = 1 if shared is None else shared.processes()
            paced = learned.record_send(now, processes=processes)
        self.gate.record_send(
            now, backoff.delay, backed_off=bool(backoff.level), paced_until=paced
        )
        if self.quota is not None:
            self.quota.consume(now, amount)
        self.limit.on_sent(now, counters.in_flight)

    def refund_send(
        self, sent_at: float, now: float, amount: float | None = None
    ) -> bool:
        """Give back what the cached send at *sent_at* took from the time gates."""
        if self.quota is not None and amount is not None and amount > 0:
            self.quota.reconcile(now, consumed=-amount)
        return self.gate.refund(sent_at, paced=self.learned is not None)

    def restamp_send(self, sent_at: float, now: float) -> bool:
        """Count the delay of the send at *sent_at* from *now*, when its
        request reached the downloader (see ``DelayGate.restamp``)."""
        return self.gate.restamp(sent_at, now)

    def next_spacing(self) -> float:
        """The spacing of the next send, drawn now and kept for it."""
        backoff = self.backoff
        return self.gate.draw(backoff.delay, backed_off=bool(backoff.level))

    def record_done(self, now: float) -> bool:
        """Free the slot of a finished request; return whether one was taken."""
        self._answer_counted = False
        counters = self.counters
        if counters.in_flight <= 0:
            return False
        counters.in_flight -= 1
        if self.rampup is not None:
            self.rampup.on_done(now, counters.in_flight)
        return True

    # -- backoff, delay, quota -----------------------------------------------

    def record_backoff(self, delay: float | None, now: float, cap: bool) -> None:
        """Apply a backoff trigger (see ``ThrottlingScopeManager.record_backoff``)."""
        self.counters.last_seen = now
        backoff = self.backoff
        if refused_again():
            # Not a new trigger (a retry answered as the request was before):
            # the server's hold only, if it gave one.
            if delay is not None:
                backoff.hold(now, delay, cap=cap)
            return
        if backoff.level:
            # Quiet windows that ended since the last send count before the
            # trigger (trigger() would apply them too, but unseen).
            self._recover(now)
        grow = True
        rampup = self.rampup
        if rampup is not None:
            before = self.limit.limit
            slowed, change = rampup.trigger(now, backoff, self.gate)
            if change is not None:
                self._raised(before)
                _count_rampup(self, change)
            grow = not slowed
        backoff.trigger(now, delay, cap=cap, grow=grow)
        if rampup is not None and backoff.hold_until > now:
            rampup.state.pause(now, backoff.hold_until)
        # The new spacing counts from now (the answer), not from the send
        # that earned it, so the next request waits the whole backed-off delay.
        self.gate.push_back(now + backoff.delay)
        self.limit.on_overload(now)
        self._answer_counted = True

    def backoff_wait(self, now: float) -> float:
        """Seconds until the scope may send again after a backoff trigger,
        read without side effects."""
        wait = max(self.gate.next_send_at, self.backoff.hold_until) - now
        return wait if wait > 0 else 0.0

    def _learned_rate(self) -> LearnedRate:
        learned = self.learned
        if learned is None:
            # The count starts now: the next refusal can be learned from.
            learned = self.learned = LearnedRate(window=self.config.backoff.window)
        return learned

    def record_rate_limited(
        self, now: float, sent_at: float | None, *, refused_before: bool = False
    ) -> None:
        """Learn the scope's pace from a refusal for too many requests (429);
        one of a request *refused_before* is only counted."""
        learned = self._learned_rate()
        before = learned.interval
        # What each probe will cost: this refusal's hold (its Retry-After).
        hold = self.backoff.hold_until - now
        shared = self.shared_pace
        if refused_before:
            if shared is not None:
                shared.refuse(now, sent_at, learn=False)
            learned.record_echo(now)
            return
        refusal = None if shared is None else shared.refuse(now, sent_at)
        if refusal is None:
            interval = learned.refuse(now, sent_at, hold)
        elif refusal.accepted is None:
            # Another process learns from this episode and publishes it.
            learned.record_echo(now)
            return
        else:
            # The first refusal of its episode: learned from every
            # process's sends, and published for them.
            interval = learned.refuse(now, sent_at, hold, accepted=refusal.accepted)
            assert shared is not None
            shared.publish(learned.learned_state(), refusal)
        if interval == before:
            return
        if self.stats is not None:
            self.stats.inc_value("throttling/rate_limit/learned_count")
        if self.debug:
            logger.debug(
                "Scope %s: %s requests accepted in the last %gs before a 429; "
                "pace %.4fs -> %.4fs between requests",
                self.id,
                learned.accepted,
                learned.period,
                before,
                interval,
            )

    def adopt_pace(self, state: LearnedState, refused_at: float) -> None:
        """Take over the pace another process learned from a refusal at
        *refused_at* (on :attr:`clock`), published through the shared state."""
        learned = self._learned_rate()
        before = learned.interval
        learned.adopt(state, refused_at)
        if self.debug and learned.interval != before:
            logger.debug(
                "Scope %s: pace learned by another process from %s requests "
                "accepted; %.4fs -> %.4fs between requests",
                self.id,
                learned.accepted,
                before,
                learned.interval,
            )

    def _recover(self, now: float) -> None:
        steps = self.backoff.recover(now)
        if not steps:
            return
        if self.stats is not None:
            self.stats.inc_value("throttling/backoff/recovery_count", steps)
        if self.debug:
            backoff = self.backoff
            logger.debug(
                "Backoff recovery for scope %s: %d step(s), delay %.3fs (level %d)",
                self.id,
                steps,
                backoff.delay,
                backoff.level,
            )

    def set_delay_floor(self, delay: float) -> None:
        """Never space two sends closer than *delay* seconds."""
        self.gate.floor = floor = max(0.0, float(delay))
        if self.rampup is not None:
            self.rampup.set_floor(floor)

    def reconcile_quota(
        self, consumed: float | None, remaining: float | None, now: float
    ) -> None:
        """Correct the quota estimate (no-op for scopes without a quota)."""
        if self.quota is not None:
            self.quota.reconcile(now, consumed=consumed, remaining=remaining)

    def set_base_delay(self, delay: float, *, only_increase: bool) -> None:
        """Set the base delay; with *only_increase*, only raise it."""
        backoff = self.backoff
        if only_increase and delay <= backoff.base_delay:
            return
        backoff.set_base_delay(delay)
        if self.rampup is not None:
            # A value set from outside becomes rampup's new starting point.
            self.rampup.set_base_delay(backoff.base_delay)

    # -- concurrency -----------------------------------------------------------

    @property
    def concurrency(self) -> int | None:
        """The concurrency limit enforced now (``None``: no limit)."""
        return self.limit.limit

    def set_concurrency(self, concurrency: int) -> None:
        """Set the ceiling of the limit (never below ``min_concurrency``)."""
        before = self.limit.limit
        self.limit.set_ceiling(max(self.config.min_concurrency, int(concurrency)))
        self._raised(before)

    def concurrency_blocked(self) -> bool:
        """Whether the scope is at its concurrency limit."""
        limit = self.limit.limit
        return limit is not None and self.counters.in_flight >= limit

    def get_load(self) -> float:
        """Requests in flight / limit (or / ``CONCURRENT_REQUESTS``)."""
        limit = self.limit.limit or self._total_concurrency
        return self.counters.in_flight / limit if limit else 0.0

    def _raised(self, before: int | None) -> None:
        after = self.limit.limit
        if before is not None and after is not None and after > before:
            self._on_slots_raised(after - before)

    # -- latency ------------------------------------------------------------------

    def record_response(
        self, latency: float | None, status: int | None, now: float
    ) -> tuple[int, int] | None:
        """Feed one response to the limit; return ``(old, new)`` if it changed.

        Responses without a latency (cached, not downloaded) are no sample,
        nor are backoff codes and the answer that triggered a backoff (the
        limit already counted it as an overload).
        """
        if latency is None:
            return None
        if self._answer_counted:
            self._answer_counted = False
            return None
        if status in self.config.http_codes:
            return None
        before = self.limit.limit
        error = status is not None and status >= 400
        if not self.limit.on_response(
            now, latency, self.counters.in_flight, error=error
        ):
            return None
        after = self.limit.limit
        self._raised(before)
        if before is None or after is None:
            return None
        return before, after

    # -- rampup ---------------------------------------------------------------------

    def _rampup_check(self, rampup: RampupLimit, now: float) -> None:
        before = self.limit.limit
        change = rampup.check(now, self.backoff, self.gate, self.counters.in_flight)
        if change is not None:
            self._raised(before)
            _count_rampup(self, change)

    # -- eviction and state -------------------------------------------------------

    def is_idle(self, now: float, max_idle: float) -> bool:
        """Whether this scope can be evicted: unused for *max_idle* seconds,
        nothing in flight and no backoff pending."""
        counters = self.counters
        if counters.in_flight:
            return False
        backoff = self.backoff
        if backoff.level:
            # Recovery is otherwise applied when the scope is used: one that
            # nobody sends to any more must recover here, or a single backoff
            # would keep it from eviction for ever.
            self._recover(now)
        if backoff.in_backoff(now) or self.gate.next_send_at > now:
            return False
        if counters.last_seen is None:
            # Never used: evictable unless changed at run time (e.g. by
            # set_scope_delay before its first request), since recreating it
            # from its configuration would lose that.
            return (
                backoff.base_delay == self.config.delay
                and self.limit.ceiling == self.config.concurrency
            )
        return now - counters.last_seen > max_idle

    @property
    def strategy(self) -> ConcurrencyLimit:
        """The concurrency-limit strategy under rampup (the limit itself
        without rampup)."""
        return self.rampup.inner if self.rampup is not None else self.limit

    def state(self, now: float, manager: str) -> ScopeState:
        """A typed snapshot of the scope's state."""
        return snapshot(self, now, manager)


def _count_rampup(scope: Scope, change: RampupChange) -> None:
    """The stats and the debug log of one rampup decision."""
    stats = scope.stats
    if stats is not None:
        if change.faster_steps > 0:
            stats.inc_value("throttling/rampup/faster_count", change.faster_steps)
        if change.slower_steps > 0:
            stats.inc_value("throttling/rampup/slower_count", change.slower_steps)
    if scope.debug:
        logger.debug(
            "Rampup for scope %s: delay %.3fs -> %.3fs, concurrency %s -> %s",
            scope.id,
            change.old_delay,
            change.delay,
            change.old_concurrency,
            change.concurrency,
        )
