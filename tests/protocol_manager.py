"""A THROTTLING_MANAGER written only to the documented protocol.

Nothing of the plugin's own manager: per-host concurrency
(``PROTOCOL_MANAGER_LIMIT``, default 2), an optional spacing between two sends
to a host counted from the send (``PROTOCOL_MANAGER_DELAY``, seconds, default
0), no backoff. It shows that the add-on's scheduler queue and downloader need
nothing beyond the protocol.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from scrapy import Request
from scrapy.crawler import Crawler
from scrapy.http import Response
from scrapy.utils.asyncio import sleep
from scrapy.utils.httpobj import urlparse_cached


class ProtocolOnlyManager:
    """Per-host concurrency limit, to ``ThrottlingManagerProtocol`` only."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.limit = crawler.settings.getint("PROTOCOL_MANAGER_LIMIT", 2)
        self.delay = crawler.settings.getfloat("PROTOCOL_MANAGER_DELAY", 0.0)
        self.next_send: defaultdict[str, float] = defaultdict(float)
        self.active: defaultdict[str, int] = defaultdict(int)
        self.reserved: dict[Request, str] = {}
        self.max_active = 0

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ProtocolOnlyManager:
        return cls(crawler)

    @staticmethod
    def _scope(request: Request) -> str:
        return urlparse_cached(request).netloc

    async def get_scopes(self, request: Request) -> Any:
        return self._scope(request)

    async def get_initial_backoff(self) -> Any:
        return None

    async def get_response_backoff(self, response: Response) -> Any:
        return None

    async def get_exception_backoff(
        self, request: Request, exception: Exception
    ) -> Any:
        return None

    def is_ready(self, request: Request) -> bool:
        scope = self._scope(request)
        return (
            self.active[scope] < self.limit
            and time.monotonic() >= self.next_send[scope]
        )

    def reserve(self, request: Request) -> None:
        scope = self._scope(request)
        self.next_send[scope] = time.monotonic() + self.delay
        self.active[scope] += 1
        self.max_active = max(self.max_active, self.active[scope])
        self.reserved[request] = scope

    async def acquire(self, request: Request) -> None:
        if request in self.reserved:
            return
        while not self.is_ready(request):
            await sleep(0.01)
        self.reserve(request)

    def release(self, request: Request) -> None:
        scope = self.reserved.pop(request, None)
        if scope is not None:
            self.active[scope] -= 1

    def get_time_until_ready(self, request: Request) -> float | None:
        wait = self.next_send[self._scope(request)] - time.monotonic()
        return wait if wait > 0 else None

    def get_slot_key(self, request: Request) -> str:
        return self._scope(request)

    def get_scope_load(self, scope_id: str) -> float:
        return self.active[scope_id] / self.limit

    def get_request_delay(self, request: Request, now: float | None = None) -> float:
        return 0.0

    def delay_scope(self, scope_id: str, delay: float) -> None:
        pass

    def get_scope_delay(self, scope_id: str) -> float:
        return 0.0

    def set_scope_delay(self, scope_id: str, delay: float) -> None:
        pass

    async def process_response(self, response: Response) -> None:
        pass

    async def process_exception(self, request: Request, exception: Exception) -> None:
        pass


class MinimalManager:
    """Only what issue 10 calls the protocol's core: ``get_scopes``,
    ``acquire``, ``release``, ``process_response``, ``process_exception``.

    Per-host concurrency (``PROTOCOL_MANAGER_LIMIT``, default 2) enforced in
    ``acquire`` alone: the scheduler queue cannot ask it whether a request
    is ready, so requests wait at the downloader gate.
    """

    def __init__(self, crawler: Crawler) -> None:
        self.limit = crawler.settings.getint("PROTOCOL_MANAGER_LIMIT", 2)
        self.active: defaultdict[str, int] = defaultdict(int)
        self.reserved: dict[Request, str] = {}

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> MinimalManager:
        return cls(crawler)

    async def get_scopes(self, request: Request) -> Any:
        return urlparse_cached(request).netloc

    async def acquire(self, request: Request) -> None:
        scope = urlparse_cached(request).netloc
        while self.active[scope] >= self.limit:
            await sleep(0.01)
        self.active[scope] += 1
        self.reserved[request] = scope

    def release(self, request: Request) -> None:
        scope = self.reserved.pop(request, None)
        if scope is not None:
            self.active[scope] -= 1

    async def process_response(self, response: Response) -> None:
        pass

    async def process_exception(self, request: Request, exception: Exception) -> None:
        pass
