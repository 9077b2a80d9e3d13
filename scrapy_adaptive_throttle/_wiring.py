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
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.core.downloader import Downloader, Slot
from scrapy.exceptions import IgnoreRequest
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.misc import build_from_crawler
from twisted.internet.defer import Deferred

from ._containment import (
    ThrottlingComponentError,
    component_of,
    report,
    take_failure,
)
from ._settings import ThrottlingSettings

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

logger = logging.getLogger(__name__)

#: Signal sent with ``request`` after the downloader released the throttling
#: reservation of a request, when the manager has no release listeners.
request_released = object()

#: Meta key removed before every download so that a ``download_latency``
#: copied from another request (retries, redirects) is never read as ours.
_LATENCY_META_KEY = "download_latency"


def get_throttler(crawler: Crawler) -> Any:
    """Return ``crawler.throttler``, building it from :setting:`THROTTLING_MANAGER`
    the first time.

    A :setting:`THROTTLING_MANAGER` class that only resolves scopes (it has
    ``get_request_scopes`` or ``get_scopes`` but no ``acquire``, like the
    reference chapter's tldextract examples) is plugged into the default
    manager as its scope resolver.
    """
    throttler = getattr(crawler, "throttler", None)
    if throttler is not None:
        return throttler
    config = ThrottlingSettings.from_crawler(crawler)
    cls = config.manager_cls
    if hasattr(cls, "acquire"):
        throttler = build_from_crawler(cls, crawler)
    else:
        from ._manager import ThrottlingManager

        throttler = _with_resolver(ThrottlingManager, cls, crawler)
    crawler.throttler = throttler  # type: ignore[attr-defined]
    _log_configuration(config, throttler)
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


class ThrottlingDownloader(Downloader):
    """Scrapy's downloader without its own throttling, releasing every reservation.

    Scrapy's per-slot delay, jitter and concurrency are switched off (each
    slot gets an unbounded concurrency and no delay): the throttling manager
    enforces the scope's limits, on every reactor.
    """

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        self.throttler = get_throttler(crawler)
        # A manager written only to the protocol has no release listeners:
        # the scheduler queue learns of freed slots from this signal instead.
        self._signal_release = not hasattr(self.throttler, "add_release_listener")
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
        key: str = self.throttler.get_slot_key(request)
        # Remember what we stamp into download_slot, so that a retried or
        # redirected copy is not taken for a user-set slot.
        request.meta["_throttling_slot_stamp"] = key
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
            self.throttler.release(request)
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
        if self._signal_release:
            self.crawler.signals.send_catch_log(
                signal=request_released, request=request
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
            raise ValueError(
                f"Invalid DOWNLOADER value {crawler.settings.get('DOWNLOADER')!r}: "
                "scrapy-adaptive-throttle needs "
                "scrapy_adaptive_throttle.ThrottlingDownloader (or a subclass) so that "
                "throttling reservations are always released. Enable the add-on or "
                "see the manual setup in the docs."
            )
        crawler.signals.connect(self._spider_opened, signal=signals.spider_opened)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    async def _spider_opened(self) -> None:
        initial = getattr(self.throttler, "get_initial_backoff", None)
        if initial is None:
            return
        data = await initial()
        if data:
            self.throttler.apply_backoff(data, cause="initial")

    async def process_request(self, request: Request) -> None:
        failure = take_failure(request)
        if failure is not None:  # reported when the scheduler queue popped it
            raise failure
        request.meta.pop(_LATENCY_META_KEY, None)
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
            return response
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
