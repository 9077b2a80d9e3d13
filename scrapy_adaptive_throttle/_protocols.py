"""The protocols of the throttling manager and of scope managers.

Names and signatures follow the throttling chapter of Scrapy's pull request
#6931, so code written for it works with this plugin by changing the import
path from ``scrapy.throttling`` to ``scrapy_adaptive_throttle``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from twisted.internet.defer import Deferred
    from typing_extensions import Self

    from ._scopes import BackoffData, RequestScopes, ScopeID


class ThrottlingManagerProtocol(Protocol):
    """The throttling manager, reachable as ``crawler.throttler``.

    It maps requests to scopes, gates requests on their scopes, and turns
    responses and exceptions into backoff.
    """

    async def get_scopes(self, request: Request) -> RequestScopes:
        """Return the scopes that apply to *request*."""

    async def get_initial_backoff(self) -> BackoffData:
        """Return backoff data to apply before the first request is sent."""

    async def get_response_backoff(self, response: Response) -> BackoffData:
        """Return the backoff update derived from *response*."""

    async def get_exception_backoff(
        self, request: Request, exception: BaseException
    ) -> BackoffData:
        """Return the backoff update derived from a download exception."""

    async def acquire(self, request: Request) -> None:
        """Return once every scope of *request* allows it, having reserved it."""

    def release(self, request: Request) -> None:
        """Free the slots reserved for *request*. Idempotent."""

    def is_ready(self, request: Request) -> bool:
        """Return whether *request* could be sent right now (non-blocking)."""

    def reserve(self, request: Request) -> None:
        """Record *request* as sent; a later :meth:`acquire` returns at once."""

    def get_time_until_ready(self, request: Request) -> float | None:
        """Seconds until every time gate of *request* opens (``None``: open)."""

    def get_slot_key(self, request: Request) -> str:
        """A single string for the scopes of *request* (sorted ids joined by ``+``)."""

    def get_scope_load(self, scope_id: ScopeID) -> float:
        """Active requests of the scope divided by its concurrency limit."""

    def get_request_delay(self, request: Request, now: float | None = None) -> float:
        """Remaining ``throttling_delay`` of *request* (0.0 if none)."""

    def delay_scope(self, scope_id: ScopeID, delay: float) -> None:
        """Hold back a scope for at least *delay* seconds (a backoff trigger)."""

    def get_scope_delay(self, scope_id: ScopeID) -> float:
        """Return the base (non-backoff) delay of a scope."""

    def set_scope_delay(self, scope_id: ScopeID, delay: float) -> None:
        """Set the base delay of a scope, up or down (not a backoff trigger)."""

    async def process_response(self, response: Response) -> None:
        """Update throttling state from a response."""

    async def process_exception(
        self, request: Request, exception: BaseException
    ) -> None:
        """Update throttling state from a download exception."""


class ThrottlingScopeManagerProtocol(Protocol):
    """The state of one throttling scope.

    Only ``can_send``, ``record_sent`` and ``record_done`` are required by
    :class:`~scrapy_adaptive_throttle.ThrottlingManager`; it falls back to
    sensible defaults when any other method is missing.
    """

    @classmethod
    def from_crawler(cls, crawler: Crawler, config: dict[str, Any]) -> Self: ...

    def can_send(self, now: float | None = None, amount: float | None = None) -> float:
        """Seconds to wait before a request consuming *amount* may be sent (0 = now)."""

    def record_sent(
        self, now: float | None = None, amount: float | None = None
    ) -> None:
        """Record that a request was sent, consuming *amount* of quota."""

    def record_done(self, now: float | None = None) -> None:
        """Record that a previously sent request finished."""

    def record_backoff(
        self, delay: float | None = None, now: float | None = None, cap: bool = True
    ) -> None:
        """Apply a backoff trigger; *delay* is a hard minimum wait."""

    def reconcile_quota(
        self,
        consumed: float | None = None,
        remaining: float | None = None,
        now: float | None = None,
    ) -> None:
        """Correct the quota estimate (actual delta, or server-reported rest)."""

    def get_base_delay(self) -> float:
        """Return the base (non-backoff) delay."""

    def set_base_delay(self, delay: float, *, only_increase: bool = True) -> None:
        """Set the base delay (by default only raising it)."""

    def set_concurrency(self, concurrency: int) -> None:
        """Set the maximum concurrency."""

    def concurrency_blocked(self) -> bool:
        """Whether the scope is at its concurrency limit."""

    def get_load(self) -> float:
        """Active requests / limit (1.0 = as busy as allowed)."""

    def slot_event(self) -> Deferred[None]:
        """A Deferred that fires when a slot may be free."""

    def discard_slot_event(self, event: Deferred[None]) -> None:
        """Forget an unfired slot event."""

    def is_idle(self, now: float, max_idle: float) -> bool:
        """Whether the scope state can be evicted."""
