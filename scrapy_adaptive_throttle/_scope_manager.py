"""The default scope manager: the throttling state of one scope.

It composes the pure algorithms (delay and jitter, backoff and recovery,
quota windows) behind :class:`~scrapy_adaptive_throttle.ThrottlingScopeManagerProtocol`.
Delays are counted from each send, as Scrapy's ``DOWNLOAD_DELAY`` always was.
"""

from __future__ import annotations

import random
from collections import deque
from time import monotonic
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred

from ._algorithms import BackoffState, QuotaWindow, apply_jitter
from ._settings import ScopeSettings, ThrottlingSettings

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from typing_extensions import Self


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
        self._last_seen: float | None = None
        self.active = 0
        self._slot_waiters: deque[Deferred[None]] = deque()

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
        backoff = self._backoff
        if backoff.level:
            backoff.recover(now)
        wait = self._next_allowed - now
        hold = backoff.hold_until - now
        if hold > wait:
            wait = hold
        if self._quota is not None:
            quota_wait = self._quota.wait(now, amount)
            if quota_wait > wait:
                wait = quota_wait
        return wait if wait > 0 else 0.0

    def record_sent(self, now: float | None = None, amount: float | None = None) -> None:
        """Record a send: start the delay, take a slot, consume quota."""
        if now is None:
            now = monotonic()
        self._last_seen = now
        self.active += 1
        self._next_allowed = now + self._spacing()
        if self._quota is not None:
            self._quota.consume(now, amount)

    def _spacing(self) -> float:
        backoff = self._backoff
        if backoff.level:
            # Backoff jitter was applied once, when the step was taken.
            return backoff.delay
        return apply_jitter(backoff.delay, self._jitter, self._uniform)

    def record_done(self, now: float | None = None) -> None:
        """Free the slot of a finished request and wake one waiter."""
        if self.active > 0:
            self.active -= 1
            self.wake_waiter()

    # -- backoff, delay, quota -----------------------------------------------

    def record_backoff(
        self, delay: float | None = None, now: float | None = None, cap: bool = True
    ) -> None:
        """Apply a backoff trigger; *delay* is a hard minimum wait."""
        if now is None:
            now = monotonic()
        self._last_seen = now
        self._backoff.trigger(now, delay, cap=cap)
        next_allowed = now + self._backoff.delay
        if next_allowed > self._next_allowed:
            self._next_allowed = next_allowed

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
        try:
            self._slot_waiters.remove(event)
        except ValueError:
            pass

    def wake_waiter(self) -> bool:
        """Fire one pending slot event, if any (one per freed slot, no herd)."""
        while self._slot_waiters:
            event = self._slot_waiters.popleft()
            if not event.called:
                event.callback(None)
                return True
        return False

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
        if self._backoff.in_backoff(now) or self._next_allowed > now:
            return False
        if self._last_seen is None:
            return True
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
        }
        if self._quota is not None:
            state["quota_consumed"] = self._quota.consumed
            state["quota"] = self._quota.quota
        return state

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.id!r} active={self.active} "
            f"limit={self.concurrency} delay={self._backoff.delay:.3f}>"
        )
