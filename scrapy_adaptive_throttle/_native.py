"""Running on a Scrapy that ships its own throttling (``scrapy.throttling``).

Scrapy's pull request #6931 (and any release that merges it) brings the
throttling system into Scrapy itself: the ``THROTTLING_*``, ``BACKOFF_*`` and
``RAMPUP_*`` settings with their defaults, ``crawler.throttler`` built from
:setting:`THROTTLING_MANAGER`, a gate in the engine around every download
(``acquire`` / ``release``, ``process_response`` / ``process_exception``), a
downloader without per-slot throttling and an opt-in throttling-aware
scheduler. On such a Scrapy the add-on installs none of its own versions of
those (they would throttle twice, or fight over ``crawler.throttler``); it
only plugs what Scrapy lacks into Scrapy's manager: the
:class:`~scrapy_adaptive_throttle.LatencyScopeManager` as the default scope
manager, and :class:`LatencySampleMiddleware`, which hands it the latency
of each response (Scrapy's manager only tells a scope manager about sends,
completions and backoff, never about latency).

Scrapy is recognised by what it has, never by its version number: a
``scrapy.throttling`` module with both documented protocols and a default
manager.
"""

from __future__ import annotations

import importlib
import logging
import weakref
from typing import TYPE_CHECKING, Any

from ._clock import MONOTONIC_CLOCK
from ._meta_keys import (
    DONT_TRACK_META_KEY,
    DOWNLOAD_LATENCY_META_KEY,
    RESOLVED_SCOPES_META_KEY,
)
from ._types import RequestScopes, ScopeID, iter_scopes

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import ModuleType

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

    from ._latency_scope_manager import LatencyScopeManager

logger = logging.getLogger(__name__)

NATIVE_MODULE = "scrapy.throttling"
#: What a Scrapy with its own throttling has in ``scrapy.throttling``.
NATIVE_ATTRIBUTES = (
    "ThrottlingManagerProtocol",
    "ThrottlingScopeManagerProtocol",
    "ThrottlingManager",
)

#: The latency-aware scope managers of each crawl, by scope id, when
#: :class:`LatencySampleMiddleware` runs: Scrapy's manager keeps its scope
#: managers to itself, so they register here when they are built, and
#: leave when Scrapy's manager evicts them (weak references).
_LATENCY_SCOPES: weakref.WeakKeyDictionary[
    Crawler, weakref.WeakValueDictionary[ScopeID, LatencyScopeManager]
] = weakref.WeakKeyDictionary()


def native_throttling() -> ModuleType | None:
    """Scrapy's own ``scrapy.throttling`` module, or ``None`` if this Scrapy
    has none (every released Scrapy up to 2.19)."""
    try:
        module = importlib.import_module(NATIVE_MODULE)
    except ImportError:
        return None
    # Scrapy's module, not user code: recognised by what it has.
    if all(hasattr(module, name) for name in NATIVE_ATTRIBUTES):
        return module
    return None


def scrapy_owned_settings(names: Any) -> list[str]:
    """Those of *names* that Scrapy's own default settings define."""
    from scrapy.settings import default_settings

    # Scrapy's settings module: which of the names it defines.
    return sorted(name for name in names if hasattr(default_settings, name))


def register_latency_scope(crawler: Crawler, manager: LatencyScopeManager) -> None:
    """Make *manager* reachable by :class:`LatencySampleMiddleware` (a no-op
    when the middleware does not run, i.e. with the plugin's own manager)."""
    scopes = _LATENCY_SCOPES.get(crawler)
    if scopes is not None:
        scopes[manager.id] = manager


class LatencySampleMiddleware:
    """Feed each response's latency to the scope's
    :class:`~scrapy_adaptive_throttle.LatencyScopeManager` when Scrapy's own
    throttling manager runs the scopes.

    The add-on installs it (at the same priority as its own throttling
    middleware, after HttpCacheMiddleware: cache hits carry no latency) only
    on a Scrapy that ships ``scrapy.throttling``. It reads Scrapy's
    ``download_latency`` (removed before every download, so a value copied
    into a retry or a redirect is never taken for a new one) and the scopes
    the request was sent under; backoff codes are left to the scope
    manager's ``record_backoff``, which Scrapy's manager calls itself.
    With the plugin's own :class:`~scrapy_adaptive_throttle.ThrottlingManager`
    as :setting:`THROTTLING_MANAGER`, that manager feeds the samples and
    this middleware does nothing.
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self._scopes = _LATENCY_SCOPES.setdefault(
            crawler, weakref.WeakValueDictionary()
        )
        self._enabled: bool | None = None
        #: The clock of the samples' times (the scope managers' default one).
        self.clock: Callable[[], float] = MONOTONIC_CLOCK
        #: The ``get_scopes`` of Scrapy's manager, looked up with it.
        self._get_scopes: Callable[[Request], Awaitable[RequestScopes]] | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def _feeds_samples(self) -> bool:
        if self._enabled is None:
            from ._crawler_throttler import current_throttler
            from ._manager import ThrottlingManager

            # Scrapy builds both this middleware and its own manager, so
            # nothing can hand the manager to us: look it up, once, at the
            # first response (the manager exists by then).
            throttler = current_throttler(self.crawler)
            if throttler is None:
                return True  # not built yet: look again at the next response
            self._enabled = not isinstance(throttler, ThrottlingManager)
            self._get_scopes = throttler.get_scopes
        return self._enabled

    def process_request(self, request: Request) -> None:
        request.meta.pop(DOWNLOAD_LATENCY_META_KEY, None)

    async def process_response(self, request: Request, response: Response) -> Response:
        if not self._scopes or not self._feeds_samples():
            return response
        latency = request.meta.get(DOWNLOAD_LATENCY_META_KEY)
        if (
            latency is None
            or "cached" in response.flags
            or request.meta.get(DONT_TRACK_META_KEY)
        ):
            return response
        scopes = request.meta.get(RESOLVED_SCOPES_META_KEY)
        if scopes is None:
            if self._get_scopes is None:
                return response
            try:
                scopes = await self._get_scopes(request)
            except Exception:
                # Scrapy's manager reports its own errors when it gates the
                # request; a sample is not worth a second report.
                return response
        now = self.clock()
        for scope_id in iter_scopes(scopes):
            manager = self._scopes.get(scope_id)
            if manager is None:
                continue
            try:
                manager.record_response(latency, response.status, now)
            except Exception:
                logger.exception(
                    "LatencyScopeManager of scope %r failed to take the latency "
                    "of %s; the response goes on to the spider",
                    scope_id,
                    request,
                )
        return response
