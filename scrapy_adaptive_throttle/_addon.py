"""The add-on that configures everything.

``ADDONS = {"scrapy_adaptive_throttle.Addon": 500}`` in a project's settings.
"""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING, Any

from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.utils.misc import load_object

from ._native import native_throttling, scrapy_owned_settings
from ._settings import DEFAULTS

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings


_DOWNLOADER = "scrapy_adaptive_throttle.ThrottlingDownloader"
_PRIORITY_QUEUE = "scrapy_adaptive_throttle.ThrottlingAwarePriorityQueue"
_MIDDLEWARE = "scrapy_adaptive_throttle.ThrottlingDownloaderMiddleware"
_LATENCY_MIDDLEWARE = "scrapy_adaptive_throttle.LatencySampleMiddleware"
_LATENCY_SCOPE_MANAGER = "scrapy_adaptive_throttle.LatencyScopeManager"
_DIAGNOSTICS = "scrapy_adaptive_throttle._diagnostics.ThrottlingDiagnostics"
#: After HttpCacheMiddleware (900): cache hits never wait nor back off, and
#: the raw response is seen before RetryMiddleware (550) retries it.
MIDDLEWARE_PRIORITY = 950
_SCRAPY_REDIS_SCHEDULER = "scrapy_redis.scheduler.Scheduler"
_REDIS_SCHEDULER = "scrapy_adaptive_throttle.redis_scheduler.ThrottlingRedisScheduler"
_AUTOTHROTTLE = "scrapy.extensions.throttle.AutoThrottle"
_SCRAPY_DOWNLOADER = "scrapy.core.downloader.Downloader"
_SCRAPY_PRIORITY_QUEUES = {
    "scrapy.pqueues.DownloaderAwarePriorityQueue",
    "scrapy.pqueues.ScrapyPriorityQueue",
}


class Addon:
    """Enable per-scope throttling in a Scrapy project.

    It registers the defaults of every setting of the plugin, installs
    :class:`~scrapy_adaptive_throttle.ThrottlingDownloader`, the
    throttling-aware priority queue and the throttling downloader middleware,
    and switches off AutoThrottle (which would throttle a second time). A
    :setting:`SCHEDULER` of scrapy-redis's (``scrapy_redis.scheduler.Scheduler``)
    becomes :class:`~scrapy_adaptive_throttle.redis_scheduler.ThrottlingRedisScheduler`.

    On a Scrapy that ships its own throttling (``scrapy.throttling``, see
    :ref:`native-throttling`) it installs only what that Scrapy lacks: the
    :class:`~scrapy_adaptive_throttle.LatencyScopeManager` as the default
    scope manager of Scrapy's own manager,
    :class:`~scrapy_adaptive_throttle.LatencySampleMiddleware` to feed it
    latency samples, the defaults of the settings Scrapy does not define,
    and the diagnostics; and it warns once which of its settings Scrapy now
    owns.
    """

    def update_settings(self, settings: BaseSettings) -> None:
        native = native_throttling() is not None
        owned = scrapy_owned_settings(DEFAULTS) if native else []
        for name, value in DEFAULTS.items():
            if name not in owned:
                settings.setdefault(name, value, priority="default")
        # Adapting to each host is what the plugin is installed for; priority
        # "addon" only replaces the default, never a user's choice.
        settings.set(
            "THROTTLING_SCOPE_MANAGER", _LATENCY_SCOPE_MANAGER, priority="addon"
        )
        settings.setdefault_in_component_priority_dict(
            "EXTENSIONS", load_object(_DIAGNOSTICS), 0
        )
        self._disable_autothrottle(settings)
        if native:
            self._plug_into_native(settings, owned)
            return
        self._set_component(settings, "DOWNLOADER", _DOWNLOADER, {_SCRAPY_DOWNLOADER})
        self._set_component(
            settings,
            "SCHEDULER_PRIORITY_QUEUE",
            _PRIORITY_QUEUE,
            _SCRAPY_PRIORITY_QUEUES,
        )
        settings.set_in_component_priority_dict(
            "DOWNLOADER_MIDDLEWARES", load_object(_MIDDLEWARE), MIDDLEWARE_PRIORITY
        )
        self._use_throttling_redis_scheduler(settings)

    @staticmethod
    def _use_throttling_redis_scheduler(settings: BaseSettings) -> None:
        """scrapy-redis's scheduler becomes its throttling-aware subclass."""
        scheduler: Any = settings.get("SCHEDULER")
        path = (
            scheduler
            if isinstance(scheduler, str)
            else f"{scheduler.__module__}.{scheduler.__qualname__}"
            if isinstance(scheduler, type)
            else ""
        )
        if path != _SCRAPY_REDIS_SCHEDULER:
            # A subclass of it is someone's own scheduler: left alone (the
            # start-up warning names the class to derive from instead).
            return
        # At the priority of the user's choice: the subclass keeps every
        # scrapy-redis setting's meaning, it only stops handing the engine
        # requests whose scopes are not ready.
        priority = max(
            settings.getpriority("SCHEDULER") or 0, SETTINGS_PRIORITIES["addon"]
        )
        settings.set("SCHEDULER", _REDIS_SCHEDULER, priority=priority)

    @staticmethod
    def _plug_into_native(settings: BaseSettings, owned: list[str]) -> None:
        """Scrapy throttles itself: add only the latency samples."""
        # setdefault: a user who switched the middleware off keeps it off.
        settings.setdefault_in_component_priority_dict(
            "DOWNLOADER_MIDDLEWARES",
            load_object(_LATENCY_MIDDLEWARE),
            MIDDLEWARE_PRIORITY,
        )
        from scrapy.settings import default_settings

        # Scrapy's default settings module, not user code.
        differing = [
            name for name in owned if getattr(default_settings, name) != DEFAULTS[name]
        ]
        logger.warning(
            "This Scrapy has its own throttling (scrapy.throttling): "
            "scrapy-adaptive-throttle leaves the throttling manager, the "
            "downloader gate and the scheduler to Scrapy and only plugs "
            "LatencyScopeManager (THROTTLING_SCOPE_MANAGER, unless you set it) "
            "and its latency samples into Scrapy's manager. Scrapy now owns "
            "these settings, with its own defaults: %s%s.",
            ", ".join(owned) or "none",
            (
                f" (Scrapy's default differs from the plugin's for: "
                f"{', '.join(differing)})"
                if differing
                else ""
            ),
        )

    @staticmethod
    def _disable_autothrottle(settings: BaseSettings) -> None:
        if settings.getbool("AUTOTHROTTLE_ENABLED"):
            warnings.warn(
                "AUTOTHROTTLE_ENABLED is ignored: scrapy-adaptive-throttle throttles "
                "every scope itself, and its LatencyScopeManager adapts concurrency "
                "to each host's latency. Remove the AUTOTHROTTLE_* settings.",
                UserWarning,
                stacklevel=2,
            )
        settings.set_in_component_priority_dict(
            "EXTENSIONS", load_object(_AUTOTHROTTLE), None
        )

    @staticmethod
    def _set_component(
        settings: BaseSettings, name: str, ours: str, replaceable: set[str]
    ) -> None:
        if (settings.getpriority(name) or 0) > SETTINGS_PRIORITIES["addon"]:
            # The user's own choice (even Scrapy's default) stands; the
            # throttler warns at start-up about what it costs.
            return
        current: Any = settings.get(name)
        current_path = (
            current
            if isinstance(current, str)
            else (
                f"{current.__module__}.{current.__qualname__}"
                if isinstance(current, type)
                else ""
            )
        )
        if current_path in replaceable or current_path == ours:
            settings.set(name, ours, priority="addon")
        # Otherwise another add-on chose it: a custom DOWNLOADER must subclass
        # ours (the middleware checks it); another priority queue gets a
        # warning at start-up.
