"""A subclass of the plugin's manager that overrides what its queue gate
binds (``release``, ``get_request_delay``, ``get_slot_key``): each override
counts its calls in the crawl's stats, so that a test sees that the queue and
the downloader call the subclass, not the base class."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy_adaptive_throttle import ThrottlingManager

if TYPE_CHECKING:
    from scrapy import Request

#: The prefix of the stats the overrides count their calls in.
PREFIX = "test/override"


class CountingManager(ThrottlingManager):
    def _count(self, name: str) -> None:
        assert self.crawler.stats is not None
        self.crawler.stats.inc_value(f"{PREFIX}/{name}_count")

    def release(self, request: Request) -> None:
        self._count("release")
        super().release(request)

    def get_request_delay(self, request: Request, now: float | None = None) -> float:
        self._count("get_request_delay")
        return super().get_request_delay(request, now)

    def get_slot_key(self, request: Request) -> str:
        self._count("get_slot_key")
        return "counted:" + super().get_slot_key(request)
