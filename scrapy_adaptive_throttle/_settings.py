"""Reading and validating every setting of the plugin, in one place.

Settings are read once per crawler into frozen dataclasses. An invalid value
raises :exc:`ValueError` naming the setting, the scope (for
:setting:`THROTTLING_SCOPES` entries) and the value, so a typo stops the crawl
at start-up instead of silently changing how hard a site is hit.

This module reads the settings (:class:`ThrottlingSettings`); the converters
of single values are in :mod:`._setting_values`, the resolution of a
:setting:`THROTTLING_SCOPES` entry in :mod:`._scope_settings`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy.settings import SETTINGS_PRIORITIES, BaseSettings

from ._algorithms import BackoffPolicy, JitterRange
from ._scope_settings import (
    GlobalScopeSettings,
    RampupSettings,
    ScopeSettings,
    classify_scope,
)
from ._setting_values import (
    invalid_value,
    to_bool,
    to_class,
    to_codes,
    to_exceptions,
    to_float,
    to_int,
    to_jitter,
    to_scope_manager_class,
    to_target,
)

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULTS",
    "GlobalScopeSettings",
    "RampupSettings",
    "ScopeSettings",
    "SettingsReader",
    "ThrottlingSettings",
    "classify_scope",
    "report_invalid_setting",
    "to_bool",
    "to_float",
    "to_int",
]

#: Defaults of every setting this plugin adds. They are registered by the
#: add-on and are also the fallback when a component is built without it.
DEFAULTS: dict[str, Any] = {
    "THROTTLING_MANAGER": "scrapy_adaptive_throttle.ThrottlingManager",
    "THROTTLING_SCOPE_MANAGER": "scrapy_adaptive_throttle.ThrottlingScopeManager",
    # The reference chapter's default: the tutorial's test site may be
    # crawled fast, every other host keeps the conservative defaults.
    "THROTTLING_SCOPES": {"quotes.toscrape.com": {"concurrency": 16, "delay": 0.0}},
    "THROTTLING_WINDOW": 60.0,
    "THROTTLING_SCOPE_CONCURRENCY": 1,
    "THROTTLING_SCOPE_LIMIT": 100_000,
    "THROTTLING_SCOPE_MAX_IDLE": 3600.0,
    "THROTTLING_ROBOTSTXT_OBEY": True,
    "THROTTLING_ROBOTSTXT_MAX_DELAY": 60.0,
    "REDIRECT_MAX_DELAY": 120.0,
    "THROTTLING_DEBUG": False,
    "THROTTLING_LATENCY_TOLERANCE": 1.5,
    "THROTTLING_LATENCY_WINDOW": 30.0,
    "THROTTLING_LATENCY_INITIAL_CONCURRENCY": 2,
    "BACKOFF_HTTP_CODES": [429, 502, 503, 504, 520, 521, 522, 523, 524],
    "BACKOFF_EXCEPTIONS": [
        "scrapy.exceptions.DownloadFailedError",
        "scrapy.exceptions.DownloadTimeoutError",
        "scrapy.exceptions.ResponseDataLossError",
    ],
    "BACKOFF_DELAY_FACTOR": 2.0,
    "BACKOFF_MAX_DELAY": 300.0,
    "BACKOFF_MIN_DELAY": 1.0,
    "BACKOFF_JITTER": 0.1,
    "BACKOFF_WINDOW": 60.0,
    "RAMPUP_BACKOFF_TARGET": 1,
    "DELAYED_REQUESTS_WARN_THRESHOLD": 500,
    # Shared state (see _shared_state.py): unset, every process on its own.
    "THROTTLING_STATE_URL": None,
    "THROTTLING_STATE_PREFIX": "throttling",
    "THROTTLING_STATE_PROCESSES": 1,
    # scrapy-redis's scheduler (redis_scheduler.py): its local buffer.
    "THROTTLING_REDIS_BUFFER_SIZE": 1000,
}


def report_invalid_setting(error: ValueError) -> None:
    """Log *error* (an invalid setting found while the crawl starts) once, at
    ERROR, as the whole story, before it is raised.

    Scrapy 2.19's ``scrapy crawl`` runs the crawl's start-up in an asyncio
    task and lets asyncio print whatever ends it as a "Task exception was
    never retrieved" traceback, burying the one line that matters. The task
    that fails is the current one: once done, its exception is marked as
    retrieved, so the user sees this line and the exit status 1 (Scrapy's
    ``bootstrap_failed``). Anything else that ended the task is still handed
    to the event loop's exception handler. Programmatic callers (a
    ``CrawlerRunner``, tests) still get the exception itself.
    """
    logger.error("%s", error)
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running event loop
        return
    if task is None:
        return

    def retrieve(done: asyncio.Task[Any]) -> None:
        if done.cancelled():
            return
        exception = done.exception()
        if exception is not None and exception is not error:
            done.get_loop().call_exception_handler(
                {
                    "message": "Task exception was never retrieved",
                    "exception": exception,
                    "future": done,
                }
            )

    task.add_done_callback(retrieve)


class SettingsReader:
    """Typed, validated access to setting values with precise errors."""

    def __init__(self, settings: BaseSettings) -> None:
        self.settings = settings

    def raw(self, name: str) -> Any:
        # attributes.get avoids the deprecation warning Scrapy 2.19 emits for
        # some settings (CONCURRENT_REQUESTS_PER_IP) on every get().
        attribute = self.settings.attributes.get(name)
        if attribute is None or attribute.value is None:
            return DEFAULTS.get(name)
        return attribute.value

    def is_set_above_default(self, name: str) -> bool:
        priority = self.settings.getpriority(name)
        return priority is not None and priority > SETTINGS_PRIORITIES["default"]


@dataclass(frozen=True)
class ThrottlingSettings:
    """Every throttling setting of a crawl, read and validated once."""

    manager_cls: type
    scope_manager_cls: type
    window: float
    scope_concurrency: int
    scope_limit: int
    scope_max_idle: float
    robotstxt_obey: bool
    robotstxt_max_delay: float
    redirect_max_delay: float
    debug: bool
    total_concurrency: int
    domain_concurrency: int
    ip_concurrency: int
    warn_threshold: int
    user_agent: str
    defaults: Mapping[str, ScopeSettings]
    scopes: Mapping[str, ScopeSettings]
    common: GlobalScopeSettings
    #: Whether :setting:`THROTTLING_SCOPES` comes from the user's settings
    #: (not the default).
    scopes_set: bool
    #: Ids of the ``"other"`` scopes that came from a ``download_slot`` set by
    #: another component (see :meth:`add_slot_scope`).
    slot_scopes: set[str] = field(default_factory=set)
    #: :setting:`THROTTLING_REDIS_BUFFER_SIZE`: the most requests
    #: ``ThrottlingRedisScheduler`` keeps waiting for their scopes.
    redis_buffer_size: int = 1000

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ThrottlingSettings:
        """Return the settings of *crawler*, read once and cached on it."""
        cached = getattr(crawler, "_throttling_settings", None)
        if isinstance(cached, ThrottlingSettings):
            return cached
        try:
            resolved = cls.from_settings(crawler.settings)
        except ValueError as exc:
            report_invalid_setting(exc)
            raise
        crawler._throttling_settings = resolved  # type: ignore[attr-defined]
        return resolved

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> ThrottlingSettings:
        """Read and validate *settings*; raise :exc:`ValueError` on bad input."""
        read = SettingsReader(settings)
        total = to_int(read.raw("CONCURRENT_REQUESTS"), "CONCURRENT_REQUESTS")
        domain = to_int(
            read.raw("CONCURRENT_REQUESTS_PER_DOMAIN"),
            "CONCURRENT_REQUESTS_PER_DOMAIN",
        )
        ip = to_int(
            read.raw("CONCURRENT_REQUESTS_PER_IP") or 0, "CONCURRENT_REQUESTS_PER_IP"
        )
        scope_concurrency = to_int(
            read.raw("THROTTLING_SCOPE_CONCURRENCY"), "THROTTLING_SCOPE_CONCURRENCY"
        )
        download_delay = to_float(read.raw("DOWNLOAD_DELAY") or 0, "DOWNLOAD_DELAY")
        jitter = _default_jitter(read)
        backoff = BackoffPolicy(
            delay_factor=to_float(
                read.raw("BACKOFF_DELAY_FACTOR"), "BACKOFF_DELAY_FACTOR", minimum=1.0
            ),
            min_delay=to_float(read.raw("BACKOFF_MIN_DELAY"), "BACKOFF_MIN_DELAY"),
            max_delay=to_float(read.raw("BACKOFF_MAX_DELAY"), "BACKOFF_MAX_DELAY"),
            jitter=to_jitter(read.raw("BACKOFF_JITTER"), "BACKOFF_JITTER"),
            window=to_float(read.raw("BACKOFF_WINDOW"), "BACKOFF_WINDOW"),
        )
        if backoff.min_delay > backoff.max_delay:
            raise ValueError(
                f"Invalid BACKOFF_MIN_DELAY value {backoff.min_delay!r}: it exceeds "
                f"BACKOFF_MAX_DELAY ({backoff.max_delay!r})"
            )
        rampup_target = to_target(
            read.raw("RAMPUP_BACKOFF_TARGET"), "RAMPUP_BACKOFF_TARGET"
        )
        tolerance = to_float(
            read.raw("THROTTLING_LATENCY_TOLERANCE"),
            "THROTTLING_LATENCY_TOLERANCE",
            minimum=1.0,
        )
        latency_window = to_float(
            read.raw("THROTTLING_LATENCY_WINDOW"),
            "THROTTLING_LATENCY_WINDOW",
            minimum=0.0,
            exclusive_minimum=True,
        )
        initial = to_int(
            read.raw("THROTTLING_LATENCY_INITIAL_CONCURRENCY"),
            "THROTTLING_LATENCY_INITIAL_CONCURRENCY",
            minimum=1,
        )
        window = to_float(read.raw("THROTTLING_WINDOW"), "THROTTLING_WINDOW")
        scope_manager_cls = to_scope_manager_class(
            read.raw("THROTTLING_SCOPE_MANAGER"), "THROTTLING_SCOPE_MANAGER"
        )
        common = GlobalScopeSettings(
            domain=domain,
            ip=ip,
            scope_concurrency=scope_concurrency,
            delay=download_delay,
            jitter=jitter,
            window=window,
            backoff=backoff,
            http_codes=to_codes(read.raw("BACKOFF_HTTP_CODES"), "BACKOFF_HTTP_CODES"),
            exceptions=to_exceptions(
                read.raw("BACKOFF_EXCEPTIONS"), "BACKOFF_EXCEPTIONS"
            ),
            rampup_target=rampup_target,
            tolerance=tolerance,
            latency_window=latency_window,
            initial=initial,
            scope_manager_cls=scope_manager_cls,
        )
        defaults = {
            kind: common.resolve(kind, None, {})
            for kind in ("domain", "ip", "other", "slot")
        }
        raw_scopes = read.raw("THROTTLING_SCOPES")
        if isinstance(raw_scopes, BaseSettings):
            raw_scopes = raw_scopes.copy_to_dict()
        if not isinstance(raw_scopes, Mapping):
            raise invalid_value(
                "THROTTLING_SCOPES", None, None, raw_scopes, "expected a dict"
            )
        scopes: dict[str, ScopeSettings] = {}
        for scope_id, config in raw_scopes.items():
            if not isinstance(scope_id, str) or not scope_id:
                raise invalid_value(
                    "THROTTLING_SCOPES",
                    None,
                    None,
                    scope_id,
                    "scope ids must be non-empty strings",
                )
            if not isinstance(config, Mapping):
                raise ValueError(
                    f"Invalid THROTTLING_SCOPES[{scope_id!r}] value {config!r}: "
                    "expected a dict of scope settings"
                )
            scopes[scope_id] = common.resolve(
                classify_scope(scope_id), scope_id, config
            )
        user_agent = read.raw("ROBOTSTXT_USER_AGENT") or read.raw("USER_AGENT") or ""
        return cls(
            manager_cls=to_class(read.raw("THROTTLING_MANAGER"), "THROTTLING_MANAGER"),
            scope_manager_cls=scope_manager_cls,
            window=window,
            scope_concurrency=scope_concurrency,
            scope_limit=to_int(
                read.raw("THROTTLING_SCOPE_LIMIT"), "THROTTLING_SCOPE_LIMIT"
            ),
            scope_max_idle=to_float(
                read.raw("THROTTLING_SCOPE_MAX_IDLE"), "THROTTLING_SCOPE_MAX_IDLE"
            ),
            robotstxt_obey=to_bool(
                read.raw("ROBOTSTXT_OBEY") or False, "ROBOTSTXT_OBEY"
            )
            and to_bool(
                read.raw("THROTTLING_ROBOTSTXT_OBEY"), "THROTTLING_ROBOTSTXT_OBEY"
            ),
            redirect_max_delay=to_float(
                read.raw("REDIRECT_MAX_DELAY"), "REDIRECT_MAX_DELAY"
            ),
            robotstxt_max_delay=to_float(
                read.raw("THROTTLING_ROBOTSTXT_MAX_DELAY"),
                "THROTTLING_ROBOTSTXT_MAX_DELAY",
            ),
            debug=to_bool(read.raw("THROTTLING_DEBUG"), "THROTTLING_DEBUG"),
            total_concurrency=total,
            domain_concurrency=domain,
            ip_concurrency=ip,
            warn_threshold=to_int(
                read.raw("DELAYED_REQUESTS_WARN_THRESHOLD"),
                "DELAYED_REQUESTS_WARN_THRESHOLD",
            ),
            user_agent=str(user_agent),
            defaults=defaults,
            scopes=scopes,
            common=common,
            scopes_set=read.is_set_above_default("THROTTLING_SCOPES"),
            redis_buffer_size=to_int(
                read.raw("THROTTLING_REDIS_BUFFER_SIZE"),
                "THROTTLING_REDIS_BUFFER_SIZE",
                minimum=1,
            ),
        )

    def scope(self, scope_id: str) -> ScopeSettings:
        """Return the settings of *scope_id*: its own entry, else its kind's."""
        configured = self.scopes.get(scope_id)
        if configured is not None:
            return configured
        kind = classify_scope(scope_id)
        if kind == "other" and scope_id in self.slot_scopes:
            kind = "slot"
        return self.defaults[kind]

    def add_slot_scope(self, scope_id: str) -> None:
        """Record *scope_id* as the scope of a ``download_slot`` set by
        another component: unless configured in :setting:`THROTTLING_SCOPES`
        or named after a host, such a scope has no limit of its own."""
        self.slot_scopes.add(scope_id)

    def resolve_scope(self, scope_id: str, config: Mapping[str, Any]) -> ScopeSettings:
        """Return the settings for a scope manager built with *config*.

        *config* is normally the scope's own entry plus ``"id"`` (then the
        settings resolved at start-up are reused); any other dict is
        validated and resolved now.
        """
        known = self.scope(scope_id)
        if len(config) - ("id" in config) == len(known.raw) and all(
            known.raw.get(key) == value for key, value in config.items() if key != "id"
        ):
            return known
        return self.common.resolve(known.kind, scope_id, config)


def _default_jitter(read: SettingsReader) -> JitterRange:
    # RANDOMIZE_DOWNLOAD_DELAY wins only when the user set it: its default
    # (True) means the same ±50% as DOWNLOAD_DELAY_JITTER's default (0.5).
    if read.is_set_above_default("RANDOMIZE_DOWNLOAD_DELAY"):
        return to_jitter(
            read.raw("RANDOMIZE_DOWNLOAD_DELAY"),
            "RANDOMIZE_DOWNLOAD_DELAY",
            allow_bool=True,
        )
    value = read.raw("DOWNLOAD_DELAY_JITTER")
    return to_jitter(0.5 if value is None else value, "DOWNLOAD_DELAY_JITTER")
