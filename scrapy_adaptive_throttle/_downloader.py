"""Scrapy's downloader without its own throttling.

:class:`ThrottlingDownloader` neutralises Scrapy's per-slot delay and
concurrency (so nothing is throttled twice) and releases every reservation
whatever happens to the request.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from scrapy.core.downloader import Downloader, Slot
from scrapy.utils.defer import deferred_from_coro
from twisted.internet.defer import Deferred

from ._containment import report
from ._crawler_throttler import get_throttler
from ._meta_keys import SLOT_STAMP_META_KEY
from ._queue_gate import queue_gate

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.settings import BaseSettings

__all__ = ["ThrottlingDownloader"]

logger = logging.getLogger(__name__)

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
        # The built-in manager counts each scope's delay from the request's
        # arrival here; a protocol-only manager has no such hook.
        from ._manager import ThrottlingManager

        self._restamp: Callable[[Request], None] | None = (
            self.throttler.reached_downloader
            if isinstance(self.throttler, ThrottlingManager)
            else None
        )
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

    async def _enqueue_request(self, request: Request) -> Response:
        # Past the downloader middlewares: the request is sent now, and its
        # scopes count their delay from now, as Scrapy's DOWNLOAD_DELAY does
        # from the moment a request leaves its slot. The queue reserved it
        # when it handed it out, and the event loop or a slow middleware may
        # have held it since; counting from then would bring the next send
        # closer to this one than the delay (seen at 0.163 s for 0.2 s).
        restamp = self._restamp
        if restamp is not None:
            try:
                restamp(request)
            except Exception as exc:
                report(
                    request,
                    f"{_name(self.throttler)}.reached_downloader()",
                    exc,
                    "it is sent; its scopes' delay counts from when it was handed out",
                    self.crawler.stats,
                )
        return await super()._enqueue_request(request)

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


def _name(component: object) -> str:
    cls = type(component)
    return f"{cls.__module__}.{cls.__qualname__}"
