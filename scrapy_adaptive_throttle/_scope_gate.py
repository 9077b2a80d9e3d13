"""The gate: which requests may be sent now, and the slots they hold.

A request may go when every one of its scopes has its time gates open
(delay, backoff, quota) and a free concurrency slot; it then *reserves* a
slot of each scope until its download ends (:meth:`ScopeGate.release`). The
scheduler queue asks :meth:`ScopeGate.check_scopes` and reserves through the
manager; requests that bypass the queue (``engine.download()``, a
retry of another scheduler) wait in :meth:`ScopeGate.wait_and_reserve`.
Freed slots and time gates that open early are announced to listeners (the
queue), so nothing polls.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import TYPE_CHECKING

from scrapy import signals
from scrapy.exceptions import IgnoreRequest
from scrapy.utils.asyncio import call_later, sleep
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet.defer import Deferred

from ._containment import ScopeManagerError, report
from ._meta_keys import DOWNLOAD_LATENCY_META_KEY
from ._scope_resolver import is_robots_request
from ._types import RequestScopes, dont_track, iter_scope_values

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

    from ._scope_adapter import ScopeAdapter
    from ._scope_registry import ScopeRegistry
    from ._settings import ThrottlingSettings
    from ._shared_state import SharedState
    from ._types import ScopeID

__all__ = ["CLOSE_CHECK_INTERVAL", "Reservation", "ScopeGate", "ScopeValues"]

logger = logging.getLogger(__name__)

#: The longest a gate waiter sleeps before checking whether the crawl closes.
CLOSE_CHECK_INTERVAL = 1.0
#: How long a waiter polls a scope manager that has no slot events.
_POLL_INTERVAL = 0.05

ScopeValues = list[tuple["ScopeID", "float | None"]]
Reservation = list[tuple["ScopeID", "ScopeAdapter"]]


class ScopeGate:
    """Checks, reservations and waiters of the scopes of a registry."""

    def __init__(
        self,
        crawler: Crawler,
        config: ThrottlingSettings,
        registry: ScopeRegistry,
        clock: Callable[[], float],
        shared: SharedState | None,
    ) -> None:
        self.crawler = crawler
        self.config = config
        self.registry = registry
        self.clock = clock
        self.shared = shared
        #: The scopes each sent, not yet released, request holds a slot of.
        self.reserved: dict[Request, Reservation] = {}
        #: When each reserved request was sent (on :attr:`clock`).
        self.reserved_at: dict[Request, float] = {}
        self.release_listeners: list[Callable[[ScopeID], None]] = []
        self.timer_listeners: list[Callable[[ScopeID], None]] = []
        #: Reserved requests to gate again (see :meth:`regate_scope`).
        self.regate: weakref.WeakSet[Request] = weakref.WeakSet()
        #: Requests waiting in :meth:`wait_and_reserve`.
        self.waiting = 0
        self._warned_waiting = False
        if shared is not None:
            crawler.signals.connect(shared.close, signal=signals.spider_closed)

    # -- checks and reservations ----------------------------------------------

    def check_scopes(
        self, scope_values: ScopeValues, now: float, head: Request | None = None
    ) -> tuple[float, ScopeID | None]:
        """``(wait, blocked)``: the time until every time gate is open, and
        the first scope at its concurrency limit (or ``None``). *head*, the
        request the scheduler queue passes, is not needed: the scopes say it
        all."""
        wait = 0.0
        blocked: ScopeID | None = None
        get = self.registry.get
        for scope_id, amount in scope_values:
            adapter = get(scope_id)
            try:
                scope_wait = adapter.can_send(now, amount)
                if blocked is None and adapter.concurrency_blocked():
                    blocked = scope_id
            except Exception as exc:
                raise ScopeManagerError(
                    scope_id, adapter.manager, "can_send", exc
                ) from exc
            wait = max(wait, scope_wait)
        if self.shared is not None and scope_values:
            return self._check_shared(scope_values, wait, blocked)
        return wait, blocked

    def _check_shared(
        self, scope_values: ScopeValues, wait: float, blocked: ScopeID | None
    ) -> tuple[float, ScopeID | None]:
        """Ask the shared state about a request whose local checks passed
        (and take its lease if it may go)."""
        shared = self.shared
        assert shared is not None
        if wait > 0 or blocked is not None:
            shared.drop_pending()
            return wait, blocked
        adapters = [self.registry.get(scope_id) for scope_id, _ in scope_values]
        # A quota is spent from one window across processes: the amount of
        # this request goes with the check that admits it.
        quotas = [
            None if (quota := adapter.shared_quota()) is None else (*quota, amount)
            for adapter, (_, amount) in zip(adapters, scope_values, strict=True)
        ]
        return shared.check([adapter.shared_check() for adapter in adapters], quotas)

    def reserve_scopes(
        self, request: Request, scope_values: ScopeValues, now: float
    ) -> None:
        """Record *request* as sent on each of its scopes, all or nothing."""
        # Every send passes here, whichever path it takes (scheduler queue or
        # gate), so idle scopes are evicted whatever the crawl's setup.
        self.registry.maybe_evict(now)
        reservation: Reservation = []
        get = self.registry.get
        for scope_id, amount in scope_values:
            adapter = get(scope_id)
            try:
                adapter.record_sent(now, amount)
            except Exception as exc:
                for _, sent in reservation:
                    with suppress(Exception):
                        sent.record_done(now)
                raise ScopeManagerError(
                    scope_id, adapter.manager, "record_sent", exc
                ) from exc
            reservation.append((scope_id, adapter))
        self.reserved[request] = reservation
        self.reserved_at[request] = now
        if self.shared is not None:
            self.shared.claim(
                request, [scope_id for scope_id, _ in scope_values], sent_at=now
            )

    def release(self, request: Request) -> None:
        """Free the slots reserved for *request*. Idempotent."""
        reservation = self.reserved.pop(request, None)
        self.reserved_at.pop(request, None)
        if self.shared is not None:
            self.shared.release(request)
        if not reservation:
            return
        now = self.clock()
        listeners = self.release_listeners
        for scope_id, adapter in reservation:
            try:
                adapter.record_done(now)
            except Exception as exc:
                # The download itself succeeded or failed on its own: its
                # outcome still reaches the spider, and the other scopes and
                # the waiters are released.
                self.report_failure(
                    request,
                    ScopeManagerError(scope_id, adapter.manager, "record_done", exc),
                    "its slot may stay counted by that scope manager",
                )
            for listener in listeners:
                listener(scope_id)

    def sent_at(self, request: Request | None) -> float | None:
        """When *request* was reserved (on :attr:`clock`), if it holds one."""
        return None if request is None else self.reserved_at.get(request)

    def record_response(self, request: Request | None, status: int, now: float) -> None:
        """Feed the download latency and *status* of *request*'s response to
        each scope it holds a slot of (their latency and rampup rules)."""
        if request is None or dont_track(request.meta):
            return
        reservation = self.reserved.get(request)
        if not reservation:
            return
        latency = request.meta.get(DOWNLOAD_LATENCY_META_KEY)
        for _, adapter in reservation:
            adapter.record_response(latency, status, now)

    def refund(self, request: Request, amounts: dict[ScopeID, float | None]) -> None:
        """Give back the send of *request* (answered from the HTTP cache) to
        the scopes that can, and tell the timer listeners which opened."""
        reservation = self.reserved.get(request)
        sent_at = self.reserved_at.get(request)
        if not reservation or sent_at is None:
            return
        now = self.clock()
        opened: list[ScopeID] = []
        for scope_id, adapter in reservation:
            try:
                if adapter.refund_send(sent_at, now, amounts.get(scope_id)):
                    opened.append(scope_id)
            except Exception as exc:
                self.report_failure(
                    request,
                    ScopeManagerError(scope_id, adapter.manager, "refund_send", exc),
                    "its send still spaces the next one of that scope",
                )
        if self.shared is not None:
            # The shared next-send time and quota window get it back too.
            shared_scopes = [
                (
                    scope_id,
                    amounts.get(scope_id),
                    None if (quota := adapter.shared_quota()) is None else quota[1],
                )
                for scope_id, adapter in reservation
            ]
            for scope_id in self.shared.refund(request, shared_scopes):
                if scope_id not in opened:
                    opened.append(scope_id)
        for listener in self.timer_listeners:
            for scope_id in opened:
                listener(scope_id)

    def restamp(self, request: Request) -> None:
        """*request* reached the downloader now: its scopes count their
        delay from now, not from when the queue handed it out."""
        sent_at = self.reserved_at.get(request)
        reservation = self.reserved.get(request)
        if not reservation or sent_at is None:
            return
        now = self.clock()
        if now <= sent_at:
            return
        for scope_id, adapter in reservation:
            try:
                adapter.restamp_send(sent_at, now)
            except Exception as exc:
                self.report_failure(
                    request,
                    ScopeManagerError(scope_id, adapter.manager, "restamp_send", exc),
                    "its scope's delay counts from when it was handed out",
                )

    def notify_slots_changed(self, scope_id: ScopeID) -> None:
        """Tell waiters that *scope_id* may have room (e.g. a raised limit)."""
        for listener in self.release_listeners:
            listener(scope_id)

    def regate_scope(self, scope_id: ScopeID) -> None:
        """Send the reserved requests of *scope_id* through the gate again."""
        # Requests popped (and reserved) before robots.txt was parsed wait in
        # RobotsTxtMiddleware, ahead of the gate: without this, every one of
        # them would go out at once, ignoring the Crawl-delay just applied.
        for request, reservation in self.reserved.items():
            if any(reserved == scope_id for reserved, _ in reservation):
                self.regate.add(request)

    def report_failure(
        self, request: Request, error: ScopeManagerError, consequence: str
    ) -> None:
        """Report, once per component, a scope manager that raised for
        *request*, and what that means for it."""
        report(request, error.component, error.error, consequence, self.crawler.stats)

    # -- waiting -----------------------------------------------------------------

    async def acquire(
        self,
        request: Request,
        request_delay: Callable[[Request], float],
        get_scopes: Callable[[Request], Awaitable[RequestScopes]],
        release: Callable[[Request], None],
    ) -> None:
        """Wait until every scope of *request* allows it, then reserve it
        (see :meth:`~scrapy_adaptive_throttle.ThrottlingManager.acquire`);
        the manager's hooks give its ``throttling_delay``, its scopes and
        the release of a reservation to gate again."""
        if request in self.reserved:
            if request not in self.regate:
                return
            # Its scope changed (a Crawl-delay) after it was reserved.
            self.regate.discard(request)
            release(request)
        if is_robots_request(request):
            self.reserved[request] = []
            return
        self.waiting += 1
        try:
            while (delay := request_delay(request)) > 0:
                self.raise_if_closing(request)
                await sleep(min(delay, CLOSE_CHECK_INTERVAL))
            scope_values = list(iter_scope_values(await get_scopes(request)))
            await self.wait_and_reserve(request, scope_values)
        finally:
            self.waiting -= 1

    async def wait_and_reserve(
        self, request: Request, scope_values: ScopeValues
    ) -> None:
        """Wait until every scope in *scope_values* allows *request*, then
        reserve it."""
        woken = False
        waited = False
        while True:
            now = self.clock()
            wait, blocked = self.check_scopes(scope_values, now)
            if wait <= 0 and blocked is None:
                self.reserve_scopes(request, scope_values, now)
                return
            if woken:
                # We were handed a freed slot we cannot use: pass it on.
                self._pass_on_wakeups(scope_values)
                woken = False
            self.raise_if_closing(request)
            if not waited:
                waited = True
                if self.crawler.stats is not None:
                    self.crawler.stats.inc_value("throttling/gate/wait_count")
                self._maybe_warn_waiting()
            if wait > 0:
                if self.config.debug:
                    logger.debug(
                        "Throttling %s for %.2fs (scopes: %s)",
                        request,
                        wait,
                        [scope for scope, _ in scope_values],
                    )
                await sleep(min(wait, CLOSE_CHECK_INTERVAL))
                continue
            if self.config.debug:
                logger.debug(
                    "Throttling %s until a slot of scope %s frees up", request, blocked
                )
            assert blocked is not None
            woken = await self._wait_for_slot(self.registry.get(blocked))

    async def _wait_for_slot(self, adapter: ScopeAdapter) -> bool:
        event = adapter.slot_event()
        if event is None:
            await sleep(_POLL_INTERVAL)
            return False
        done: Deferred[bool] = Deferred()
        event.addCallback(lambda _: _fire(done, True))
        timer = call_later(CLOSE_CHECK_INTERVAL, lambda: _fire(done, False))
        try:
            return await maybe_deferred_to_future(done)
        finally:
            timer.cancel()
            if not event.called:
                adapter.discard_slot_event(event)

    def _pass_on_wakeups(self, scope_values: ScopeValues) -> None:
        for scope_id, _ in scope_values:
            self.registry.get(scope_id).wake_waiter()

    def raise_if_closing(self, request: Request) -> None:
        """Drop *request* (:exc:`~scrapy.exceptions.IgnoreRequest`) if the
        crawl is closing: a waiter must not hold the close up."""
        try:
            engine = self.crawler.engine
        except RuntimeError:  # the crawl has not started yet
            return
        slot = getattr(engine, "_slot", None)  # Scrapy's engine, not user code
        if engine is None or not engine.running or slot is None or slot.closing:
            raise IgnoreRequest(
                f"Throttled request dropped: the spider is closing: {request}"
            )

    def _maybe_warn_waiting(self) -> None:
        threshold = self.config.warn_threshold
        if self._warned_waiting or self.waiting < threshold:
            return
        self._warned_waiting = True
        logger.warning(
            "There are %d requests held back by throttling outside the scheduler "
            "(e.g. sent with engine.download()). See DELAYED_REQUESTS_WARN_THRESHOLD.",
            self.waiting,
        )


def _fire(deferred: Deferred[bool], result: bool) -> None:
    if not deferred.called:
        deferred.callback(result)
