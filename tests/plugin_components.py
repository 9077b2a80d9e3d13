"""Stand-ins for what other Scrapy plugins do to requests, for crawl tests.

Each reproduces one plugin's documented behaviour on ``download_slot``, so
that the tests check the pattern without needing the plugin (nor its
service) installed.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

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
