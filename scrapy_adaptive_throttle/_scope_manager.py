"""The default scope manager: the throttling state of one scope.

It composes the pure algorithms (delay and jitter, backoff and recovery,
quota windows) behind :class:`~scrapy_adaptive_throttle.ThrottlingScopeManagerProtocol`.
Delays are counted from each send, as Scrapy's ``DOWNLOAD_DELAY`` always was.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from contextlib import suppress
from time import monotonic
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred

from ._algorithms import (
    BackoffState,
    LearnedRate,
    QuotaWindow,
    RampupPolicy,
    RampupState,
    apply_jitter,
)
from ._settings import ScopeSettings, ThrottlingSettings

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from typing_extensions import Self

logger = logging.getLogger(__name__)


class ThrottlingScopeManager:
    """Concurrency, delay with jitter, backoff and quotas of one scope.

    Built by the manager with ``build_from_crawler(cls, crawler, config)``
    where *config* is the scope's :setting:`THROTTLING_SCOPES` entry (if any)
    plus ``"id"``.
    """

    def __init__(self, crawler: Crawler, config: dict[str, Any]) -> None:
        self.crawler = crawler
        self.id: str = str(config.get("id", ""))
        throttling = ThrottlingSettings.from_crawler(crawler)
        self.config: ScopeSettings = throttling.resolve_scope(self.id, config)
        self._total_concurrency = throttling.total_concurrency
        self._uniform = random.uniform
        self._jitter = self.config.jitter
        self._concurrency: int | None = self.config.concurrency
        self._min_concurrency = self.config.min_concurrency
        self._backoff = BackoffState(self.config.backoff, self.config.delay)
        self._quota = (
            QuotaWindow(self.config.quota, self.config.window)
            if self.config.quota is not None
            else None
        )
        self._next_allowed = 0.0
        # The last send, and the next-send time before it: what a request
        # served from a cache gives back (refund_send).
        self._last_sent_at: float | None = None
        self._allowed_before_send = 0.0
        self._allowed_after_send = 0.0
        #: The spacing of the next send, when drawn ahead of it for a shared
        #: state (see next_spacing).
        self._drawn_spacing: float | None = None
        # A robots.txt Crawl-delay: no jitter ever spaces two sends closer.
        self._delay_floor = 0.0
        self._debug = throttling.debug
        self._stats = crawler.stats
        self._last_seen: float | None = None
        self.active = 0
        self._slot_waiters: deque[Deferred[None]] = deque()
        self._rampup: RampupState | None = None
        self._rampup_applied: tuple[float, int | None] = (0.0, None)
        self._rampup_steps = (0, 0)
        #: The pace learned from 429 answers; created by the first one, so
        #: that scopes never refused cost nothing.
        self._learned: LearnedRate | None = None
        if self.config.rampup is not None:
            self._init_rampup(throttling.total_concurrency)

    @classmethod
    def from_crawler(cls, crawler: Crawler, config: dict[str, Any]) -> Self:
        return cls(crawler, config)

    # -- time gates -------------------------------------------------------

    def can_send(self, now: float | None = None, amount: float | None = None) -> float:
        """Seconds until a request consuming *amount* may be sent (0 = now).

        Only time gates (delay, backoff hold, quota window) count here;
        concurrency is :meth:`concurrency_blocked`.
        """
        if now is None:
            now = monotonic()
        # Drawn for a send that did not happen: the state may change first.
        self._drawn_spacing = None
        backoff = self._backoff
        if backoff.level:
            recovered = backoff.recover(now)
            if recovered:
                self._on_recovery(recovered)
        if self._rampup is not None:
            self._rampup_check(now)
        wait = self._next_allowed - now
        hold = backoff.hold_until - now
        wait = max(wait, hold)
        if self._quota is not None:
            quota_wait = self._quota.wait(now, amount)
            wait = max(wait, quota_wait)
        return wait if wait > 0 else 0.0

    def record_sent(
        self, now: float | None = None, amount: float | None = None
    ) -> None:
        """Record a send: start the delay, take a slot, consume quota."""
        if now is None:
            now = monotonic()
        self._last_seen = now
        self.active += 1
        self._last_sent_at = now
        self._allowed_before_send = self._next_allowed
        spacing = self._drawn_spacing
        if spacing is None:
            spacing = self._spacing()
        else:
            self._drawn_spacing = None
        self._next_allowed = now + spacing
        learned = self._learned
        if learned is not None:
            # Paced on a schedule, so the crawler's lag does not add up.
            allowed = learned.record_send(now)
            self._next_allowed = max(self._next_allowed, allowed)
        self._allowed_after_send = self._next_allowed
        if self._quota is not None:
            self._quota.consume(now, amount)
        if self._rampup is not None:
            self._rampup.observe_send(now, self.active)

    def refund_send(
        self, sent_at: float, now: float | None = None, amount: float | None = None
    ) -> bool:
        """Give back what the send at *sent_at* took from the time gates: the
        request was answered from a cache (``HTTPCACHE_ENABLED``) and never
        reached the host, so it does not space the next send, as with
        Scrapy's own downloader, whose delay a cache hit never waits for.

        The delay is given back only if nothing changed it since (a later
        send, a backoff, a recovery, a pace learned from 429s); *amount* goes back
        to the quota. The slot itself is freed by :meth:`record_done`, as for
        any request. Returns whether the next send may now come sooner.
        """
        if now is None:
            now = monotonic()
        if self._quota is not None and amount is not None and amount > 0:
            self._quota.reconcile(now, consumed=-amount)
        if (
            self._last_sent_at != sent_at
            or self._learned is not None
            or self._next_allowed != self._allowed_after_send
        ):
            return False
        self._last_sent_at = None
        before = self._allowed_before_send
        if before >= self._next_allowed:
            return False
        self._next_allowed = before
        return True

    def next_spacing(self) -> float:
        """The seconds the next send will keep the scope closed, jitter
        included, drawn now and used by the next :meth:`record_sent`, so
        that a shared state (:setting:`THROTTLING_STATE_URL`) spaces every
        process's sends by the same value this process does."""
        spacing = self._drawn_spacing
        if spacing is None:
            spacing = self._drawn_spacing = self._spacing()
        return spacing

    def _spacing(self) -> float:
        backoff = self._backoff
        if backoff.level:
            # Backoff jitter was applied once, when the step was taken.
            spacing = backoff.delay
        else:
            spacing = apply_jitter(backoff.delay, self._jitter, self._uniform)
        return spacing if spacing > self._delay_floor else self._delay_floor

    def record_done(self, now: float | None = None) -> None:
        """Free the slot of a finished request and wake one waiter."""
        if self.active > 0:
            self.active -= 1
            if self._rampup is not None:
                done_at = monotonic() if now is None else now
                self._rampup.observe_done(done_at, self.active)
            self.wake_waiter()

    # -- backoff, delay, quota -----------------------------------------------

    def record_backoff(
        self, delay: float | None = None, now: float | None = None, cap: bool = True
    ) -> None:
        """Apply a backoff trigger.

        :param delay: a hard minimum wait in seconds (a server-given delay
            or :meth:`~scrapy_adaptive_throttle.ThrottlingManager.delay_scope`):
            nothing is sent before it elapses, and the delay does not grow.
            ``None`` takes one exponential step instead.
        :param now: the current monotonic time.
        :param cap: cap *delay* at the scope's backoff ``max_delay`` (server
            values are untrusted; ``delay_scope`` passes ``False``).
        """
        if now is None:
            now = monotonic()
        self._last_seen = now
        if self._backoff.level:
            # Quiet windows that ended since the last send count before the
            # trigger (trigger() would apply them too, but unseen).
            recovered = self._backoff.recover(now)
            if recovered:
                self._on_recovery(recovered)
        self._backoff.trigger(now, delay, cap=cap, grow=self._rampup_trigger(now))
        if self._rampup is not None and self._backoff.hold_until > now:
            self._rampup.pause(now, self._backoff.hold_until)
        # The new spacing counts from now (the answer), not from the send
        # that earned it, so the next request waits the whole backed-off delay.
        self._next_allowed = max(self._next_allowed, now + self._backoff.delay)

    def backoff_wait(self, now: float) -> float:
        """Seconds until the scope may send again after a backoff trigger
        (its hold, or the backed-off spacing from now), read without the
        side effects of :meth:`can_send` (recovery, rampup observations);
        shared with other processes by :setting:`THROTTLING_STATE_URL`."""
        wait = max(self._next_allowed, self._backoff.hold_until) - now
        return wait if wait > 0 else 0.0

    def record_rate_limited(
        self, now: float | None = None, sent_at: float | None = None
    ) -> None:
        """Learn the scope's pace from a refusal for too many requests (429).

        Called by the manager after :meth:`record_backoff` for the same
        answer, with when the refused request was sent (if known). The
        requests the server accepted over the second before that become the
        scope's pace (see :ref:`learned-pace`): a floor of its spacing that
        recovery does not lower, so the scope stops running into the limit
        after each quiet window. With rampup, the pace is a floor under
        rampup's delay: rampup still sets the concurrency and slows down
        past it, and reaches the limit as soon as the pace is learned.
        """
        if now is None:
            now = monotonic()
        learned = self._learned
        if learned is None:
            # The count starts now: the next refusal can be learned from.
            learned = self._learned = LearnedRate(window=self.config.backoff.window)
        before = learned.interval
        # What each probe will cost: this refusal's hold (its Retry-After).
        interval = learned.refuse(now, sent_at, self._backoff.hold_until - now)
        if interval != before and self._stats is not None:
            self._stats.inc_value("throttling/rate_limit/learned_count")
        if self._debug and interval != before:
            logger.debug(
                "Scope %s: %s requests accepted in the last %gs before a 429; "
                "pace %.4fs -> %.4fs between requests",
                self.id,
                learned.accepted,
                learned.period,
                before,
                interval,
            )

    def _on_recovery(self, steps: int) -> None:
        if self._stats is not None:
            self._stats.inc_value("throttling/backoff/recovery_count", steps)
        if self._debug:
            backoff = self._backoff
            logger.debug(
                "Backoff recovery for scope %s: %d step(s), delay %.3fs (level %d)",
                self.id,
                steps,
                backoff.delay,
                backoff.level,
            )

    def set_delay_floor(self, delay: float) -> None:
        """Never space two sends closer than *delay* seconds, whatever the
        jitter (a robots.txt Crawl-delay is a minimum, not an average)."""
        self._delay_floor = max(0.0, float(delay))

    def reconcile_quota(
        self,
        consumed: float | None = None,
        remaining: float | None = None,
        now: float | None = None,
    ) -> None:
        """Correct the quota estimate (no-op for scopes without a quota)."""
        if self._quota is None:
            return
        if now is None:
            now = monotonic()
        self._quota.reconcile(now, consumed=consumed, remaining=remaining)

    def get_base_delay(self) -> float:
        """Return the base (non-backoff) delay."""
        return self._backoff.base_delay

    def set_base_delay(self, delay: float, *, only_increase: bool = True) -> None:
        """Set the base delay; by default only raise it (robots.txt hints)."""
        if only_increase and delay <= self._backoff.base_delay:
            return
        self._backoff.set_base_delay(delay)

    # -- concurrency -----------------------------------------------------------

    @property
    def concurrency(self) -> int | None:
        """The concurrency limit enforced now (``None``: no limit)."""
        return self._concurrency

    def set_concurrency(self, concurrency: int) -> None:
        """Set the concurrency limit (never below ``min_concurrency``)."""
        old = self.concurrency
        self._concurrency = max(self._min_concurrency, int(concurrency))
        new = self.concurrency
        if old is not None and new is not None and new > old:
            for _ in range(new - old):
                self.wake_waiter()

    def concurrency_blocked(self) -> bool:
        """Whether the scope is at its concurrency limit."""
        limit = self.concurrency
        return limit is not None and self.active >= limit

    def get_load(self) -> float:
        """Active requests / limit (or / ``CONCURRENT_REQUESTS`` without a limit)."""
        limit = self.concurrency or self._total_concurrency
        return self.active / limit if limit else 0.0

    def slot_event(self) -> Deferred[None]:
        """Return a Deferred fired when a slot may have been freed."""
        event: Deferred[None] = Deferred()
        self._slot_waiters.append(event)
        return event

    def discard_slot_event(self, event: Deferred[None]) -> None:
        """Forget *event* (idempotent)."""
        with suppress(ValueError):
            self._slot_waiters.remove(event)

    def wake_waiter(self) -> bool:
        """Fire one pending slot event, if any (one per freed slot, no herd)."""
        while self._slot_waiters:
            event = self._slot_waiters.popleft()
            if not event.called:
                event.callback(None)
                return True
        return False

    # -- rampup ------------------------------------------------------------------

    def _init_rampup(self, total_concurrency: int) -> None:
        config = self.config
        assert config.rampup is not None
        # The ceiling: the scope's own concurrency when the user set one,
        # else CONCURRENT_REQUESTS (0: none), as in the pull request; the
        # default per-domain value is a politeness default for unknown
        # sites, not a limit of an API whose rate rampup is asked to find.
        if config.explicit_concurrency:
            ceiling = config.concurrency
        else:
            ceiling = total_concurrency or None
        policy = RampupPolicy(
            target=config.rampup.target,
            delay_factor=config.rampup.delay_factor,
            min_delay=config.rampup.min_delay,
            window=config.backoff.window,
            min_concurrency=self._min_concurrency,
            max_concurrency=ceiling,
        )
        self._rampup = rampup = RampupState(policy, delay=self._backoff.base_delay)
        # Rampup starts from the floor and probes upward (the chapter).
        self._concurrency = rampup.concurrency
        self._rampup_applied = (rampup.delay, rampup.concurrency)

    def _rampup_sync(self, rampup: RampupState) -> None:
        # Values set from outside (set_scope_delay, a robots.txt Crawl-delay,
        # set_concurrency) become rampup's new starting point.
        delay, concurrency = self._rampup_applied
        if self._backoff.base_delay != delay:
            rampup.set_delay(self._backoff.base_delay)
        if self._concurrency != concurrency and self._concurrency is not None:
            rampup.set_concurrency(self._concurrency)
        rampup.delay_floor = self._delay_floor

    def _rampup_apply(self, rampup: RampupState, now: float) -> None:
        """Enforce what rampup decided, if it changed anything."""
        delay, concurrency = rampup.delay, rampup.concurrency
        old_delay, old_concurrency = self._rampup_applied
        if delay == old_delay and concurrency == old_concurrency:
            return
        self._rampup_applied = (delay, concurrency)
        if delay != self._backoff.base_delay:
            self._backoff.set_base_delay(delay)
        if delay < old_delay:
            # The spacing of the last send was drawn from the old delay.
            self._next_allowed = min(self._next_allowed, now + self._spacing())
        before = self.concurrency
        self._concurrency = concurrency
        after = self.concurrency
        if before is not None and after is not None and after > before:
            throttler = getattr(self.crawler, "throttler", None)
            notify = getattr(throttler, "notify_slots_changed", None)
            for _ in range(after - before):
                self.wake_waiter()
                if notify is not None:
                    notify(self.id)
        faster, slower = self._rampup_steps
        self._rampup_steps = (rampup.faster_steps, rampup.slower_steps)
        if self._stats is not None:
            if rampup.faster_steps > faster:
                self._stats.inc_value(
                    "throttling/rampup/faster_count", rampup.faster_steps - faster
                )
            if rampup.slower_steps > slower:
                self._stats.inc_value(
                    "throttling/rampup/slower_count", rampup.slower_steps - slower
                )
        if self._debug:
            logger.debug(
                "Rampup for scope %s: delay %.3fs -> %.3fs, concurrency %s -> %s",
                self.id,
                old_delay,
                delay,
                old_concurrency,
                concurrency,
            )

    def _rampup_check(self, now: float) -> None:
        """Close finished rampup windows and note what holds requests back."""
        rampup = self._rampup
        assert rampup is not None
        self._rampup_sync(rampup)
        rampup.roll(now)
        self._rampup_apply(rampup, now)
        # Only a request held back by the delay or the concurrency that
        # rampup controls tests them; a server-given hold tests nothing, nor
        # does a lower limit of a subclass (the adaptive limit of
        # LatencyScopeManager, for which rampup's value is the ceiling).
        delay_held = self._next_allowed > now >= self._backoff.hold_until
        limit = self._concurrency
        concurrency_held = limit is not None and self.active >= limit
        if delay_held or concurrency_held:
            rampup.observe_hold(now, delay=delay_held, concurrency=concurrency_held)

    def _rampup_trigger(self, now: float) -> bool:
        """Count a backoff trigger for rampup; return whether the delay should
        grow exponentially (always, without rampup)."""
        rampup = self._rampup
        if rampup is None:
            return True
        self._rampup_sync(rampup)
        slowed = rampup.trigger(now)
        self._rampup_apply(rampup, now)
        return not slowed

    # -- hooks of this plugin ----------------------------------------------------

    def record_response(
        self, latency: float | None, status: int | None, now: float | None = None
    ) -> None:
        """Observe a finished download (latency in seconds, HTTP status).

        The default manager does not adapt to latency; see
        :class:`~scrapy_adaptive_throttle.LatencyScopeManager`.
        """

    def is_idle(self, now: float, max_idle: float) -> bool:
        """Whether this state can be evicted: unused for *max_idle* seconds,
        nothing in flight and no backoff pending."""
        if self.active:
            return False
        backoff = self._backoff
        if backoff.level:
            # Recovery is otherwise applied when the scope is used: one that
            # nobody sends to any more must recover here, or a single backoff
            # would keep it from eviction for ever.
            recovered = backoff.recover(now)
            if recovered:
                self._on_recovery(recovered)
        if backoff.in_backoff(now) or self._next_allowed > now:
            return False
        if self._last_seen is None:
            # Never used: evictable unless changed at run time (e.g. by
            # set_scope_delay before its first request), since recreating it
            # from its configuration would lose that.
            return (
                self._backoff.base_delay == self.config.delay
                and self._concurrency == self.config.concurrency
            )
        return now - self._last_seen > max_idle

    def get_state(self, now: float | None = None) -> dict[str, Any]:
        """A snapshot of the scope's state, for diagnostics and stats."""
        if now is None:
            now = monotonic()
        backoff = self._backoff
        state: dict[str, Any] = {
            "scope": self.id,
            "manager": type(self).__name__,
            "limit": self.concurrency,
            "in_flight": self.active,
            "delay": backoff.delay,
            "base_delay": backoff.base_delay,
            "backoff_level": backoff.level,
            "backoff_wait": backoff.wait(now),
            "backoff_count": backoff.trigger_count,
            "delay_floor": self._delay_floor,
        }
        learned = self._learned
        if learned is not None:
            state["learned_interval"] = learned.interval
            state["learned_accepted"] = learned.accepted
        if self._quota is not None:
            state["quota_consumed"] = self._quota.consumed
            state["quota"] = self._quota.quota
        rampup = self._rampup
        if rampup is not None:
            state.update(
                rampup_window_triggers=rampup.triggers,
                rampup_latency=rampup.latency,
                rampup_too_fast_delay=rampup.too_fast_delay,
                rampup_faster_count=rampup.faster_steps,
                rampup_slower_count=rampup.slower_steps,
            )
        return state

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.id!r} active={self.active} "
            f"limit={self.concurrency} delay={self._backoff.delay:.3f}>"
        )
