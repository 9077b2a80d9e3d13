"""The default scope manager: the throttling state of one scope.

A thin shell over :class:`~scrapy_adaptive_throttle._scope.Scope`, which
composes the pure algorithms (delay and jitter, backoff and recovery, quota
windows, a concurrency-limit strategy) behind
:class:`~scrapy_adaptive_throttle.ThrottlingScopeManagerProtocol`; the shell
builds it from the crawler's settings, keeps the slot events (Twisted
Deferreds) and tells the manager of raised limits. Delays are counted from
each send, as Scrapy's ``DOWNLOAD_DELAY`` always was.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred

from ._algorithms import RampupPolicy, RampupState
from ._algorithms.concurrency import ConcurrencyLimit, FixedLimit, RampupLimit
from ._clock import MONOTONIC_CLOCK
from ._scope import Scope
from ._scope_state import LocalScopeStore, ScopeStore
from ._settings import ScopeSettings, ThrottlingSettings
from ._shared_limit import share_limit
from ._shared_pace import share_pace

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from typing_extensions import Self

    from ._algorithms import LearnedRate
    from ._scope_state import ScopeState

logger = logging.getLogger(__name__)


class ThrottlingScopeManager:
    """Concurrency, delay with jitter, backoff and quotas of one scope.

    Built by the manager with ``build_from_crawler(cls, crawler, config)``
    where *config* is the scope's :setting:`THROTTLING_SCOPES` entry (if any)
    plus ``"id"``. Subclasses choose the concurrency-limit strategy by
    overriding :meth:`build_limit`.
    """

    #: Where the state of the scope is kept (this process's memory).
    state_store: ScopeStore = LocalScopeStore()

    def __init__(self, crawler: Crawler, config: dict[str, Any]) -> None:
        self.crawler = crawler
        self.id: str = str(config.get("id", ""))
        throttling = ThrottlingSettings.from_crawler(crawler)
        self.config: ScopeSettings = throttling.resolve_scope(self.id, config)
        self._total_concurrency = throttling.total_concurrency
        self._min_concurrency = self.config.min_concurrency
        self._debug = throttling.debug
        self._stats = crawler.stats
        #: The clock of times not given by the caller (the throttler's).
        self.clock: Callable[[], float] = MONOTONIC_CLOCK
        #: Called with the scope id for each slot a raised limit adds, so that
        #: the scheduler queue hears of it: set by the registry that builds
        #: this scope manager (``None``, e.g. under Scrapy's own manager: only
        #: the waiters of :meth:`slot_event` hear of it).
        self.slots_listener: Callable[[str], None] | None = None
        self._slot_waiters: deque[Deferred[None]] = deque()
        settings = self.config
        parts = self.state_store.parts(self.id, settings)
        rampup = self._build_rampup(parts.backoff.base_delay)
        ceiling = settings.concurrency if rampup is None else rampup.concurrency
        # With THROTTLING_STATE_URL, an adaptive limit is one across processes.
        limit = share_limit(
            crawler, self.id, self.build_limit(ceiling), self._total_concurrency
        )
        if rampup is not None:
            limit = RampupLimit(rampup, limit)
        self.scope = Scope(
            self.id,
            settings,
            limit=limit,
            parts=parts,
            total_concurrency=self._total_concurrency,
            clock=self._now,
            on_slots_raised=self._on_slots_raised,
            stats=self._stats,
            debug=self._debug,
        )
        # With THROTTLING_STATE_URL, the pace learned from 429s is one pace.
        share_pace(crawler, self.scope)

    @classmethod
    def from_crawler(cls, crawler: Crawler, config: dict[str, Any]) -> Self:
        return cls(crawler, config)

    def build_limit(self, ceiling: int | None) -> ConcurrencyLimit:
        """The concurrency-limit strategy of this scope, under *ceiling*
        (the scope's concurrency, or rampup's starting one): a fixed limit."""
        return FixedLimit(ceiling)

    def _build_rampup(self, delay: float) -> RampupState | None:
        config = self.config
        if config.rampup is None:
            return None
        # The ceiling: the scope's own concurrency when the user set one,
        # else CONCURRENT_REQUESTS (0: none), as in the pull request; the
        # default per-domain value is a politeness default for unknown
        # sites, not a limit of an API whose rate rampup is asked to find.
        if config.explicit_concurrency:
            ceiling = config.concurrency
        else:
            ceiling = self._total_concurrency or None
        policy = RampupPolicy(
            target=config.rampup.target,
            delay_factor=config.rampup.delay_factor,
            min_delay=config.rampup.min_delay,
            window=config.backoff.window,
            min_concurrency=self._min_concurrency,
            max_concurrency=ceiling,
        )
        # Rampup starts from the floor and probes upward (the chapter).
        return RampupState(policy, delay=delay)

    def _now(self) -> float:
        return self.clock()

    # -- time gates -------------------------------------------------------

    def can_send(self, now: float | None = None, amount: float | None = None) -> float:
        """Seconds until a request consuming *amount* may be sent (0 = now).

        Only time gates (delay, backoff hold, quota window) count here;
        concurrency is :meth:`concurrency_blocked`.
        """
        return self.scope.can_send(self._now() if now is None else now, amount)

    def record_sent(
        self, now: float | None = None, amount: float | None = None
    ) -> None:
        """Record a send: start the delay, take a slot, consume quota."""
        self.scope.record_sent(self._now() if now is None else now, amount)

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
        now = self._now() if now is None else now
        return self.scope.refund_send(sent_at, now, amount)

    def restamp_send(self, sent_at: float, now: float | None = None) -> bool:
        """Count the delay of the send at *sent_at* from *now* instead: its
        request reached Scrapy's downloader only then, held between the
        scheduler and the downloader by the event loop or by a downloader
        middleware. Scrapy's own ``DOWNLOAD_DELAY`` counts from the moment a
        request leaves the downloader, after every middleware, so two
        requests never reach the downloader closer than the delay. Nothing
        changes if the gate moved since (a later send, a backoff, a
        recovery). Returns whether the next send comes later for it."""
        now = self._now() if now is None else now
        return self.scope.restamp_send(sent_at, now)

    def next_spacing(self) -> float:
        """The seconds the next send will keep the scope closed, jitter
        included, drawn now and used by the next :meth:`record_sent`, so
        that a shared state (:setting:`THROTTLING_STATE_URL`) spaces every
        process's sends by the same value this process does."""
        return self.scope.next_spacing()

    def shared_quota(self) -> tuple[float, float] | None:
        """``(quota, window)`` of this scope's quota (``None``: none): with
        :setting:`THROTTLING_STATE_URL`, every process spends it from one
        window in Redis."""
        quota = self.scope.quota
        return None if quota is None else (quota.quota, quota.window)

    def record_done(self, now: float | None = None) -> None:
        """Free the slot of a finished request and wake one waiter."""
        if self.scope.record_done(self._now() if now is None else now):
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
        self.scope.record_backoff(delay, self._now() if now is None else now, cap)

    def backoff_wait(self, now: float) -> float:
        """Seconds until the scope may send again after a backoff trigger
        (its hold, or the backed-off spacing from now), read without the
        side effects of :meth:`can_send` (recovery, rampup observations);
        shared with other processes by :setting:`THROTTLING_STATE_URL`."""
        return self.scope.backoff_wait(now)

    def record_rate_limited(
        self,
        now: float | None = None,
        sent_at: float | None = None,
        *,
        refused_before: bool = False,
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

        *refused_before*: the request was answered ``429`` before (this is
        a retry of it). Its refusal is counted (it was not accepted) but
        teaches no pace: a page the server always refuses says nothing of
        the rate it allows, and a pace learned from its retry would cap the
        scope at whatever rate it had reached by then.
        """
        self.scope.record_rate_limited(
            self._now() if now is None else now,
            sent_at,
            refused_before=refused_before,
        )

    def set_delay_floor(self, delay: float) -> None:
        """Never space two sends closer than *delay* seconds, whatever the
        jitter (a robots.txt Crawl-delay is a minimum, not an average)."""
        self.scope.set_delay_floor(delay)

    def reconcile_quota(
        self,
        consumed: float | None = None,
        remaining: float | None = None,
        now: float | None = None,
    ) -> None:
        """Correct the quota estimate (no-op for scopes without a quota)."""
        if self.scope.quota is None:
            return
        now = self._now() if now is None else now
        self.scope.reconcile_quota(consumed, remaining, now)

    def get_base_delay(self) -> float:
        """Return the base (non-backoff) delay."""
        return self.scope.backoff.base_delay

    def set_base_delay(self, delay: float, *, only_increase: bool = True) -> None:
        """Set the base delay; by default only raise it (robots.txt hints)."""
        self.scope.set_base_delay(delay, only_increase=only_increase)

    # -- concurrency -----------------------------------------------------------

    @property
    def active(self) -> int:
        """Requests of the scope in flight."""
        return self.scope.counters.in_flight

    @active.setter
    def active(self, value: int) -> None:
        self.scope.counters.in_flight = value

    @property
    def concurrency(self) -> int | None:
        """The concurrency limit enforced now (``None``: no limit)."""
        return self.scope.concurrency

    @property
    def _concurrency(self) -> int | None:
        # The ceiling of the limit: what the configuration, a robots.txt
        # Crawl-delay or rampup set (kept for code that read it).
        return self.scope.limit.ceiling

    @property
    def _rampup(self) -> RampupState | None:
        # Rampup's state, if the scope ramps up (kept for code that read it).
        rampup = self.scope.rampup
        return rampup.state if rampup is not None else None

    @property
    def _learned(self) -> LearnedRate | None:
        return self.scope.learned

    def set_concurrency(self, concurrency: int) -> None:
        """Set the concurrency limit (never below ``min_concurrency``)."""
        self.scope.set_concurrency(concurrency)

    def concurrency_blocked(self) -> bool:
        """Whether the scope is at its concurrency limit."""
        return self.scope.concurrency_blocked()

    def get_load(self) -> float:
        """Active requests / limit (or / ``CONCURRENT_REQUESTS`` without a limit)."""
        return self.scope.get_load()

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

    def _on_slots_raised(self, slots: int) -> None:
        # Requests waiting for this scope must hear of the new slots: gate
        # waiters through slot events, the scheduler queue through the
        # listener the registry set (the manager's release listeners).
        notify = self.slots_listener
        for _ in range(slots):
            self.wake_waiter()
            if notify is not None:
                notify(self.id)

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
        return self.scope.is_idle(now, max_idle)

    def scope_state(self, now: float | None = None) -> ScopeState:
        """A typed snapshot of the scope's state (what :meth:`get_state` says)."""
        now = self._now() if now is None else now
        return self.scope.state(now, type(self).__name__)

    def get_state(self, now: float | None = None) -> dict[str, Any]:
        """A snapshot of the scope's state, for diagnostics and stats."""
        return self.scope_state(now).as_dict()

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.id!r} active={self.active} "
            f"limit={self.concurrency} delay={self.scope.backoff.delay:.3f}>"
        )
