"""A stand-in for a Scrapy that ships its own throttling (``scrapy.throttling``).

No released Scrapy has it yet (it is Scrapy's pull request #6931), so CI
tests the add-on's native mode against this module: :func:`install`
registers it as ``scrapy.throttling`` and gives the installed Scrapy what
the reference chapter says a native Scrapy owns:

- the settings (``THROTTLING_*``, ``BACKOFF_*``, ``RAMPUP_*``) among Scrapy's
  defaults, with the pull request's default values (some differ from the
  plugin's, on purpose: ``BACKOFF_HTTP_CODES`` here is the pull request's
  list without 502);
- ``crawler.throttler``, built from :setting:`THROTTLING_MANAGER` once the
  add-ons have updated the settings;
- the engine's gate around every download: ``acquire`` before the
  downloader, ``process_response`` / ``process_exception`` after the
  middlewares, ``release`` in ``finally`` (the pull request's
  ``ExecutionEngine._download``);
- a downloader whose slots no longer throttle.

Its manager and scope manager are minimal but implement the documented
protocols: per-scope concurrency (``concurrency``, else
``CONCURRENT_REQUESTS_PER_DOMAIN``) and delay, a backoff hold on
``BACKOFF_HTTP_CODES`` (``Retry-After`` seconds, else ``BACKOFF_MIN_DELAY``)
and on ``BACKOFF_EXCEPTIONS``, slot events, scope eviction by idleness.

Use it in a fresh process (``tests.crawl_process`` with ``"native": true``)
or, for settings-only checks, through :func:`module_only` with pytest's
``monkeypatch``.
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Protocol

from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler, load_object

ScopeID = str
_RESOLVED = "_throttling_resolved_scopes"

#: The pull request's default settings (its default_settings.py), as far as
#: this stand-in reads them.
DEFAULT_SETTINGS: dict[str, Any] = {
    "THROTTLING_MANAGER": "scrapy.throttling.ThrottlingManager",
    "THROTTLING_SCOPE_MANAGER": "scrapy.throttling.ThrottlingScopeManager",
    "THROTTLING_SCOPES": {},
    "THROTTLING_WINDOW": 60.0,
    "THROTTLING_SCOPE_CONCURRENCY": 1,
    "THROTTLING_SCOPE_LIMIT": 100_000,
    "THROTTLING_SCOPE_MAX_IDLE": 3600.0,
    "THROTTLING_ROBOTSTXT_OBEY": True,
    "THROTTLING_ROBOTSTXT_MAX_DELAY": 60.0,
    "THROTTLING_DEBUG": False,
    "BACKOFF_HTTP_CODES": [429, 503, 504, 520, 521, 522, 523, 524],
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
}


class ThrottlingManagerProtocol(Protocol):
    """The manager protocol (its presence is what the add-on detects)."""


class ThrottlingScopeManagerProtocol(Protocol):
    """The scope-manager protocol (its presence is what the add-on detects)."""


def iter_scopes(scopes: Any) -> Iterable[ScopeID]:
    if scopes is None:
        return ()
    if isinstance(scopes, str):
        return (scopes,)
    return tuple(scopes)


def scope_cache(function: Any) -> Any:
    async def wrapper(self: Any, request: Any) -> Any:
        scopes = await function(self, request)
        if not isinstance(scopes, str | dict | None):
            scopes = list(scopes)
        request.meta[_RESOLVED] = scopes
        return scopes

    return wrapper


class ThrottlingScopeManager:
    """Fixed concurrency and delay, a backoff hold."""

    def __init__(self, crawler: Any, config: dict[str, Any]) -> None:
        settings = crawler.settings
        self.id = config["id"]
        self.concurrency = int(
            config.get("concurrency", settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN"))
        )
        self.delay = float(config.get("delay", settings.getfloat("DOWNLOAD_DELAY")))
        self.min_backoff = settings.getfloat("BACKOFF_MIN_DELAY")
        self.active = 0
        self.next_send = 0.0
        self.hold_until = 0.0
        self.last_seen: float | None = None
        self.waiters: list[Any] = []

    @classmethod
    def from_crawler(cls, crawler: Any, config: dict[str, Any]) -> Any:
        return cls(crawler, config)

    def can_send(self, now: float | None = None, amount: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        return max(0.0, self.next_send - now, self.hold_until - now)

    def record_sent(
        self, now: float | None = None, amount: float | None = None
    ) -> None:
        now = time.monotonic() if now is None else now
        self.last_seen = now
        self.active += 1
        self.next_send = now + self.delay

    def record_done(self, now: float | None = None) -> None:
        if self.active > 0:
            self.active -= 1
            self._wake()

    def record_backoff(
        self, delay: float | None = None, now: float | None = None, cap: bool = True
    ) -> None:
        now = time.monotonic() if now is None else now
        self.hold_until = max(self.hold_until, now + (delay or self.min_backoff))

    def reconcile_quota(self, consumed=None, remaining=None, now=None) -> None:
        pass

    def get_base_delay(self) -> float:
        return self.delay

    def set_base_delay(self, delay: float, *, only_increase: bool = True) -> None:
        if not only_increase or delay > self.delay:
            self.delay = delay

    def set_concurrency(self, concurrency: int) -> None:
        self.concurrency = int(concurrency)
        self._wake()

    def concurrency_blocked(self) -> bool:
        return self.active >= self.concurrency

    def get_load(self) -> float:
        return self.active / self.concurrency if self.concurrency else 0.0

    def slot_event(self) -> Any:
        from twisted.internet.defer import Deferred

        event: Deferred[None] = Deferred()
        self.waiters.append(event)
        return event

    def discard_slot_event(self, event: Any) -> None:
        if event in self.waiters:
            self.waiters.remove(event)

    def is_idle(self, now: float, max_idle: float) -> bool:
        if self.active or self.hold_until > now:
            return False
        return self.last_seen is None or now - self.last_seen > max_idle

    def _wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for event in waiters:
            if not event.called:
                event.callback(None)


class ThrottlingManager:
    """The native ``crawler.throttler``: scopes are netlocs unless
    ``throttling_scopes`` says otherwise; the engine gates through
    :meth:`acquire`."""

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        settings = crawler.settings
        self._scopes_config = settings.getdict("THROTTLING_SCOPES")
        self._default_cls = load_object(settings["THROTTLING_SCOPE_MANAGER"])
        self._codes = set(settings.getlist("BACKOFF_HTTP_CODES"))
        self._exceptions = tuple(
            load_object(path) for path in settings.getlist("BACKOFF_EXCEPTIONS")
        )
        self._max_idle = settings.getfloat("THROTTLING_SCOPE_MAX_IDLE")
        self._scope_managers: OrderedDict[ScopeID, Any] = OrderedDict()
        self._reserved: dict[Any, list[Any]] = {}
        self.sent = 0

    @classmethod
    def from_crawler(cls, crawler: Any) -> Any:
        return cls(crawler)

    @scope_cache
    async def get_scopes(self, request: Any) -> Any:
        scopes = request.meta.get("throttling_scopes")
        if scopes is not None:
            return scopes
        return urlparse_cached(request).netloc

    def _get_scope_manager(self, scope_id: ScopeID) -> Any:
        manager = self._scope_managers.get(scope_id)
        if manager is None:
            config = dict(self._scopes_config.get(scope_id, {}))
            cls = config.get("manager") or self._default_cls
            cls = load_object(cls) if isinstance(cls, str) else cls
            config["id"] = scope_id
            manager = build_from_crawler(cls, self.crawler, config)
            self._scope_managers[scope_id] = manager
        return manager

    def _evict(self, now: float) -> None:
        for scope_id in [
            scope_id
            for scope_id, manager in self._scope_managers.items()
            if manager.is_idle(now, self._max_idle)
        ]:
            del self._scope_managers[scope_id]

    async def get_initial_backoff(self) -> Any:
        return None

    async def get_response_backoff(self, response: Any) -> Any:
        request = response.request
        if request.meta.get("throttling_dont_track"):
            return None
        if response.status not in self._codes:
            return None
        scopes = request.meta.get(_RESOLVED)
        value = response.headers.get(b"Retry-After", b"").decode().strip()
        delay = float(value) if value.isdigit() else None
        return {scope: {"delay": delay} for scope in iter_scopes(scopes)}

    async def get_exception_backoff(self, request: Any, exception: Any) -> Any:
        if request.meta.get("throttling_dont_track"):
            return None
        if isinstance(exception, self._exceptions):
            return request.meta.get(_RESOLVED)
        return None

    async def acquire(self, request: Any) -> None:
        from scrapy.utils.asyncio import sleep

        if request in self._reserved:
            return
        scopes = list(iter_scopes(await self.get_scopes(request)))
        while True:
            now = time.monotonic()
            managers = [self._get_scope_manager(scope) for scope in scopes]
            wait = max((manager.can_send(now) for manager in managers), default=0.0)
            if wait > 0:
                await sleep(wait)
                continue
            blocked = [manager for manager in managers if manager.concurrency_blocked()]
            if not blocked:
                for manager in managers:
                    manager.record_sent(now)
                self._reserved[request] = managers
                self.sent += 1
                return
            await self._wait_for_slot(blocked)

    async def _wait_for_slot(self, managers: list[Any]) -> None:
        # The pull request's wait: the first slot event, or a 1-second poll.
        from scrapy.utils.asyncio import call_later
        from scrapy.utils.defer import maybe_deferred_to_future
        from twisted.internet.defer import Deferred

        done: Deferred[None] = Deferred()

        def fire(_: Any = None) -> None:
            if not done.called:
                done.callback(None)

        events = [(manager, manager.slot_event()) for manager in managers]
        for _, event in events:
            event.addCallback(fire)
        timer = call_later(1.0, fire)
        try:
            await maybe_deferred_to_future(done)
        finally:
            timer.cancel()
            for manager, event in events:
                if not event.called:
                    manager.discard_slot_event(event)

    def release(self, request: Any) -> None:
        now = time.monotonic()
        for manager in self._reserved.pop(request, []):
            manager.record_done(now)
        self._evict(now)

    def is_ready(self, request: Any) -> bool:
        now = time.monotonic()
        managers = [
            self._get_scope_manager(s) for s in iter_scopes(request.meta.get(_RESOLVED))
        ]
        return all(
            m.can_send(now) <= 0 and not m.concurrency_blocked() for m in managers
        )

    def reserve(self, request: Any) -> None:
        now = time.monotonic()
        managers = [
            self._get_scope_manager(s) for s in iter_scopes(request.meta.get(_RESOLVED))
        ]
        for manager in managers:
            manager.record_sent(now)
        self._reserved[request] = managers

    def get_time_until_ready(self, request: Any) -> float | None:
        now = time.monotonic()
        wait = max(
            (
                self._get_scope_manager(s).can_send(now)
                for s in iter_scopes(request.meta.get(_RESOLVED))
            ),
            default=0.0,
        )
        return wait or None

    def get_slot_key(self, request: Any) -> str:
        return "+".join(sorted(iter_scopes(request.meta.get(_RESOLVED))))

    def get_scope_load(self, scope_id: ScopeID) -> float:
        return float(self._get_scope_manager(scope_id).get_load())

    def get_request_delay(self, request: Any, now: float | None = None) -> float:
        return 0.0

    def delay_scope(self, scope_id: ScopeID, delay: float) -> None:
        self._get_scope_manager(scope_id).record_backoff(delay=delay, cap=False)

    def get_scope_delay(self, scope_id: ScopeID) -> float:
        return float(self._get_scope_manager(scope_id).get_base_delay())

    def set_scope_delay(self, scope_id: ScopeID, delay: float) -> None:
        self._get_scope_manager(scope_id).set_base_delay(delay, only_increase=False)

    async def process_response(self, response: Any) -> None:
        await self._apply(await self.get_response_backoff(response))

    async def process_exception(self, request: Any, exception: Any) -> None:
        await self._apply(await self.get_exception_backoff(request, exception))

    async def _apply(self, data: Any) -> None:
        if not data:
            return
        items = (
            data.items()
            if isinstance(data, dict)
            else ((scope, None) for scope in iter_scopes(data))
        )
        for scope, details in items:
            delay = details.get("delay") if isinstance(details, dict) else None
            self._get_scope_manager(scope).record_backoff(delay=delay)


def module_only(monkeypatch: Any) -> None:
    """Make this module ``scrapy.throttling`` and its settings Scrapy's
    defaults, undone at the end of the test (no engine or crawler patch)."""
    import scrapy
    from scrapy.settings import default_settings

    monkeypatch.setitem(sys.modules, "scrapy.throttling", sys.modules[__name__])
    monkeypatch.setattr(scrapy, "throttling", sys.modules[__name__], raising=False)
    for name, value in DEFAULT_SETTINGS.items():
        monkeypatch.setattr(default_settings, name, value, raising=False)


def install() -> None:
    """Turn the installed Scrapy into a native-throttling one, for this
    process (call it before the crawler is created)."""
    import scrapy
    from scrapy.core.downloader import Downloader
    from scrapy.core.engine import ExecutionEngine
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.settings import default_settings
    from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future

    module = sys.modules[__name__]
    sys.modules["scrapy.throttling"] = module
    scrapy.throttling = module  # type: ignore[attr-defined]
    for name, value in DEFAULT_SETTINGS.items():
        setattr(default_settings, name, value)

    apply_settings = Crawler._apply_settings

    def _apply_settings(self: Crawler) -> None:
        frozen = self.settings.frozen
        apply_settings(self)
        if not frozen and getattr(self, "throttler", None) is None:
            manager_cls = load_object(self.settings["THROTTLING_MANAGER"])
            self.throttler = build_from_crawler(manager_cls, self)  # type: ignore[attr-defined]

    Crawler._apply_settings = _apply_settings  # type: ignore[method-assign]

    download = ExecutionEngine._download

    async def gated(engine: ExecutionEngine, request: Any) -> Any:
        throttler = engine.crawler.throttler  # type: ignore[attr-defined]
        active = engine.downloader.active
        try:
            await throttler.acquire(request)
            try:
                result = await maybe_deferred_to_future(download(engine, request))
            except Exception as exc:
                active.add(request)  # the downloader removed it
                await throttler.process_exception(request, exc)
                raise
            active.add(request)  # the downloader removed it
            if isinstance(result, Response):
                await throttler.process_response(result)
            return result
        finally:
            throttler.release(request)

    def _download(self: ExecutionEngine, request: Any) -> Any:
        # As in the pull request, a request waiting at the gate counts
        # against CONCURRENT_REQUESTS and keeps the spider from closing, from
        # now until the engine has its result: on the asyncio reactor the
        # coroutine starts, and its result arrives, on later loop turns, when
        # the engine could otherwise see an idle downloader and close.
        active = self.downloader.active
        active.add(request)
        deferred = deferred_from_coro(gated(self, request))

        def done(result: Any) -> Any:
            active.discard(request)
            if self._slot is not None:
                self._slot.nextcall.schedule()
            return result

        deferred.addBoth(done)
        return deferred

    ExecutionEngine._download = _download  # type: ignore[method-assign]

    downloader_init = Downloader.__init__

    def _downloader_init(self: Downloader, crawler: Any) -> None:
        downloader_init(self, crawler)
        # Slots no longer throttle: the scopes do.
        self.domain_concurrency = 1_000_000
        self.ip_concurrency = 0
        self._delay = 0.0
        self._jitter = 0.0

    Downloader.__init__ = _downloader_init  # type: ignore[method-assign]
