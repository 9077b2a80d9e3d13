"""The thin layer between Scrapy and the throttling manager.

- :func:`get_throttler` builds ``crawler.throttler`` once, lazily, when the
  first component needs it (settings are final by then).
- :class:`ThrottlingDownloader` neutralises Scrapy's own per-slot delay and
  concurrency (so nothing is throttled twice) and releases every reservation
  whatever happens to the request.
- :class:`ThrottlingDownloaderMiddleware` is the gate for requests that do
  not come through the throttling-aware scheduler queue (robots.txt aside,
  ``engine.download()``, or a crawl with another priority queue), and feeds
  every raw response and download exception to the manager, before
  RetryMiddleware and RedirectMiddleware see them.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.core.downloader import Downloader, Slot
from scrapy.exceptions import IgnoreRequest
from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.misc import build_from_crawler
from twisted.internet.defer import Deferred

from ._algorithms import parse_retry_after
from ._containment import (
    ThrottlingComponentError,
    component_of,
    report,
    take_failure,
)
from ._meta_keys import (
    DELAY_DEADLINE_META_KEY,
    DELAY_META_KEY,
    DELAYED_META_KEY,
    DONT_REDIRECT_META_KEY,
    DOWNLOAD_LATENCY_META_KEY,
    SLOT_STAMP_META_KEY,
)
from ._queue_gate import (
    missing_manager_methods,
    queue_gate,
)
from ._settings import ThrottlingSettings, report_invalid_setting

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.settings import BaseSettings
    from typing_extensions import Self

logger = logging.getLogger(__name__)

#: The statuses RedirectMiddleware follows with the Location header.
_REDIRECT_CODES = frozenset({301, 302, 303, 307, 308})


def get_throttler(crawler: Crawler) -> Any:
    """Return ``crawler.throttler``, building it from :setting:`THROTTLING_MANAGER`
    the first time.

    A :setting:`THROTTLING_MANAGER` class that only resolves scopes (it has
    ``get_request_scopes`` or ``get_scopes`` but no ``acquire``, like the
    reference chapter's tldextract examples) is plugged into the default
    manager as its scope resolver. A class with ``acquire`` must also have
    ``get_scopes``, ``release``, ``process_response`` and
    ``process_exception`` (the rest of the protocol is optional, see
    ``_queue_gate.py``); a :exc:`ValueError` naming the setting and the
    missing methods says otherwise, at start-up.
    """
    throttler = getattr(crawler, "throttler", None)
    if throttler is not None:
        return throttler
    config = ThrottlingSettings.from_crawler(crawler)
    cls = config.manager_cls
    if hasattr(cls, "acquire"):
        missing = missing_manager_methods(cls)
        if missing:
            raise ValueError(
                f"Invalid THROTTLING_MANAGER value "
                f"{crawler.settings.get('THROTTLING_MANAGER')!r}: it does not "
                "implement ThrottlingManagerProtocol (missing: "
                f"{', '.join(missing)})"
            )
        throttler = build_from_crawler(cls, crawler)
    else:
        from ._manager import ThrottlingManager

        throttler = _with_resolver(ThrottlingManager, cls, crawler)
    crawler.throttler = throttler  # type: ignore[attr-defined]
    _log_configuration(config, throttler)
    _warn_about_settings_that_undo_it(crawler, config)
    return throttler


def _with_resolver(base: type, resolver_cls: type, crawler: Crawler) -> Any:
    resolver = (
        build_from_crawler(resolver_cls, crawler)
        if hasattr(resolver_cls, "from_crawler")
        else resolver_cls()
    )
    namespace: dict[str, Any] = {}
    if hasattr(resolver, "get_request_scopes"):
        namespace["get_request_scopes"] = lambda self, request: (
            resolver.get_request_scopes(request)
        )
    elif hasattr(resolver, "get_scopes"):

        async def get_scopes(self: Any, request: Request) -> Any:
            return await resolver.get_scopes(request)

        namespace["get_scopes"] = get_scopes
    else:
        raise ValueError(
            f"Invalid THROTTLING_MANAGER value {resolver_cls!r}: it implements "
            "neither the throttling manager protocol (acquire, release, ...) nor "
            "get_request_scopes() / get_scopes()"
        )
    combined = type(f"{resolver_cls.__name__}Manager", (base,), namespace)
    manager = combined(crawler)
    manager.scope_resolver = resolver
    return manager


def _log_configuration(config: ThrottlingSettings, throttler: Any) -> None:
    logger.info(
        "Throttling with %s (scope manager %s): %d configured scope(s), "
        "default domain concurrency %d, CONCURRENT_REQUESTS %d, delay %.3gs",
        type(throttler).__name__,
        config.scope_manager_cls.__name__,
        len(config.scopes),
        config.domain_concurrency,
        config.total_concurrency,
        config.defaults["domain"].delay,
    )


#: Jitter settings that Scrapy's ``Downloader.__init__`` reads as a number
#: (``getfloat``) or a bool (``getbool``), with the value it is shown while it
#: runs when the setting holds a ``[low, high]`` pair.
_SCALAR_JITTER_STANDINS = {
    "DOWNLOAD_DELAY_JITTER": 0.5,
    "RANDOMIZE_DOWNLOAD_DELAY": True,
}


@contextmanager
def _scalar_jitter_settings(settings: BaseSettings) -> Iterator[None]:
    """Show Scrapy's ``Downloader.__init__`` a number where a jitter
    setting holds a ``[low, high]`` pair, then put the pair back.

    The reference chapter documents ``RANDOMIZE_DOWNLOAD_DELAY = [-0.1, 0.3]``
    (and this plugin ``DOWNLOAD_DELAY_JITTER = [0, 0.5]`` too), but Scrapy's
    downloader reads them with ``getfloat`` / ``getbool`` and raises
    ``TypeError`` on a list. Its jitter is unused here (the scope managers
    apply the pair, see :mod:`._settings`), so it may see any number; the
    user's value is back, at its priority, before anything else reads it.
    """
    pairs = []
    for name in _SCALAR_JITTER_STANDINS:
        attribute = settings.attributes.get(name)
        if attribute is not None and isinstance(attribute.value, (list, tuple)):
            pairs.append((name, attribute.value, attribute.priority))
    if not pairs:
        yield
        return
    frozen = settings.frozen
    settings.frozen = False
    try:
        for name, _, priority in pairs:
            settings.set(name, _SCALAR_JITTER_STANDINS[name], priority)
        settings.frozen = frozen
        yield
    finally:
        settings.frozen = False
        for name, value, priority in pairs:
            settings.set(name, value, priority)
        settings.frozen = frozen


def _warn_about_settings_that_undo_it(
    crawler: Crawler, config: ThrottlingSettings
) -> None:
    """Warn, once per crawl, about settings that silently undo what the
    plugin is installed for: a project-wide delay that paces every host
    whatever its adaptive limit, and a scheduler without the
    throttling-aware queue."""
    from ._latency_scope_manager import LatencyScopeManager

    settings = crawler.settings
    delay = config.defaults["domain"].delay
    if (
        delay > 0
        and issubclass(config.scope_manager_cls, LatencyScopeManager)
        and (settings.getpriority("DOWNLOAD_DELAY") or 0)
        > SETTINGS_PRIORITIES["default"]
    ):
        logger.warning(
            "DOWNLOAD_DELAY = %s spaces the requests of every host by %ss (at "
            "most %.3g pages/s per host), whatever the adaptive concurrency "
            "limit allows: the delay sets the pace, not the host's latency. "
            "Remove DOWNLOAD_DELAY (Scrapy's startproject template sets "
            "DOWNLOAD_DELAY = 1 and CONCURRENT_REQUESTS_PER_DOMAIN = 1), give a "
            "delay only to the hosts that need one in THROTTLING_SCOPES, and set "
            "CONCURRENT_REQUESTS_PER_DOMAIN to the most any host may get.",
            settings.get("DOWNLOAD_DELAY"),
            delay,
            1 / delay,
        )
    queue_problem = _throttling_queue_problem(settings)
    if queue_problem:
        logger.warning(
            "%s, so the throttling-aware scheduler queue is not used: requests "
            "whose scopes are at their limit (or backing off) are handed to the "
            "downloader anyway and wait at its gate, where each takes one of the "
            "CONCURRENT_REQUESTS slots, so a slow or backed-off host holds back "
            "the requests of every other host (head-of-line blocking). "
            "Throttling limits still hold. Remove that setting to use %s.",
            queue_problem,
            _THROTTLING_QUEUE,
        )


_THROTTLING_QUEUE = "scrapy_adaptive_throttle.ThrottlingAwarePriorityQueue"


def _throttling_queue_problem(settings: BaseSettings) -> str | None:
    """Why the throttling-aware priority queue is not in use, or ``None``."""
    from scrapy.core.scheduler import Scheduler
    from scrapy.utils.misc import load_object

    from ._pqueue import ThrottlingAwarePriorityQueue

    scheduler = settings.get("SCHEDULER")
    scheduler_cls = load_object(scheduler) if isinstance(scheduler, str) else scheduler
    # Not issubclass(): BaseScheduler's metaclass takes any class with the
    # scheduler methods for a subclass of every scheduler, Scheduler included.
    if not (isinstance(scheduler_cls, type) and Scheduler in scheduler_cls.__mro__):
        # e.g. scrapy-redis: its scheduler has queues of its own.
        return (
            f"SCHEDULER is {scheduler!r}, which does not use SCHEDULER_PRIORITY_QUEUE"
        )
    queue = settings.get("SCHEDULER_PRIORITY_QUEUE")
    queue_cls = load_object(queue) if isinstance(queue, str) else queue
    if not (
        isinstance(queue_cls, type)
        and issubclass(queue_cls, ThrottlingAwarePriorityQueue)
    ):
        return f"SCHEDULER_PRIORITY_QUEUE is {queue!r}"
    return None


class ThrottlingDownloader(Downloader):
    """Scrapy's downloader without its own throttling, releasing every reservation.

    Scrapy's per-slot delay, jitter and concurrency are switched off (each
    slot gets an unbounded concurrency and no delay): the throttling manager
    enforces the scope's limits, on every reactor.
    """

    def __init__(self, crawler: Crawler) -> None:
        with _scalar_jitter_settings(crawler.settings):
            super().__init__(crawler)
        self.throttler = get_throttler(crawler)
        # The manager itself, or an adapter that also tells the scheduler
        # queue when a protocol-only manager frees a slot.
        gate = queue_gate(crawler, self.throttler, releasing=True)
        self._release = gate.release
        self._slot_key = gate.get_slot_key
        self.domain_concurrency = sys.maxsize
        self.ip_concurrency = 0
        self._delay = 0.0
        self._jitter = 0.0
        if self.per_slot_settings:
            logger.warning(
                "DOWNLOAD_SLOTS is ignored with scrapy-adaptive-throttle; "
                "configure those hosts in THROTTLING_SCOPES instead: %s",
                sorted(self.per_slot_settings),
            )
            self.per_slot_settings = {}

    def _get_slot(
        self, request: Request, spider: Spider | None = None
    ) -> tuple[str, Slot]:
        key = self.get_slot_key(request)
        slot = self.slots.get(key)
        if slot is None:
            slot = self.slots[key] = Slot(sys.maxsize, 0.0, 0.0)
            self._start_slot_gc()
        return key, slot

    def get_slot_key(self, request: Request) -> str:
        meta = request.meta
        slot = meta.get(self.DOWNLOAD_SLOT)
        if slot is not None and slot != meta.get(SLOT_STAMP_META_KEY):
            # Another component's slot (scrapy-zyte-api, a proxy rotation
            # plugin) stays what it is, as with Scrapy's own downloader:
            # those plugins read it back and would otherwise prefix it again
            # on every retry. The throttler adds it as a scope.
            return str(slot)
        key = self._slot_key(request)
        # Remember what we stamp into download_slot, so that a retried or
        # redirected copy is not taken for a slot set by another component.
        meta[SLOT_STAMP_META_KEY] = key
        return key

    def fetch(self, request: Request, spider: Spider | None = None) -> Deferred[Any]:
        # The request must be active before fetch() returns, as in Scrapy's
        # own fetch(): on the asyncio reactor the coroutine below only starts
        # on a later loop turn, and until then the engine would see an idle
        # downloader, take more than CONCURRENT_REQUESTS requests at once and
        # even close the spider while this download is pending.
        self.active.add(request)
        deferred: Deferred[Any] = deferred_from_coro(
            self.middleware.download_async(self._enqueue_request, request)
        )
        # addBoth, not a finally in a coroutine: it runs even if the download
        # never starts (cancelled before its first step).
        deferred.addBoth(self._done, request)
        return deferred

    def _done(self, result: Any, request: Request) -> Any:
        self.active.discard(request)
        try:
            self._release(request)
        except Exception as exc:
            # The download happened: its response or error must reach the
            # spider, not an error of the manager's bookkeeping.
            report(
                request,
                f"{_name(self.throttler)}.release()",
                exc,
                "its response or error goes on; its slots may stay counted",
                self.crawler.stats,
            )
        return result


class ThrottlingDownloaderMiddleware:
    """The throttling gate and the source of backoff and latency samples.

    Placed after RobotsTxtMiddleware and HttpCacheMiddleware in the request
    chain (a cache hit or a request disallowed by robots.txt never waits at
    this gate, and cached responses never trigger backoff), and before
    RetryMiddleware and RedirectMiddleware in the response chain (a retried
    429 still slows its scope down).
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.throttler = get_throttler(crawler)
        downloader = crawler.settings.get("DOWNLOADER")
        if isinstance(downloader, str):
            from scrapy.utils.misc import load_object

            downloader = load_object(downloader)
        if not (
            isinstance(downloader, type)
            and issubclass(downloader, ThrottlingDownloader)
        ):
            error = ValueError(
                f"Invalid DOWNLOADER value {crawler.settings.get('DOWNLOADER')!r}: "
                "scrapy-adaptive-throttle needs "
                "scrapy_adaptive_throttle.ThrottlingDownloader (or a subclass) so that "
                "throttling reservations are always released. Enable the add-on "
                "(and remove DOWNLOADER from your settings) or see the manual "
                "setup in the docs."
            )
            report_invalid_setting(error)
            raise error
        crawler.signals.connect(self._spider_opened, signal=signals.spider_opened)
        self._redirect_max_delay = (
            ThrottlingSettings.from_crawler(crawler).redirect_max_delay
            if crawler.settings.getbool("REDIRECT_ENABLED")
            else 0.0
        )

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    async def _spider_opened(self) -> None:
        from ._manager import ThrottlingManager

        # The protocol leaves applying get_initial_backoff() to the manager
        # (the pull request never calls it); the plugin's manager does it here.
        if not isinstance(self.throttler, ThrottlingManager):
            return
        data = await self.throttler.get_initial_backoff()
        if data:
            self.throttler.apply_backoff(data, cause="initial")

    async def process_request(self, request: Request) -> None:
        failure = take_failure(request)
        if failure is not None:  # reported when the scheduler queue popped it
            raise failure
        # A download_latency copied from another request (a retry, a redirect)
        # must never be read as this download's.
        request.meta.pop(DOWNLOAD_LATENCY_META_KEY, None)
        try:
            await self.throttler.acquire(request)
        except IgnoreRequest:
            raise
        except Exception as exc:
            component = component_of(exc, f"{_name(self.throttler)}.acquire()")
            report(request, component, exc, "it is not sent", self.crawler.stats)
            raise ThrottlingComponentError(component, request, exc) from exc

    async def process_response(self, request: Request, response: Response) -> Response:
        if "cached" in response.flags:
            self._refund_cached(request)
            return response
        if 300 <= response.status < 400:
            self._hold_redirect(request, response)
        if response.request is None:
            response.request = request
        try:
            await self.throttler.process_response(response)
        except Exception as exc:
            component = component_of(exc, f"{_name(self.throttler)}.process_response()")
            report(
                request,
                component,
                exc,
                "the response goes on to the spider without a backoff decision",
                self.crawler.stats,
            )
        return response

    def _refund_cached(self, request: Request) -> None:
        """A cache hit reserved its scopes when the queue handed it out (the
        cache answers after that, in the middleware chain): give the send
        back, so that cache hits do not wait for each other's delay."""
        from ._manager import ThrottlingManager

        throttler = self.throttler
        if not isinstance(throttler, ThrottlingManager):
            return
        try:
            throttler.refund_cached(request)
        except Exception as exc:
            report(
                request,
                f"{_name(throttler)}.refund_cached()",
                exc,
                "its send still spaces the next one",
                self.crawler.stats,
            )

    def _hold_redirect(self, request: Request, response: Response) -> None:
        """Hold the request RedirectMiddleware builds from a redirect with a
        ``Retry-After`` header for that long, at most
        :setting:`REDIRECT_MAX_DELAY` seconds (RFC 9110: on a 3xx it is the
        minimum time to wait before issuing the redirected request).

        The hold is a :reqmeta:`throttling_delay` in the meta that the
        redirected request copies; the bookkeeping of an earlier one is reset
        so that it applies again.
        """
        if (
            self._redirect_max_delay <= 0
            or response.status not in _REDIRECT_CODES
            or b"Location" not in response.headers
            or request.meta.get(DONT_REDIRECT_META_KEY)
        ):
            return
        delay = parse_retry_after(response.headers.get(b"Retry-After"), time.time())
        if not delay:
            return
        meta = request.meta
        meta[DELAY_META_KEY] = min(delay, self._redirect_max_delay)
        meta.pop(DELAYED_META_KEY, None)
        meta.pop(DELAY_DEADLINE_META_KEY, None)

    async def process_exception(self, request: Request, exception: Exception) -> None:
        if isinstance(exception, IgnoreRequest):
            return
        try:
            await self.throttler.process_exception(request, exception)
        except Exception as exc:
            component = component_of(
                exc, f"{_name(self.throttler)}.process_exception()"
            )
            report(
                request,
                component,
                exc,
                "the download error goes on without a backoff decision",
                self.crawler.stats,
            )


def _name(component: object) -> str:
    cls = type(component)
    return f"{cls.__module__}.{cls.__qualname__}"
