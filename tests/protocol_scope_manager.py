"""Scope managers written only to the documented scope-manager protocol.

Nothing of the plugin's own scope managers: they show that the manager needs
nothing beyond ``ThrottlingScopeManagerProtocol`` (and, for
:class:`CountingOnly`, nothing beyond its three required methods).
"""

from __future__ import annotations

import time
from typing import Any

from scrapy.crawler import Crawler
from twisted.internet.defer import Deferred


class ProtocolOnlyScopeManager:
    """A fixed concurrency (``"concurrency"``, default 3) and a delay counted
    from each send (``"delay"``, default 0), every protocol method, no backoff
    growth."""

    def __init__(self, crawler: Crawler, config: dict[str, Any]) -> None:
        self.id = config["id"]
        self.limit = int(config.get("concurrency", 3))
        self.delay = float(config.get("delay", 0.0))
        self.hold_until = 0.0
        self.next_send = 0.0
        self.active = 0
        self.waiters: list[Deferred[None]] = []

    @classmethod
    def from_crawler(
        cls, crawler: Crawler, config: dict[str, Any]
    ) -> ProtocolOnlyScopeManager:
        return cls(crawler, config)

    def can_send(self, now: float | None = None, amount: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        return max(0.0, self.next_send - now, self.hold_until - now)

    def record_sent(
        self, now: float | None = None, amount: float | None = None
    ) -> None:
        now = time.monotonic() if now is None else now
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
        self.hold_until = max(self.hold_until, now + (delay or 1.0))

    def reconcile_quota(
        self,
        consumed: float | None = None,
        remaining: float | None = None,
        now: float | None = None,
    ) -> None:
        pass

    def get_base_delay(self) -> float:
        return self.delay

    def set_base_delay(self, delay: float, *, only_increase: bool = True) -> None:
        if not only_increase or delay > self.delay:
            self.delay = delay

    def set_concurrency(self, concurrency: int) -> None:
        self.limit = max(1, int(concurrency))
        self._wake()

    def concurrency_blocked(self) -> bool:
        return self.active >= self.limit

    def get_load(self) -> float:
        return self.active / self.limit

    def slot_event(self) -> Deferred[None]:
        event: Deferred[None] = Deferred()
        self.waiters.append(event)
        return event

    def discard_slot_event(self, event: Deferred[None]) -> None:
        if event in self.waiters:
            self.waiters.remove(event)

    def is_idle(self, now: float, max_idle: float) -> bool:
        return self.active == 0 and now >= self.hold_until

    def _wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for event in waiters:
            if not event.called:
                event.callback(None)


class CountingOnly:
    """The three required methods only (no concurrency limit, no slot
    events, no backoff): it limits nothing, and the crawl must still finish."""

    def __init__(self, crawler: Crawler, config: dict[str, Any]) -> None:
        self.active = 0
        self.sent = 0

    def can_send(self, now: float | None = None, amount: float | None = None) -> float:
        return 0.0

    def record_sent(
        self, now: float | None = None, amount: float | None = None
    ) -> None:
        self.active += 1
        self.sent += 1

    def record_done(self, now: float | None = None) -> None:
        self.active -= 1


class NotAScopeManager:
    """A class that implements none of the protocol (a wrong import path)."""

    def __init__(self, crawler: Crawler, config: dict[str, Any]) -> None:
        pass


class NotAManager:
    """Has ``acquire`` but not the rest of ThrottlingManagerProtocol."""

    def __init__(self, crawler: Crawler) -> None:
        pass

    async def acquire(self, request: Any) -> None:
        pass
