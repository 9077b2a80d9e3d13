"""Stand-ins for what other Scrapy plugins do to requests, for crawl tests.

Each reproduces one plugin's documented behaviour on ``download_slot``, so
that the tests check the pattern without needing the plugin (nor its
service) installed.
"""

from __future__ import annotations

import collections
import itertools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from typing_extensions import Self


class ZyteApiSlotMiddleware:
    """What scrapy-zyte-api's ``ScrapyZyteAPIDownloaderMiddleware`` (priority
    1000) does to every request it sends through Zyte API: it asks the
    downloader for the request's slot key, prefixes it with ``zyte-api@``
    unless it already is, and sets the delay of that downloader slot to 0."""

    slot_prefix = "zyte-api@"

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def process_request(self, request: Request) -> None:
        assert self.crawler.engine is not None
        downloader = self.crawler.engine.downloader
        slot_id = downloader.get_slot_key(request)
        if not slot_id.startswith(self.slot_prefix):
            request.meta["download_slot"] = f"{self.slot_prefix}{slot_id}"
        _, slot = downloader._get_slot(request)
        slot.delay = 0


class ProxySlotMiddleware:
    """A proxy rotation middleware that gives each proxy its own download
    slot: requests are spread round-robin over three proxies, each with
    ``download_slot`` set to the proxy's name (no real proxy is used)."""

    proxies = ("proxy-1", "proxy-2", "proxy-3")

    def __init__(self) -> None:
        self._next = itertools.cycle(self.proxies)

    def process_request(self, request: Request) -> None:
        if request.meta.get("download_slot") not in self.proxies:
            request.meta["download_slot"] = next(self._next)


class SlotsScopeManager:
    """A scope manager written to the protocol that reads a key of its own
    from its :setting:`THROTTLING_SCOPES` entry: ``"slots"``, the number of
    requests of the scope in flight at once (validated here, as the
    built-in keys are by the plugin)."""

    def __init__(self, crawler: Crawler, config: dict[str, Any]) -> None:
        slots = config.get("slots")
        if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
            raise ValueError(
                f"Invalid THROTTLING_SCOPES[{config['id']!r}]['slots'] value "
                f"{slots!r}: expected an integer >= 1"
            )
        self.slots = slots
        self.active = 0

    def can_send(self, now: float | None = None, amount: float | None = None) -> float:
        return 0.0

    def concurrency_blocked(self) -> bool:
        return self.active >= self.slots

    def record_sent(
        self, now: float | None = None, amount: float | None = None
    ) -> None:
        self.active += 1

    def record_done(self, now: float | None = None) -> None:
        self.active -= 1


class FifoScheduler:
    """A scheduler that, like scrapy-redis's, keeps requests in queues of its
    own and never uses :setting:`SCHEDULER_PRIORITY_QUEUE` (one in-memory
    FIFO here, no duplicate filter)."""

    def __init__(self) -> None:
        self.queue: collections.deque[Request] = collections.deque()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls()

    def has_pending_requests(self) -> bool:
        return bool(self.queue)

    def enqueue_request(self, request: Request) -> bool:
        self.queue.append(request)
        return True

    def next_request(self) -> Request | None:
        return self.queue.popleft() if self.queue else None

    def __len__(self) -> int:
        return len(self.queue)


class SlowEveryOtherMiddleware:
    """A downloader middleware that takes ``HOLD`` seconds over every other
    request it sees (as one that fetches a proxy or a token for it does),
    placed after the plugin's own middleware (priority above 950)."""

    #: Seconds every other request is held.
    HOLD = 0.1

    def __init__(self) -> None:
        self.seen = 0

    async def process_request(self, request: Request) -> None:
        from scrapy.utils.defer import maybe_deferred_to_future
        from twisted.internet import reactor
        from twisted.internet.task import deferLater

        self.seen += 1
        if self.seen % 2:
            await maybe_deferred_to_future(deferLater(reactor, self.HOLD, lambda: None))
