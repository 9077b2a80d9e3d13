"""``crawler.throttler``: built once, lazily, from :setting:`THROTTLING_MANAGER`.

The first component that needs the manager (the downloader, the downloader
middleware or the scheduler queue; settings are final by then) builds it
here, logs the effective configuration in one INFO line, and warns about
settings that silently undo the plugin.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.utils.misc import build_from_crawler

from ._protocol_manager import (
    is_protocol_manager,
    manager_with_resolver,
    missing_manager_methods,
)
from ._settings import ThrottlingSettings

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

__all__ = ["current_throttler", "get_throttler"]

logger = logging.getLogger(__name__)


def current_throttler(crawler: Crawler) -> Any:
    """``crawler.throttler`` as it is now: ``None`` until a component built
    it, and on a crawler without the add-on (the one place that looks)."""
    # Scrapy's Crawler, not user code: the attribute exists once set.
    return getattr(crawler, "throttler", None)


def get_throttler(crawler: Crawler) -> Any:
    """Return ``crawler.throttler``, building it from :setting:`THROTTLING_MANAGER`
    the first time.

    A :setting:`THROTTLING_MANAGER` class that only resolves scopes (it has
    ``get_request_scopes`` or ``get_scopes`` but no ``acquire``, like the
    reference chapter's tldextract examples) is plugged into the default
    manager as its scope resolver. A class with ``acquire`` must also have
    ``get_scopes``, ``release``, ``process_response`` and
    ``process_exception`` (the rest of the protocol is optional, see
    ``_protocol_manager.py``); a :exc:`ValueError` naming the setting and the
    missing methods says otherwise, at start-up.
    """
    throttler = current_throttler(crawler)
    if throttler is not None:
        return throttler
    config = ThrottlingSettings.from_crawler(crawler)
    cls = config.manager_cls
    if is_protocol_manager(cls):
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

        throttler = manager_with_resolver(ThrottlingManager, cls, crawler)
    crawler.throttler = throttler  # type: ignore[attr-defined]
    _log_configuration(config, throttler)
    _warn_about_settings_that_undo_it(crawler, config)
    return throttler


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
        problem, remedy = queue_problem
        logger.warning(
            "%s, so the throttling-aware scheduler queue is not used: requests "
            "whose scopes are at their limit (or backing off) are handed to the "
            "downloader anyway and wait at its gate, where each takes one of the "
            "CONCURRENT_REQUESTS slots, so a slow or backed-off host holds back "
            "the requests of every other host (head-of-line blocking). "
            "Throttling limits still hold. %s.",
            problem,
            remedy,
        )


_THROTTLING_QUEUE = "scrapy_adaptive_throttle.ThrottlingAwarePriorityQueue"
_SCRAPY_REDIS_SCHEDULER = "scrapy_redis.scheduler.Scheduler"
_REDIS_SCHEDULER = "scrapy_adaptive_throttle.redis_scheduler.ThrottlingRedisScheduler"


def _throttling_queue_problem(settings: BaseSettings) -> tuple[str, str] | None:
    """Why the throttling-aware priority queue is not in use and what to do
    about it, or ``None``."""
    from scrapy.core.scheduler import Scheduler
    from scrapy.utils.misc import load_object

    from ._pqueue import ThrottlingAwarePriorityQueue

    scheduler = settings.get("SCHEDULER")
    scheduler_cls = load_object(scheduler) if isinstance(scheduler, str) else scheduler
    # Not issubclass(): BaseScheduler's metaclass takes any class with the
    # scheduler methods for a subclass of every scheduler, Scheduler included.
    mro = scheduler_cls.__mro__ if isinstance(scheduler_cls, type) else ()
    if _REDIS_SCHEDULER in {f"{cls.__module__}.{cls.__qualname__}" for cls in mro}:
        return None  # its buffer is a ThrottlingAwarePriorityQueue
    if Scheduler not in mro:
        problem = (
            f"SCHEDULER is {scheduler!r}, which does not use SCHEDULER_PRIORITY_QUEUE"
        )
        if _SCRAPY_REDIS_SCHEDULER in {
            f"{cls.__module__}.{cls.__qualname__}" for cls in mro
        }:
            return problem, f"Derive it from {_REDIS_SCHEDULER} instead"
        return problem, f"Remove that setting to use {_THROTTLING_QUEUE}"
    queue = settings.get("SCHEDULER_PRIORITY_QUEUE")
    queue_cls = load_object(queue) if isinstance(queue, str) else queue
    if not (
        isinstance(queue_cls, type)
        and issubclass(queue_cls, ThrottlingAwarePriorityQueue)
    ):
        return (
            f"SCHEDULER_PRIORITY_QUEUE is {queue!r}",
            f"Remove that setting to use {_THROTTLING_QUEUE}",
        )
    return None
