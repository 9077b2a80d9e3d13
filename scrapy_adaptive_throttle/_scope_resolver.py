"""Request -> scopes: which scopes a request belongs to, and its own delay.

The default scopes of a request are the ``host[:port]`` of its URL, plus its
host's IP when :setting:`CONCURRENT_REQUESTS_PER_IP` is positive, plus a
``download_slot`` set by another component; :reqmeta:`throttling_scopes`
replaces them all. robots.txt downloads of RobotsTxtMiddleware are
recognised here too, since they are never throttled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from scrapy.resolver import dnscache
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.httpobj import urlparse_cached

from ._algorithms.response_policy import MAX_REQUEST_DELAY, request_delay_seconds
from ._containment import validate_scopes
from ._meta_keys import (
    DELAY_DEADLINE_META_KEY,
    DELAY_META_KEY,
    DELAYED_META_KEY,
    DONT_OBEY_ROBOTSTXT_META_KEY,
    DOWNLOAD_SLOT_META_KEY,
    SCOPES_META_KEY,
    SLOT_STAMP_META_KEY,
)
from ._types import RESOLVED_SCOPES_META_KEY, iter_scope_values, iter_scopes

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.statscollectors import StatsCollector
    from twisted.internet.defer import Deferred

    from ._scope_gate import Reservation, ScopeValues
    from ._settings import ThrottlingSettings
    from ._types import RequestScopes

__all__ = [
    "RequestDelay",
    "ScopeResolver",
    "is_robots_request",
    "request_netloc",
    "resolve_without_waiting",
    "sent_scope_values",
    "slot_key",
]

logger = logging.getLogger(__name__)


def is_robots_request(request: Request) -> bool:
    """Whether *request* is RobotsTxtMiddleware's own robots.txt download.

    Those are never throttled: the request that triggered the download may
    hold the scope's only slot while it waits for robots.txt (a deadlock),
    and there is one per host and crawl.
    """
    return bool(request.meta.get(DONT_OBEY_ROBOTSTXT_META_KEY)) and (
        urlparse_cached(request).path == "/robots.txt"
    )


def request_netloc(request: Request) -> str:
    """The ``host[:port]`` of *request*'s URL, lower case, without userinfo."""
    return urlparse_cached(request).netloc.rpartition("@")[2].lower()


class ScopeResolver:
    """The default scopes of requests, from the crawl's settings."""

    def __init__(self, config: ThrottlingSettings) -> None:
        self.config = config

    def request_scopes(self, request: Request) -> RequestScopes:
        """The scopes of *request* (see
        :meth:`~scrapy_adaptive_throttle.ThrottlingManager.get_request_scopes`)."""
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


def resolve_without_waiting(
    get_scopes: Callable[[Request], Coroutine[Any, Any, RequestScopes]],
    request: Request,
) -> RequestScopes | Deferred[RequestScopes]:
    """The result of ``get_scopes(request)`` at once when the coroutine does
    not really await (the scheduler queue's ``push`` is synchronous), else a
    Deferred of it (e.g. a DNS lookup)."""
    coroutine = get_scopes(request)
    try:
        coroutine.send(None)
    except StopIteration as stop:
        scopes: RequestScopes = stop.value
        return scopes
    # It suspended on a real await: resolve again, asynchronously.
    coroutine.close()
    deferred: Deferred[RequestScopes] = deferred_from_coro(get_scopes(request))
    return deferred


def resolve_scopes_now(
    request: Request,
    request_scopes: Callable[[Request], RequestScopes],
    get_scopes: Callable[[Request], Coroutine[Any, Any, RequestScopes]],
    *,
    synchronous: bool,
) -> RequestScopes | Deferred[RequestScopes]:
    """Resolve and persist the scopes of *request* without waiting.

    *synchronous*: *get_scopes* is the manager's default, which only returns
    *request_scopes* of the request, so that is called directly (validated,
    then kept in the request's meta). Otherwise *get_scopes* is run (it
    persists its result itself, see ``scope_cache``), at once when it does
    not really await (see :func:`resolve_without_waiting`).
    """
    if synchronous:
        scopes = validate_scopes(request_scopes(request), request)
        request.meta[RESOLVED_SCOPES_META_KEY] = scopes
        return scopes
    return resolve_without_waiting(get_scopes, request)


def sent_scope_values(
    request: Request,
    reservation: Reservation | None,
    request_scopes: Callable[[Request], RequestScopes],
) -> ScopeValues:
    """The ``(scope, quota amount)`` pairs *request* was (or will be) sent
    under: those of its *reservation*, else its resolved scopes, else
    *request_scopes* of it."""
    if reservation:
        amounts = dict(iter_scope_values(request.meta.get(RESOLVED_SCOPES_META_KEY)))
        return [(scope, amounts.get(scope)) for scope, _ in reservation]
    if RESOLVED_SCOPES_META_KEY in request.meta:
        return list(iter_scope_values(request.meta[RESOLVED_SCOPES_META_KEY]))
    return list(iter_scope_values(request_scopes(request)))


def slot_key(scopes: RequestScopes) -> str:
    """*scopes* as one string (sorted ids joined by ``+``)."""
    if isinstance(scopes, str):
        return scopes
    return "+".join(sorted(iter_scopes(scopes)))


def request_slot_key(
    request: Request, request_scopes: Callable[[Request], RequestScopes]
) -> str:
    """The :func:`slot_key` of *request*'s resolved scopes (else of
    *request_scopes* of it)."""
    scopes = request.meta.get(RESOLVED_SCOPES_META_KEY)
    if scopes is None:
        scopes = request_scopes(request)
    return slot_key(scopes)


class RequestDelay:
    """The :reqmeta:`throttling_delay` of requests: a hold of the request
    itself, on the wall clock so that it survives a paused and resumed
    crawl."""

    def __init__(
        self,
        wall_clock: Callable[[], float],
        stats: StatsCollector | None,
        *,
        debug: bool,
    ) -> None:
        self.wall_clock = wall_clock
        self._stats = stats
        self._debug = debug
        self._warned_invalid = False

    def remaining(self, request: Request) -> float:
        """Remaining ``throttling_delay`` of *request* (0.0 if none or
        elapsed); its deadline is set the first time this is called."""
        meta = request.meta
        delay = meta.get(DELAY_META_KEY)
        if not delay or meta.get(DELAYED_META_KEY):
            return 0.0
        wall = self.wall_clock()
        deadline = meta.get(DELAY_DEADLINE_META_KEY)
        if deadline is None:
            seconds = request_delay_seconds(delay)
            if seconds is None:
                self._warn_invalid(delay, request)
                meta[DELAYED_META_KEY] = True
                return 0.0
            if seconds == 0:
                meta[DELAYED_META_KEY] = True
                return 0.0
            deadline = wall + seconds
            meta[DELAY_DEADLINE_META_KEY] = deadline
            if self._debug:
                logger.debug(
                    "Holding %s for %.2fs (throttling_delay)", request, seconds
                )
        remaining = float(deadline) - wall
        if remaining <= 0:
            meta[DELAYED_META_KEY] = True
            return 0.0
        return remaining

    def _warn_invalid(self, delay: object, request: Request) -> None:
        if self._stats is not None:
            self._stats.inc_value("throttling/invalid_delay_count")
        if self._warned_invalid:
            return
        self._warned_invalid = True
        logger.warning(
            "Ignoring the throttling_delay %r of %s: it must be a number of "
            "seconds from 0 to %d; the request is sent without it. Further "
            "invalid values are only counted (throttling/invalid_delay_count).",
            delay,
            request,
            MAX_REQUEST_DELAY,
        )
