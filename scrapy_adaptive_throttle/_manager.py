"""The throttling manager: requests -> scopes -> scope managers.

A thin facade, reachable as ``crawler.throttler``, over the objects that own
the state: the scope resolver (``_scope_resolver.py``), the registry of
scope managers (``_scope_registry.py``, through the adapter of
``_scope_adapter.py``), the gate (``_scope_gate.py``, and the manager's
``queue_gate`` of ``_manager_gate.py``), what a download's outcome changes
(``_download_outcomes.py`` over ``_backoff_triggers.py``), the robots.txt
Crawl-delays (``_robots_crawl_delay.py``) and the pure response policy
(``_algorithms/response_policy.py``). Its methods are the ones to override
and the protocol's. See :doc:`/architecture`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ._algorithms.response_policy import exhausted_quota_delay, response_delay
from ._backoff_triggers import BackoffTriggers
from ._clock import MONOTONIC_CLOCK, WALL_CLOCK
from ._download_outcomes import DownloadOutcomes
from ._manager_gate import ManagerGate
from ._robots_crawl_delay import CrawlDelays
from ._scope_gate import Reservation, ScopeGate, ScopeValues
from ._scope_registry import ScopeManagers, ScopeRegistry
from ._scope_resolver import (
    RequestDelay,
    ScopeResolver,
    request_netloc,
    request_slot_key,
    resolve_scopes_now,
)
from ._settings import ThrottlingSettings
from ._shared_state import SharedState
from ._types import (
    BackoffData,
    RequestScopes,
    ScopeID,
    ThrottlingScopeManagerProtocol,
    scope_cache,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from twisted.internet.defer import Deferred
    from typing_extensions import Self

    from ._explain import Explanation
    from ._scope_adapter import ScopeAdapter

__all__ = ["ThrottlingManager"]


class ThrottlingManager:
    """The default :setting:`THROTTLING_MANAGER`, reachable as ``crawler.throttler``.

    Subclass it to change how scopes are assigned (:meth:`get_scopes` or
    the synchronous :meth:`get_request_scopes`) or how backoff is derived
    (:meth:`get_response_backoff`, :meth:`get_exception_backoff`).

    The scheduler queue and the downloader talk to its :attr:`queue_gate`
    (the ``QueueGate`` interface of ``_queue_gate.py``), not to the manager.

    :param clock: the monotonic clock of scope state, the gate and the
        scheduler queue (:func:`time.monotonic` by default).
    :param wall_clock: the wall clock of :reqmeta:`throttling_delay`
        deadlines and HTTP dates (:func:`time.time` by default).
    """

    def __init__(
        self,
        crawler: Crawler,
        *,
        clock: Callable[[], float] = MONOTONIC_CLOCK,
        wall_clock: Callable[[], float] = WALL_CLOCK,
    ) -> None:
        self.crawler = crawler
        self.config: ThrottlingSettings = ThrottlingSettings.from_crawler(crawler)
        #: The state shared with other processes through Redis
        #: (:setting:`THROTTLING_STATE_URL`), or ``None``.
        self.shared: SharedState | None = SharedState.from_crawler(crawler, clock=clock)
        self._resolver = ScopeResolver(self.config)
        self._crawl_delays = CrawlDelays(self.config, crawler.stats)
        self._registry = ScopeRegistry(
            crawler,
            self.config,
            clock,
            self._crawl_delays.reapply,
            self.notify_slots_changed,
        )
        self._gate = ScopeGate(crawler, self.config, self._registry, clock, self.shared)
        self._backoff = BackoffTriggers(
            crawler, self.config, self._registry, self.shared
        )
        self._outcomes = DownloadOutcomes(self, self._backoff, self._gate)
        self._request_delay = RequestDelay(
            wall_clock, crawler.stats, debug=self.config.debug
        )
        self._clock = clock
        self.wall_clock = wall_clock
        self._sync_get_scopes = type(self).get_scopes is ThrottlingManager.get_scopes
        #: What the scheduler queue and the downloader call (check, reserve,
        #: release and its listeners): see ``_manager_gate.py``.
        self.queue_gate = ManagerGate(self, self._gate, self._registry, self.config)
        if self.config.robotstxt_obey:
            self._crawl_delays.listen(
                crawler, self.get_crawl_delay_scope, self.apply_robots_crawl_delay
            )

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    @property
    def clock(self) -> Callable[[], float]:
        """The monotonic clock that scope state, the gate and the scheduler
        queue read; tests replace it with a fake one."""
        return self._clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self._clock = self._registry.clock = self._gate.clock = clock

    @property
    def _scope_managers(self) -> ScopeManagers:
        """The live scope managers by scope id, least recently used first."""
        return ScopeManagers(self._registry.adapters)

    @property
    def _reserved(self) -> dict[Request, Reservation]:
        return self._gate.reserved

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
        return self._resolver.request_scopes(request)

    @scope_cache
    async def get_scopes(self, request: Request) -> RequestScopes:
        """Return the scopes of *request* (see :meth:`get_request_scopes`)."""
        return self.get_request_scopes(request)

    def resolve_scopes_now(
        self, request: Request
    ) -> RequestScopes | Deferred[RequestScopes]:
        """Resolve and persist the scopes of *request*, or a Deferred of them
        when :meth:`get_scopes` really awaits (the queue's ``push`` cannot)."""
        return resolve_scopes_now(
            request,
            self.get_request_scopes,
            self.get_scopes,
            synchronous=self._sync_get_scopes,
        )

    def get_slot_key(self, request: Request) -> str:
        """The scopes of *request* as one string (sorted ids joined by ``+``)."""
        return request_slot_key(request, self.get_request_scopes)

    def get_scope_manager(self, scope_id: ScopeID) -> ThrottlingScopeManagerProtocol:
        """Return the scope manager of *scope_id*, creating it if needed."""
        return self._registry.get(scope_id).manager

    # -- the gate, by request and by scope set ----------------------------------

    def add_release_listener(self, listener: Callable[[ScopeID], None]) -> None:
        """Call *listener* with the scope id whenever a slot of it is freed."""
        self.queue_gate.add_release_listener(listener)

    def refund_cached(self, request: Request) -> None:
        """*request* was answered from Scrapy's HTTP cache: give its send back
        (see ``ManagerGate.refund_cached``); :meth:`release` frees its slots."""
        self.queue_gate.refund_cached(request)

    def reached_downloader(self, request: Request) -> None:
        """*request* reached Scrapy's downloader: its scopes count their
        delay from now (see ``ManagerGate.reached_downloader``)."""
        self.queue_gate.reached_downloader(request)

    def check_scopes(
        self, scope_values: ScopeValues, now: float, head: Request | None = None
    ) -> tuple[float, ScopeID | None]:
        """``(wait, blocked)`` of *scope_values* (see ``ScopeGate.check_scopes``)."""
        return self._gate.check_scopes(scope_values, now)

    def reserve_scopes(
        self, request: Request, scope_values: ScopeValues, now: float
    ) -> None:
        """Record *request* as sent on each of its scopes, all or nothing."""
        self._gate.reserve_scopes(request, scope_values, now)

    def is_ready(self, request: Request) -> bool:
        """Whether *request* could be sent right now."""
        return self.queue_gate.is_ready(request)

    def reserve(self, request: Request) -> None:
        """Record *request* as sent; a later :meth:`acquire` returns at once."""
        self.queue_gate.reserve(request)

    def get_time_until_ready(self, request: Request) -> float | None:
        """Seconds until every time gate of *request* opens; ``None`` if open."""
        return self.queue_gate.time_until_ready(request)

    def get_scope_load(self, scope_id: ScopeID) -> float:
        """Active requests of the scope divided by its concurrency limit."""
        return self._registry.get(scope_id).get_load()

    def get_request_delay(self, request: Request, now: float | None = None) -> float:
        """Remaining ``throttling_delay`` of *request* (0.0 if none or elapsed);
        its deadline, on :attr:`wall_clock`, is set by the first call."""
        return self._request_delay.remaining(request)

    async def acquire(self, request: Request) -> None:
        """Wait until every scope of *request* allows it, then reserve it (at
        once if the scheduler queue reserved it; robots.txt is never held)."""
        await self._gate.acquire(
            request, self.get_request_delay, self.get_scopes, self.release
        )

    def release(self, request: Request) -> None:
        """Free the slots reserved for *request*. Idempotent."""
        self._gate.release(request)

    def notify_slots_changed(self, scope_id: ScopeID) -> None:
        """Tell waiters that *scope_id* may have room (e.g. a raised limit)."""
        self._gate.notify_slots_changed(scope_id)

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
        return response_delay(response.headers, self.wall_clock())

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
        return exhausted_quota_delay(response.headers)

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
        return self._outcomes.response_backoff(response)

    async def get_exception_backoff(
        self, request: Request, exception: BaseException
    ) -> BackoffData:
        """Return the backoff that a download exception calls for: the scopes
        of *request* whose backoff exceptions (:setting:`BACKOFF_EXCEPTIONS`
        or their ``"backoff"`` ``"exceptions"``) include its type, as bare
        scopes; ``None`` for :reqmeta:`throttling_dont_track` requests."""
        return self._outcomes.exception_backoff(request, exception)

    async def process_response(self, response: Response) -> None:
        """Update throttling state from a downloaded (non-cached) response.

        Called for every attempt, before RetryMiddleware decides to retry it.
        """
        await self._outcomes.process_response(response)

    async def process_exception(
        self, request: Request, exception: BaseException
    ) -> None:
        """Update throttling state from a download exception."""
        await self._outcomes.process_exception(request, exception)

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
        self._backoff.apply(backoff, self._clock() if now is None else now, cause)

    def delay_scope(self, scope_id: ScopeID, delay: float) -> None:
        """Hold back every request of *scope_id* for at least *delay* seconds.

        Counted as a backoff trigger, and trusted: unlike a server-given
        delay, it is not capped at :setting:`BACKOFF_MAX_DELAY`.

        :raises ValueError: if *delay* is negative or not a finite number.
        """
        self._backoff.delay_scope(scope_id, delay, self._clock())

    def get_scope_delay(self, scope_id: ScopeID) -> float:
        """The base (non-backoff) delay of *scope_id*."""
        return self._registry.get(scope_id).get_base_delay()

    def set_scope_delay(self, scope_id: ScopeID, delay: float) -> None:
        """Set the base delay of *scope_id*, up or down (not a backoff trigger)."""
        self._registry.get(scope_id).set_base_delay(float(delay), only_increase=False)

    def get_scope_state(self, scope_id: ScopeID) -> dict[str, Any]:
        """A snapshot of the state of *scope_id* (created if unknown)."""
        return self._registry.get(scope_id).get_state(self._clock())

    def iter_scope_states(self) -> Iterable[dict[str, Any]]:
        """Snapshots of every live scope."""
        return self._registry.states(self._clock())

    # -- robots.txt ---------------------------------------------------------------

    def get_crawl_delay_scope(self, request: Request) -> ScopeID:
        """Return the scope that the robots.txt Crawl-delay of *request*'s
        host applies to: the host's default scope, ``host[:port]``.

        Override it when your scopes group hosts differently (e.g. by
        registrable domain).
        """
        return request_netloc(request)

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
        if self._crawl_delays.apply_to_scope(self._registry, scope_id, delay):
            self._gate.regate_scope(scope_id)

    # -- misc -------------------------------------------------------------------

    def explain(self, request_or_scope: Request | ScopeID) -> Explanation:
        """Why *request_or_scope* waits: each of its scopes, the reason that
        holds it back (delay, concurrency, backoff, quota, Crawl-delay) and
        for how long, its current limit and state.

        Reading it changes no state. See :ref:`observability`.
        """
        from ._explain import explain

        return explain(self, request_or_scope)

    def scope_adapters(self) -> Mapping[ScopeID, ScopeAdapter]:
        """The live scopes by id, least recently used first, each behind its
        ``ScopeAdapter``: a read-only view that creates and refreshes none."""
        return self._registry.live
