"""The throttling manager: requests → scopes → scope managers.

It owns the scope managers (creation, LRU and idle eviction), gates requests
that do not come through the throttling-aware scheduler, turns responses and
download exceptions into backoff, and merges robots.txt Crawl-delay.
"""

from __future__ import annotations

import difflib
import inspect
import itertools
import logging
import math
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from contextlib import suppress
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import IgnoreRequest
from scrapy.resolver import dnscache
from scrapy.utils.asyncio import call_later, sleep
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.python import global_object_name
from twisted.internet.defer import Deferred

from ._algorithms import (
    parse_ratelimit,
    parse_ratelimit_remaining,
    parse_ratelimit_reset,
    parse_retry_after,
)
from ._containment import ScopeManagerError, report, validate_scopes
from ._decisions import record_backoff_decision, responding
from ._meta_keys import (
    DELAY_DEADLINE_META_KEY,
    DELAY_META_KEY,
    DELAYED_META_KEY,
    DONT_OBEY_ROBOTSTXT_META_KEY,
    DOWNLOAD_LATENCY_META_KEY,
    DOWNLOAD_SLOT_META_KEY,
    SCOPES_META_KEY,
    SLOT_STAMP_META_KEY,
)
from ._settings import ThrottlingSettings
from ._shared_state import SharedState
from ._types import (
    RESOLVED_SCOPES_META_KEY,
    BackoffData,
    BackoffScopeData,
    RequestScopes,
    ScopeID,
    dont_track,
    iter_scope_values,
    iter_scopes,
    scope_cache,
)

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

    from ._explain import Explanation

logger = logging.getLogger(__name__)

#: The longest throttling_delay honoured (one day): a longer one is taken for
#: a mistake (milliseconds, or a timestamp) rather than held for ever.
MAX_REQUEST_DELAY = 86400.0
#: The longest a gate waiter sleeps before checking whether the crawl closes.
_CLOSE_CHECK_INTERVAL = 1.0
#: Scopes that back off on this status are the ones held by a successful
#: response saying that the quota is used up: the next answer would be it.
_RATE_LIMITED = 429
#: The request whose response :meth:`ThrottlingManager.process_response` is
#: handling, for responses that an overridden ``get_response_backoff`` builds
#: without one (the reference chapter's "X-Upstream-Status-Code" example).
_RESPONSE_REQUEST: ContextVar[Request | None] = ContextVar(
    "_RESPONSE_REQUEST", default=None
)

ScopeValues = list[tuple[ScopeID, "float | None"]]
Reservation = list[tuple[ScopeID, Any]]


def is_robots_request(request: Request) -> bool:
    """Whether *request* is RobotsTxtMiddleware's own robots.txt download.

    Those are never throttled: the request that triggered the download may
    hold the scope's only slot while it waits for robots.txt (a deadlock),
    and there is one per host and crawl.
    """
    return bool(request.meta.get(DONT_OBEY_ROBOTSTXT_META_KEY)) and (
        urlparse_cached(request).path == "/robots.txt"
    )


class ThrottlingManager:
    """The default :setting:`THROTTLING_MANAGER`, reachable as ``crawler.throttler``.

    Subclass it to change how scopes are assigned (:meth:`get_scopes` or
    the synchronous :meth:`get_request_scopes`) or how backoff is derived
    (:meth:`get_response_backoff`, :meth:`get_exception_backoff`).

    It is also the scheduler queue's gate (the ``QueueGate`` interface of
    ``_queue_gate.py``: :meth:`resolve_scopes_now`, :meth:`check_scopes`,
    :meth:`reserve_scopes`, :meth:`release` and release listeners), so the
    queue calls it without an adapter.
    """

    #: QueueGate: :meth:`check_scopes` needs scopes only, not the request.
    needs_head = False

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.config: ThrottlingSettings = ThrottlingSettings.from_crawler(crawler)
        self.clock: Callable[[], float] = time.monotonic
        self._scope_managers: OrderedDict[ScopeID, Any] = OrderedDict()
        self._reserved: dict[Request, Reservation] = {}
        #: When each reserved request was sent (on :attr:`clock`), for the
        #: scopes that learn their pace from 429 answers.
        self._reserved_at: dict[Request, float] = {}
        self._release_listeners: list[Callable[[ScopeID], None]] = []
        self._timer_listeners: list[Callable[[ScopeID], None]] = []
        self._crawl_delays: dict[ScopeID, float] = {}
        self._warned_robots: set[ScopeID] = set()
        # Reserved requests to gate again (see _regate_reserved).
        self._regate: weakref.WeakSet[Request] = weakref.WeakSet()
        self._backoff_codes = self.config.common.http_codes.union(
            *(scope.http_codes for scope in self.config.scopes.values())
        )
        # Set on the first look, so that the first eviction pass comes one
        # half max-idle later: a scope configured before its first request
        # (e.g. with set_scope_delay) must not be dropped as never used.
        self._last_eviction: float | None = None
        self._gate_waiting = 0
        self._warned_waiting = False
        self._warned_invalid_delay = False
        self._sync_get_scopes = type(self).get_scopes is ThrottlingManager.get_scopes
        self._stats = crawler.stats
        #: QueueGate: the quota of each configured quota scope.
        self.quotas: dict[ScopeID, float] = {
            scope_id: scope.quota
            for scope_id, scope in self.config.scopes.items()
            if scope.quota
        }
        if self.config.robotstxt_obey:
            crawler.signals.connect(
                self._on_robots_parsed, signal=signals.robots_parsed
            )
        # THROTTLING_SCOPES keys that got a scope manager, i.e. matched a
        # scope of some request: the others are named at close.
        self._matched_configured: set[ScopeID] = set()
        if self.config.scopes_set:
            crawler.signals.connect(
                self._warn_unmatched_scopes, signal=signals.spider_closed
            )
        #: The state shared with other processes through Redis
        #: (:setting:`THROTTLING_STATE_URL`), or ``None``.
        self.shared: SharedState | None = SharedState.from_crawler(crawler)
        if self.shared is not None:
            crawler.signals.connect(self.shared.close, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    # -- scopes -------------------------------------------------------------

    def get_request_scopes(self, request: Request) -> RequestScopes:
        """Return the scopes of *request*, synchronously.

        ``throttling_scopes`` meta if set; else the URL's ``host[:port]``,
        plus the IP of the host as a second scope when
        :setting:`CONCURRENT_REQUESTS_PER_IP` is positive and the DNS cache
        knows it, plus the request's ``download_slot`` when another component
        set one (scrapy-zyte-api's ``zyte-api@<host>``, a proxy rotation
        plugin's slot per proxy): an added scope, never a replacement, so
        the host's limits still apply (see :ref:`other-plugins`).
        """
        meta = request.meta
        scopes = meta.get(SCOPES_META_KEY)
        if scopes is not None:
            return scopes  # type: ignore[no-any-return]
        parsed = urlparse_cached(request)
        netloc = parsed.netloc.rpartition("@")[2].lower()
        ip = None
        if self.config.ip_concurrency > 0:
            cached = dnscache.get(parsed.hostname or "")
            if isinstance(cached, str) and cached not in (netloc, parsed.hostname):
                ip = cached
        slot = meta.get(DOWNLOAD_SLOT_META_KEY)
        if slot is not None and slot != meta.get(SLOT_STAMP_META_KEY):
            slot = str(slot)
            if slot != netloc:
                self.config.add_slot_scope(slot)
                return [netloc, ip, slot] if ip else [netloc, slot]
        return [netloc, ip] if ip else netloc

    @scope_cache
    async def get_scopes(self, request: Request) -> RequestScopes:
        """Return the scopes of *request* (see :meth:`get_request_scopes`)."""
        return self.get_request_scopes(request)

    def resolve_scopes_now(
        self, request: Request
    ) -> RequestScopes | Deferred[RequestScopes]:
        """Resolve and persist the scopes of *request* without waiting.

        Returns the scopes, or a Deferred when :meth:`get_scopes` really
        awaits something (e.g. a DNS lookup); used by the scheduler queue,
        whose ``push`` is synchronous.
        """
        if self._sync_get_scopes:
            scopes = validate_scopes(self.get_request_scopes(request), request)
            request.meta[RESOLVED_SCOPES_META_KEY] = scopes
            return scopes
        coroutine = self.get_scopes(request)
        try:
            coroutine.send(None)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        # It suspended on a real await: resolve again, asynchronously.
        coroutine.close()
        from scrapy.utils.defer import deferred_from_coro

        return deferred_from_coro(self.get_scopes(request))

    def _sent_scope_values(self, request: Request) -> ScopeValues:
        reservation = self._reserved.get(request)
        if reservation:
            amounts = dict(
                iter_scope_values(request.meta.get(RESOLVED_SCOPES_META_KEY))
            )
            return [(scope, amounts.get(scope)) for scope, _ in reservation]
        if RESOLVED_SCOPES_META_KEY in request.meta:
            return list(iter_scope_values(request.meta[RESOLVED_SCOPES_META_KEY]))
        return list(iter_scope_values(self.get_request_scopes(request)))

    def get_slot_key(self, request: Request) -> str:
        """The scopes of *request* as one string (sorted ids joined by ``+``)."""
        scopes = request.meta.get(RESOLVED_SCOPES_META_KEY)
        if scopes is None:
            scopes = self.get_request_scopes(request)
        if isinstance(scopes, str):
            return scopes
        return "+".join(sorted(iter_scopes(scopes)))

    # -- scope managers --------------------------------------------------------

    def get_scope_manager(self, scope_id: ScopeID) -> Any:
        """Return the scope manager of *scope_id*, creating it if needed."""
        managers = self._scope_managers
        manager = managers.get(scope_id)
        if manager is not None:
            managers.move_to_end(scope_id)
            return manager
        return self._create_scope_manager(scope_id)

    def _create_scope_manager(self, scope_id: ScopeID) -> Any:
        scope_config = self.config.scope(scope_id)
        cls = scope_config.manager or self.config.scope_manager_cls
        if scope_config.kind == "slot" and scope_config.manager is None:
            # Another plugin's slot with no entry of its own: it limits
            # nothing (the host scope does), so there is nothing to adapt.
            from ._scope_manager import ThrottlingScopeManager

            cls = ThrottlingScopeManager
        config = dict(scope_config.raw)
        config["id"] = scope_id
        try:
            if hasattr(cls, "from_crawler"):
                manager = cls.from_crawler(self.crawler, config)
            else:
                manager = cls(self.crawler, config)
        except Exception as exc:
            raise ScopeManagerError(scope_id, cls, "from_crawler", exc) from exc
        self._scope_managers[scope_id] = manager
        if scope_id in self.config.scopes:
            self._matched_configured.add(scope_id)
        crawl_delay = self._crawl_delays.get(scope_id)
        if crawl_delay is not None:
            self._apply_crawl_delay(scope_id, manager, crawl_delay)
        self._enforce_scope_limit(scope_id)
        return manager

    def _enforce_scope_limit(self, keep: ScopeID) -> None:
        limit = self.config.scope_limit
        managers = self._scope_managers
        if not limit or len(managers) <= limit:
            return
        now = self.clock()
        # Busy scopes are never evicted; they move to the back so that the
        # next look starts with idle ones, and a bounded number of looks
        # keeps creation O(1) even when many scopes are busy.
        for _ in range(min(len(managers), 16)):
            if len(managers) <= limit:
                return
            scope_id, manager = managers.popitem(last=False)
            if scope_id != keep and _is_idle(manager, now, 0.0):
                continue
            managers[scope_id] = manager

    def _maybe_evict(self, now: float) -> None:
        max_idle = self.config.scope_max_idle
        if max_idle <= 0:
            return
        if self._last_eviction is None:
            self._last_eviction = now
            return
        if now - self._last_eviction < max_idle / 2:
            return
        self._last_eviction = now
        idle = [
            scope_id
            for scope_id, manager in self._scope_managers.items()
            if _is_idle(manager, now, max_idle)
        ]
        for scope_id in idle:
            del self._scope_managers[scope_id]

    def add_release_listener(self, listener: Callable[[ScopeID], None]) -> None:
        """Call *listener* with the scope id whenever a slot of it is freed."""
        self._release_listeners.append(listener)

    def remove_release_listener(self, listener: Callable[[ScopeID], None]) -> None:
        """Stop calling *listener*."""
        if listener in self._release_listeners:
            self._release_listeners.remove(listener)

    def add_timer_listener(self, listener: Callable[[ScopeID], None]) -> None:
        """Call *listener* with the scope id whenever a time gate of it opened
        sooner than it said (see :meth:`refund_cached`)."""
        self._timer_listeners.append(listener)

    def remove_timer_listener(self, listener: Callable[[ScopeID], None]) -> None:
        """Stop calling *listener*."""
        if listener in self._timer_listeners:
            self._timer_listeners.remove(listener)

    def refund_cached(self, request: Request) -> None:
        """*request* was answered from Scrapy's HTTP cache: give its send back.

        It never reached the host, so it does not space the next request of
        its scopes (delay and jitter) nor use their quota: a crawl served
        from the cache runs as fast as with Scrapy's own downloader, which
        applies ``DOWNLOAD_DELAY`` only to requests it downloads. Its slots
        are freed by :meth:`release`, as for every request. Scope managers
        other than :class:`~scrapy_adaptive_throttle.ThrottlingScopeManager`
        (and its subclasses) keep what they recorded.
        """
        from ._scope_manager import ThrottlingScopeManager

        reservation = self._reserved.get(request)
        sent_at = self._reserved_at.get(request)
        if not reservation or sent_at is None:
            return
        amounts = dict(self._sent_scope_values(request))
        now = self.clock()
        opened: list[ScopeID] = []
        for scope_id, manager in reservation:
            if not isinstance(manager, ThrottlingScopeManager):
                continue
            try:
                if manager.refund_send(sent_at, now, amounts.get(scope_id)):
                    opened.append(scope_id)
            except Exception as exc:
                self._report_scope_failure(
                    request,
                    ScopeManagerError(scope_id, manager, "refund_send", exc),
                    "its send still spaces the next one of that scope",
                )
        for listener in self._timer_listeners:
            for scope_id in opened:
                listener(scope_id)

    # -- readiness -------------------------------------------------------------

    def check_scopes(
        self, scope_values: ScopeValues, now: float, head: Request | None = None
    ) -> tuple[float, ScopeID | None]:
        """Return ``(wait, blocked)`` for a request with these scopes.

        *wait* is the time until every time gate is open; *blocked* the first
        scope at its concurrency limit, or ``None``. *head* (the request, if
        the caller has it) is not needed here.
        """
        wait = 0.0
        blocked: ScopeID | None = None
        for scope_id, amount in scope_values:
            manager = self.get_scope_manager(scope_id)
            try:
                scope_wait = manager.can_send(now, amount)
                if blocked is None and _concurrency_blocked(manager):
                    blocked = scope_id
            except Exception as exc:
                raise ScopeManagerError(scope_id, manager, "can_send", exc) from exc
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
        checks = []
        for scope_id, _ in scope_values:
            manager = self.get_scope_manager(scope_id)
            next_spacing = getattr(manager, "next_spacing", None)
            spacing = next_spacing() if next_spacing is not None else 0.0
            checks.append(
                (
                    scope_id,
                    getattr(manager, "concurrency", None),
                    int(getattr(manager, "active", 0)),
                    float(spacing),
                )
            )
        return shared.check(checks)

    def reserve_scopes(
        self, request: Request, scope_values: ScopeValues, now: float
    ) -> None:
        """Record *request* as sent on each of its scopes.

        All or nothing: if a scope manager fails, the scopes already recorded
        are released again and the error is raised.
        """
        # Every send passes here, whichever path it takes (scheduler queue or
        # gate), so idle scopes are evicted whatever the crawl's setup.
        self._maybe_evict(now)
        reservation: Reservation = []
        for scope_id, amount in scope_values:
            manager = self.get_scope_manager(scope_id)
            try:
                manager.record_sent(now, amount)
            except Exception as exc:
                for _, sent_manager in reservation:
                    with suppress(Exception):
                        sent_manager.record_done(now)
                raise ScopeManagerError(scope_id, manager, "record_sent", exc) from exc
            reservation.append((scope_id, manager))
        self._reserved[request] = reservation
        self._reserved_at[request] = now
        if self.shared is not None:
            self.shared.claim(request, [scope_id for scope_id, _ in scope_values])

    def has_free_slot(self, scope_id: ScopeID) -> bool:
        """Whether *scope_id* has room for one more request now."""
        try:
            return not _concurrency_blocked(self.get_scope_manager(scope_id))
        except Exception:  # reported when a request meets it
            return True

    def is_reserved(self, request: Request) -> bool:
        """Whether *request* holds a reservation (sent, not yet released)."""
        return request in self._reserved

    def is_ready(self, request: Request) -> bool:
        """Whether *request* could be sent right now."""
        if self.get_request_delay(request) > 0:
            return False
        wait, blocked = self.check_scopes(
            self._sent_scope_values(request), self.clock()
        )
        return wait <= 0 and blocked is None

    def reserve(self, request: Request) -> None:
        """Record *request* as sent; a later :meth:`acquire` returns at once."""
        self.reserve_scopes(request, self._sent_scope_values(request), self.clock())

    def get_time_until_ready(self, request: Request) -> float | None:
        """Seconds until every time gate of *request* opens; ``None`` if open."""
        now = self.clock()
        wait, _ = self.check_scopes(self._sent_scope_values(request), now)
        wait = max(wait, self.get_request_delay(request))
        return wait or None

    def get_scope_load(self, scope_id: ScopeID) -> float:
        """Active requests of the scope divided by its concurrency limit."""
        manager = self.get_scope_manager(scope_id)
        get_load = getattr(manager, "get_load", None)
        return float(get_load()) if get_load is not None else 0.0

    def get_request_delay(self, request: Request, now: float | None = None) -> float:
        """Remaining ``throttling_delay`` of *request* (0.0 if none or elapsed).

        The deadline is set the first time this is called for the request,
        in wall-clock time so that it survives a paused and resumed crawl.
        """
        meta = request.meta
        delay = meta.get(DELAY_META_KEY)
        if not delay or meta.get(DELAYED_META_KEY):
            return 0.0
        wall = time.time()
        deadline = meta.get(DELAY_DEADLINE_META_KEY)
        if deadline is None:
            seconds = _request_delay_seconds(delay)
            if seconds is None:
                self._warn_invalid_delay(delay, request)
                meta[DELAYED_META_KEY] = True
                return 0.0
            if seconds == 0:
                meta[DELAYED_META_KEY] = True
                return 0.0
            deadline = wall + seconds
            meta[DELAY_DEADLINE_META_KEY] = deadline
            if self.config.debug:
                logger.debug(
                    "Holding %s for %.2fs (throttling_delay)", request, seconds
                )
        remaining = float(deadline) - wall
        if remaining <= 0:
            meta[DELAYED_META_KEY] = True
            return 0.0
        return remaining

    def _warn_invalid_delay(self, delay: Any, request: Request) -> None:
        self._inc_stat("throttling/invalid_delay_count")
        if self._warned_invalid_delay:
            return
        self._warned_invalid_delay = True
        logger.warning(
            "Ignoring the throttling_delay %r of %s: it must be a number of "
            "seconds from 0 to %d; the request is sent without it. Further "
            "invalid values are only counted (throttling/invalid_delay_count).",
            delay,
            request,
            MAX_REQUEST_DELAY,
        )

    # -- the gate -------------------------------------------------------------

    async def acquire(self, request: Request) -> None:
        """Wait until every scope of *request* allows it, then reserve it.

        Requests reserved by the throttling-aware scheduler queue return at
        once; robots.txt downloads are never held (see :func:`is_robots_request`).
        """
        if request in self._reserved:
            if request not in self._regate:
                return
            # Its scope changed (a Crawl-delay) after it was reserved.
            self._regate.discard(request)
            self.release(request)
        if is_robots_request(request):
            self._reserved[request] = []
            return
        self._gate_waiting += 1
        try:
            await self._acquire(request)
        finally:
            self._gate_waiting -= 1

    async def _acquire(self, request: Request) -> None:
        while (delay := self.get_request_delay(request)) > 0:
            self._raise_if_closing(request)
            await sleep(min(delay, _CLOSE_CHECK_INTERVAL))
        scope_values = list(iter_scope_values(await self.get_scopes(request)))
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
            self._raise_if_closing(request)
            if not waited:
                waited = True
                self._inc_stat("throttling/gate/wait_count")
                self._maybe_warn_waiting()
            if wait > 0:
                if self.config.debug:
                    logger.debug(
                        "Throttling %s for %.2fs (scopes: %s)",
                        request,
                        wait,
                        [scope for scope, _ in scope_values],
                    )
                await sleep(min(wait, _CLOSE_CHECK_INTERVAL))
                continue
            if self.config.debug:
                logger.debug(
                    "Throttling %s until a slot of scope %s frees up", request, blocked
                )
            assert blocked is not None
            woken = await self._wait_for_slot(self.get_scope_manager(blocked))

    async def _wait_for_slot(self, manager: Any) -> bool:
        slot_event = getattr(manager, "slot_event", None)
        if slot_event is None:
            await sleep(0.05)
            return False
        done: Deferred[bool] = Deferred()
        event: Deferred[None] = slot_event()
        event.addCallback(lambda _: _fire(done, True))
        timer = call_later(_CLOSE_CHECK_INTERVAL, lambda: _fire(done, False))
        try:
            return await maybe_deferred_to_future(done)
        finally:
            timer.cancel()
            if not event.called:
                discard = getattr(manager, "discard_slot_event", None)
                if discard is not None:
                    discard(event)

    def _pass_on_wakeups(self, scope_values: ScopeValues) -> None:
        for scope_id, _ in scope_values:
            manager = self.get_scope_manager(scope_id)
            wake = getattr(manager, "wake_waiter", None)
            if wake is not None and not _concurrency_blocked(manager):
                wake()

    def _raise_if_closing(self, request: Request) -> None:
        try:
            engine = self.crawler.engine
        except RuntimeError:  # the crawl has not started yet
            return
        slot = getattr(engine, "_slot", None)
        if engine is None or not engine.running or slot is None or slot.closing:
            raise IgnoreRequest(
                f"Throttled request dropped: the spider is closing: {request}"
            )

    def _maybe_warn_waiting(self) -> None:
        threshold = self.config.warn_threshold
        if self._warned_waiting or self._gate_waiting < threshold:
            return
        self._warned_waiting = True
        logger.warning(
            "There are %d requests held back by throttling outside the scheduler "
            "(e.g. sent with engine.download()). See DELAYED_REQUESTS_WARN_THRESHOLD.",
            self._gate_waiting,
        )

    def release(self, request: Request) -> None:
        """Free the slots reserved for *request*. Idempotent."""
        reservation = self._reserved.pop(request, None)
        self._reserved_at.pop(request, None)
        if self.shared is not None:
            self.shared.release(request)
        if not reservation:
            return
        now = self.clock()
        listeners = self._release_listeners
        for scope_id, manager in reservation:
            try:
                manager.record_done(now)
            except Exception as exc:
                # The download itself succeeded or failed on its own: its
                # outcome still reaches the spider, and the other scopes and
                # the waiters are released.
                self._report_scope_failure(
                    request,
                    ScopeManagerError(scope_id, manager, "record_done", exc),
                    "its slot may stay counted by that scope manager",
                )
            for listener in listeners:
                listener(scope_id)

    def _report_scope_failure(
        self, request: Request, error: ScopeManagerError, consequence: str
    ) -> None:
        """Report, once per component, a scope manager that raised for
        *request*, and what that means for it."""
        report(request, error.component, error.error, consequence, self._stats)

    def notify_slots_changed(self, scope_id: ScopeID) -> None:
        """Tell waiters that *scope_id* may have room (e.g. a raised limit)."""
        for listener in self._release_listeners:
            listener(scope_id)

    # -- backoff ----------------------------------------------------------------

    async def get_initial_backoff(self) -> BackoffData:
        """Backoff data applied once, when the spider opens (default: none).

        Override it to start a crawl already backed off, e.g. with a delay
        remembered from a previous run: return the same kind of data as
        :meth:`get_response_backoff`.
        """
        return None

    def get_response_delay(self, response: Response) -> float | None:
        """Return the delay, in seconds, that a backoff response asks for.

        The largest of ``Retry-After`` (seconds or an HTTP date),
        ``RateLimit-Reset`` (seconds) and the reset time of an exhausted
        policy of the IETF ``RateLimit`` header (with ``RateLimit-Policy``);
        ``None`` when none of them gives a usable value. Malformed, negative,
        non-finite and past values are ignored.

        Only called for responses whose status is a backoff code of one of
        their scopes; override it to read other headers.
        """
        headers = response.headers
        retry_after = parse_retry_after(headers.get(b"Retry-After"), time.time())
        reset = parse_ratelimit_reset(headers.get(b"RateLimit-Reset"))
        delays = [
            delay
            for delay in (retry_after, reset, self._exhausted_ratelimit_delay(response))
            if delay is not None
        ]
        return max(delays) if delays else None

    def get_exhausted_quota_delay(self, response: Response) -> float | None:
        """Return the seconds until the server's quota resets, if this
        (successful) response says that the quota is used up, else ``None``.

        A quota is used up when a policy of the IETF ``RateLimit`` header has
        ``r=0`` (its ``t``, or the ``w`` of its ``RateLimit-Policy``, is the
        reset time), or when ``RateLimit-Remaining`` is ``0`` (then
        ``RateLimit-Reset`` is). The next request would be refused anyway,
        so the scope is held until the reset, as if the server had answered
        429 with that delay.
        """
        headers = response.headers
        delays = [self._exhausted_ratelimit_delay(response)]
        if parse_ratelimit_remaining(headers.get(b"RateLimit-Remaining")) == 0:
            delays.append(parse_ratelimit_reset(headers.get(b"RateLimit-Reset")))
        valid = [delay for delay in delays if delay is not None]
        return max(valid) if valid else None

    @staticmethod
    def _exhausted_ratelimit_delay(response: Response) -> float | None:
        headers = response.headers
        ratelimit = headers.getlist(b"RateLimit")
        if not ratelimit:
            return None
        # A structured-field list may be split over several header lines.
        return parse_ratelimit(
            b", ".join(ratelimit), b", ".join(headers.getlist(b"RateLimit-Policy"))
        )

    async def get_response_backoff(self, response: Response) -> BackoffData:
        """Return the backoff that *response* calls for.

        Each scope of the request whose backoff codes (:setting:`BACKOFF_HTTP_CODES`
        or its ``"backoff"`` ``"http_codes"``) include the status backs off:
        ``{scope: {"delay": seconds}}`` when the response gives a delay (see
        :meth:`get_response_delay`), else the bare scopes (one exponential
        step each). Scopes that back off on 429 are also held when another
        response says the quota is used up (see
        :meth:`get_exhausted_quota_delay`). ``None`` when nothing backs off
        or the request has :reqmeta:`throttling_dont_track`.

        A response built without a request (e.g. a copy of the real one with
        another status, passed to ``super()``) counts for the request being
        processed.
        """
        request = response.request
        if request is None:
            request = _RESPONSE_REQUEST.get()
        if request is None or dont_track(request.meta):
            return None
        status = response.status
        headers = response.headers
        if status not in self._backoff_codes and not (
            b"RateLimit" in headers or b"RateLimit-Remaining" in headers
        ):
            return None  # the common case, decided without looking at scopes
        triggered: list[ScopeID] = []
        rate_limited: list[ScopeID] = []
        for scope, _ in self._sent_scope_values(request):
            codes = self.config.scope(scope).http_codes
            if status in codes:
                triggered.append(scope)
            elif _RATE_LIMITED in codes:
                rate_limited.append(scope)
        backoff: dict[ScopeID, BackoffScopeData] = {}
        if triggered:
            delay = self.get_response_delay(response)
            if not delay:
                if not rate_limited:
                    return triggered
                backoff.update((scope, {}) for scope in triggered)
            else:
                backoff.update((scope, {"delay": delay}) for scope in triggered)
        if rate_limited:
            quota_delay = self.get_exhausted_quota_delay(response)
            if quota_delay:
                hold: BackoffScopeData = {"delay": quota_delay}
                backoff.update((scope, hold) for scope in rate_limited)
        return backoff or None

    async def get_exception_backoff(
        self, request: Request, exception: BaseException
    ) -> BackoffData:
        """Return the backoff that a download exception calls for: the scopes
        of *request* whose backoff exceptions (:setting:`BACKOFF_EXCEPTIONS`
        or their ``"backoff"`` ``"exceptions"``) include its type, as bare
        scopes; ``None`` for :reqmeta:`throttling_dont_track` requests."""
        if dont_track(request.meta):
            return None
        scopes = [
            scope
            for scope, _ in self._sent_scope_values(request)
            if isinstance(exception, self.config.scope(scope).exceptions)
        ]
        return scopes or None

    async def process_response(self, response: Response) -> None:
        """Update throttling state from a downloaded (non-cached) response.

        Called for every attempt, before RetryMiddleware decides to retry it.
        """
        request = response.request
        now = self.clock()
        token = _RESPONSE_REQUEST.set(request)
        try:
            backoff = await self.get_response_backoff(response)
        finally:
            _RESPONSE_REQUEST.reset(token)
        if backoff is not None:
            with responding(response):  # names the header of a hold in the log
                self.apply_backoff(backoff, now=now, cause=f"status/{response.status}")
            if response.status == 429:
                self._record_rate_limited(backoff, now, request)
        if request is None or dont_track(request.meta):
            return
        latency = request.meta.get(DOWNLOAD_LATENCY_META_KEY)
        reservation = self._reserved.get(request)
        if not reservation:
            return
        for _, manager in reservation:
            record = getattr(manager, "record_response", None)
            if record is not None:
                record(latency, response.status, now)

    def _record_rate_limited(
        self, backoff: BackoffData, now: float, request: Request | None
    ) -> None:
        """Tell the scopes that backed off on a 429 that they were refused
        for their rate (``record_rate_limited``, optional), with when the
        request was sent, so they can learn the pace the server accepts."""
        sent_at = self._reserved_at.get(request) if request is not None else None
        scopes = backoff.keys() if isinstance(backoff, dict) else iter_scopes(backoff)
        for scope_id in list(scopes):
            manager = self.get_scope_manager(scope_id)
            record = getattr(manager, "record_rate_limited", None)
            if record is not None:
                record(now, sent_at)

    async def process_exception(
        self, request: Request, exception: BaseException
    ) -> None:
        """Update throttling state from a download exception."""
        backoff = await self.get_exception_backoff(request, exception)
        if backoff is not None:
            self.apply_backoff(
                backoff,
                now=self.clock(),
                cause=f"exception/{global_object_name(type(exception))}",
            )

    def apply_backoff(
        self, backoff: BackoffData, *, now: float | None = None, cause: str = "other"
    ) -> None:
        """Apply backoff data as returned by the backoff hooks.

        :param backoff: a scope, scopes, or ``{scope: data}``. A bare scope
            (or empty data) takes one exponential backoff step; ``"delay"``
            holds the scope that many seconds instead (capped at its
            ``max_delay``; a missing, zero, negative or invalid delay counts
            as none); ``"consumed"`` / ``"remaining"`` alone only correct the
            quota estimate and are no backoff trigger.
        :param now: the current time of :attr:`clock`.
        :param cause: what triggered it, for the
            ``throttling/backoff/<cause>_count`` stat and the debug log.
        """
        if backoff is None:
            return
        if now is None:
            now = self.clock()
        items: Iterable[tuple[ScopeID, Any]]
        if isinstance(backoff, dict):
            items = backoff.items()
        else:
            items = ((scope, None) for scope in iter_scopes(backoff))
        for scope_id, entry in items:
            manager = self.get_scope_manager(scope_id)
            delay = None
            if isinstance(entry, dict):
                consumed = entry.get("consumed")
                remaining = entry.get("remaining")
                if consumed is not None or remaining is not None:
                    reconcile = getattr(manager, "reconcile_quota", None)
                    if reconcile is not None:
                        reconcile(consumed=consumed, remaining=remaining, now=now)
                    if "delay" not in entry:
                        continue
                delay = _valid_delay(entry.get("delay"))
            record_backoff = getattr(manager, "record_backoff", None)
            if record_backoff is None:
                continue  # a custom scope manager that never backs off
            record_backoff(delay=delay, now=now)
            if self.shared is not None:
                self._share_hold(scope_id, manager, now)
            self._count_trigger(cause, server_delay=delay is not None)
            record_backoff_decision(
                self.crawler,
                scope_id,
                manager,
                delay,
                cause,
                now,
                debug=self.config.debug,
            )

    def _share_hold(self, scope_id: ScopeID, manager: Any, now: float) -> None:
        """Hold *scope_id* in every process for as long as it waits here
        after a backoff trigger (the hold or the backed-off delay)."""
        assert self.shared is not None
        # A custom scope manager without backoff_wait: its time gates.
        read = getattr(manager, "backoff_wait", None) or manager.can_send
        try:
            wait = float(read(now))
        except Exception:  # reported when a request meets it
            return
        self.shared.hold(scope_id, wait)

    def _count_trigger(self, cause: str, *, server_delay: bool) -> None:
        stats = self._stats
        if stats is None:
            return
        stats.inc_value("throttling/backoff/count")
        stats.inc_value(f"throttling/backoff/{cause}_count")
        if server_delay:
            stats.inc_value("throttling/backoff/server_delay_count")

    def delay_scope(self, scope_id: ScopeID, delay: float) -> None:
        """Hold back every request of *scope_id* for at least *delay* seconds.

        Counted as a backoff trigger, and trusted: unlike a server-given
        delay, it is not capped at :setting:`BACKOFF_MAX_DELAY`.

        :raises ValueError: if *delay* is negative or not a finite number.
        """
        message = f"Invalid delay for scope {scope_id!r}: {delay!r}"
        try:
            seconds = float(delay)
        except (TypeError, ValueError):
            raise ValueError(message) from None
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(message)
        now = self.clock()
        manager = self.get_scope_manager(scope_id)
        record_backoff = getattr(manager, "record_backoff", None)
        if record_backoff is None:
            return  # a custom scope manager that never backs off
        if _accepts_keyword(record_backoff, "cap"):
            record_backoff(delay=seconds, now=now, cap=False)
        else:  # a custom scope manager that predates the cap argument
            record_backoff(delay=seconds, now=now)
        if self.shared is not None:
            self._share_hold(scope_id, manager, now)
        self._count_trigger("delay_scope", server_delay=False)
        record_backoff_decision(
            self.crawler,
            scope_id,
            manager,
            seconds,
            "delay_scope",
            now,
            debug=self.config.debug,
        )

    def get_scope_delay(self, scope_id: ScopeID) -> float:
        """The base (non-backoff) delay of *scope_id*."""
        getter = getattr(self.get_scope_manager(scope_id), "get_base_delay", None)
        return float(getter()) if getter is not None else 0.0

    def set_scope_delay(self, scope_id: ScopeID, delay: float) -> None:
        """Set the base delay of *scope_id*, up or down (not a backoff trigger)."""
        manager = self.get_scope_manager(scope_id)
        set_base_delay = getattr(manager, "set_base_delay", None)
        if set_base_delay is None:
            raise TypeError(
                f"The scope manager of {scope_id!r} ({type(manager).__name__}) has "
                "no set_base_delay(): its delay cannot be changed"
            )
        if _accepts_keyword(set_base_delay, "only_increase"):
            set_base_delay(float(delay), only_increase=False)
        else:  # e.g. the reference chapter's FixedWindowScopeManager
            set_base_delay(float(delay))

    def get_scope_state(self, scope_id: ScopeID) -> dict[str, Any]:
        """A snapshot of the state of *scope_id* (created if unknown)."""
        manager = self.get_scope_manager(scope_id)
        getter = getattr(manager, "get_state", None)
        if getter is not None:
            return dict(getter(self.clock()))
        return {"scope": scope_id, "manager": type(manager).__name__}

    def iter_scope_states(self) -> Iterable[dict[str, Any]]:
        """Snapshots of every live scope."""
        now = self.clock()
        for scope_id, manager in list(self._scope_managers.items()):
            getter = getattr(manager, "get_state", None)
            if getter is not None:
                yield dict(getter(now))
            else:
                yield {"scope": scope_id, "manager": type(manager).__name__}

    # -- robots.txt ---------------------------------------------------------------

    def _on_robots_parsed(self, robotparser: Any, request: Request) -> None:
        try:
            delay = robotparser.crawl_delay(self.config.user_agent)
        except Exception:  # a third-party parser must never break the crawl
            logger.debug(
                "Could not read Crawl-delay from %r", robotparser, exc_info=True
            )
            return
        if delay is None:
            return
        try:
            seconds = float(delay)
        except (TypeError, ValueError):
            return
        self.apply_robots_crawl_delay(self.get_crawl_delay_scope(request), seconds)

    def get_crawl_delay_scope(self, request: Request) -> ScopeID:
        """Return the scope that the robots.txt Crawl-delay of *request*'s
        host applies to: the host's default scope, ``host[:port]``.

        Override it when your scopes group hosts differently (e.g. by
        registrable domain).
        """
        return urlparse_cached(request).netloc.rpartition("@")[2].lower()

    def apply_robots_crawl_delay(self, scope_id: ScopeID, delay: float) -> None:
        """Apply a robots.txt Crawl-delay to *scope_id*.

        The scope gets that delay (capped at
        :setting:`THROTTLING_ROBOTSTXT_MAX_DELAY`) as a minimum spacing and a
        concurrency of 1, except for what its :setting:`THROTTLING_SCOPES`
        entry sets more aggressively (that wins, with one warning) or when
        the entry has ``"ignore_robots_txt": True`` (nothing changes). The
        value is remembered and applied again if the scope's state is
        evicted and recreated. Requests of the scope that were already
        handed to the downloader but not sent yet (they were waiting for
        robots.txt) go through the gate again.
        """
        if not self.config.robotstxt_obey:
            return
        if not (math.isfinite(delay) and delay > 0):
            return
        capped = min(delay, self.config.robotstxt_max_delay)
        known = self._crawl_delays.get(scope_id, 0.0)
        self._crawl_delays[scope_id] = max(capped, known)
        manager = self.get_scope_manager(scope_id)
        if self._apply_crawl_delay(scope_id, manager, capped, warn=True):
            self._inc_stat("throttling/robotstxt/crawl_delay_count")
            self._regate_reserved(scope_id)

    def _apply_crawl_delay(
        self, scope_id: ScopeID, manager: Any, delay: float, *, warn: bool = False
    ) -> bool:
        configured = self.config.scopes.get(scope_id)
        keep_delay = keep_concurrency = False
        if configured is not None:
            if configured.ignore_robots_txt:
                return False
            conflicts = []
            if configured.explicit_delay and configured.delay < delay:
                keep_delay = True
                conflicts.append(f"delay {configured.delay!r} < Crawl-delay {delay!r}")
            if configured.explicit_concurrency and configured.concurrency != 1:
                keep_concurrency = True
                limit = configured.concurrency or "unlimited"
                conflicts.append(f"concurrency {limit} > 1")
            elif configured.min_concurrency > 1:
                keep_concurrency = True
                conflicts.append(f"min_concurrency {configured.min_concurrency} > 1")
            if conflicts and warn and scope_id not in self._warned_robots:
                self._warned_robots.add(scope_id)
                logger.warning(
                    "THROTTLING_SCOPES[%r] is more aggressive than the robots.txt "
                    "Crawl-delay of %ss (%s); the configured values are used. Set "
                    "'ignore_robots_txt': True in that entry to silence this warning.",
                    scope_id,
                    delay,
                    " and ".join(conflicts),
                )
        if keep_delay and keep_concurrency:
            return False
        if not keep_delay:
            setter = getattr(manager, "set_base_delay", None)
            if setter is not None:
                setter(delay)
            floor = getattr(manager, "set_delay_floor", None)
            if floor is not None:
                floor(delay)
        if not keep_concurrency:
            setter = getattr(manager, "set_concurrency", None)
            if setter is not None:
                setter(1)
        if self.config.debug:
            logger.debug(
                "robots.txt Crawl-delay for scope %s: delay %s, concurrency %s",
                scope_id,
                "kept" if keep_delay else f"{delay:.3f}s",
                "kept" if keep_concurrency else 1,
            )
        return True

    def _regate_reserved(self, scope_id: ScopeID) -> None:
        # Requests popped (and reserved) before robots.txt was parsed wait in
        # RobotsTxtMiddleware, ahead of the gate: without this, every one of
        # them would go out at once, ignoring the Crawl-delay just applied.
        for request, reservation in self._reserved.items():
            if any(reserved == scope_id for reserved, _ in reservation):
                self._regate.add(request)

    # -- misc -------------------------------------------------------------------

    def _warn_unmatched_scopes(self) -> None:
        # A key that never matches (a bare host for a host with a port, a
        # URL instead of host[:port]) is otherwise a silent no-op.
        unmatched = [
            scope
            for scope in self.config.scopes
            if scope not in self._matched_configured
        ]
        if not unmatched:
            return
        # The most recently used scopes: enough for a hint, and bounded in a
        # broad crawl.
        live = [
            scope
            for scope in itertools.islice(reversed(self._scope_managers), 10_000)
            if isinstance(scope, str)
        ]
        hints = []
        for scope in unmatched:
            closest = difflib.get_close_matches(scope, live, n=1, cutoff=0.5)
            hint = f" (closest scope of the crawl: {closest[0]!r})" if closest else ""
            hints.append(f"{scope!r}{hint}")
        logger.warning(
            "THROTTLING_SCOPES entries that matched no request of this crawl: %s. "
            "A key must be a scope id exactly as the requests get it: host[:port] "
            "of the URL by default (see 'scrapy throttling URL').",
            "; ".join(hints),
        )

    def _inc_stat(self, key: str) -> None:
        if self._stats is not None:
            self._stats.inc_value(key)

    def explain(self, request_or_scope: Request | ScopeID) -> Explanation:
        """Why *request_or_scope* waits: each of its scopes, the reason that
        holds it back (delay, concurrency, backoff, quota, Crawl-delay) and
        for how long, its current limit and state.

        Reading it changes no state. See :ref:`observability`.
        """
        from ._explain import explain

        return explain(self, request_or_scope)


def _fire(deferred: Deferred[bool], result: bool) -> None:
    if not deferred.called:
        deferred.callback(result)


def _valid_delay(value: Any) -> float | None:
    """A usable hold in seconds, or None (then the trigger takes an
    exponential step): a zero hold would count a trigger without slowing
    anything down."""
    if value is None or isinstance(value, bool):
        return None
    try:
        delay = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(delay) or delay <= 0:
        return None
    return delay


def _request_delay_seconds(value: Any) -> float | None:
    """*value* of ``throttling_delay`` in seconds, ``None`` if out of range."""
    if isinstance(value, bool):
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    if not 0 <= seconds <= MAX_REQUEST_DELAY:  # also false for nan
        return None
    return seconds


def _accepts_keyword(method: Callable[..., Any], name: str) -> bool:
    try:
        parameters = inspect.signature(method).parameters
    except (TypeError, ValueError):  # no introspectable signature: assume so
        return True
    return name in parameters or any(
        parameter.kind is inspect.Parameter.VAR_KEYWORD
        for parameter in parameters.values()
    )


def _concurrency_blocked(manager: Any) -> bool:
    blocked = getattr(manager, "concurrency_blocked", None)
    return bool(blocked()) if blocked is not None else False


def _is_idle(manager: Any, now: float, max_idle: float) -> bool:
    is_idle = getattr(manager, "is_idle", None)
    if is_idle is not None:
        return bool(is_idle(now, max_idle))
    return not getattr(manager, "active", 0)
