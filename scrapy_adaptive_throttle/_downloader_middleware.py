"""The downloader middleware: the gate outside the scheduler queue, and the
source of backoff and latency samples.

:class:`ThrottlingDownloaderMiddleware` is the gate for requests that do not
come through the throttling-aware scheduler queue (robots.txt aside,
``engine.download()``, or a crawl with another priority queue), and feeds
every raw response and download exception to the manager, before
RetryMiddleware and RedirectMiddleware see them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy import signals
from scrapy.exceptions import IgnoreRequest

from ._algorithms import parse_retry_after
from ._containment import (
    ThrottlingComponentError,
    component_of,
    report,
    take_failure,
)
from ._crawler_throttler import get_throttler
from ._downloader import ThrottlingDownloader
from ._meta_keys import (
    DELAY_DEADLINE_META_KEY,
    DELAY_META_KEY,
    DELAYED_META_KEY,
    DONT_REDIRECT_META_KEY,
    DOWNLOAD_LATENCY_META_KEY,
)
from ._queue_gate import queue_gate
from ._settings import ThrottlingSettings, report_invalid_setting

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

__all__ = ["ThrottlingDownloaderMiddleware"]

#: The statuses RedirectMiddleware follows with the Location header.
_REDIRECT_CODES = frozenset({301, 302, 303, 307, 308})


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
        #: The wall clock of Retry-After dates (the manager's, through its gate).
        self._wall_clock = queue_gate(crawler, self.throttler).wall_clock
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
        delay = parse_retry_after(
            response.headers.get(b"Retry-After"), self._wall_clock()
        )
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
