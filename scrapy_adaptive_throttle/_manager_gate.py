"""The scheduler queue's gate over the plugin's own manager.

:class:`ManagerGate` is the :class:`~scrapy_adaptive_throttle._queue_gate.QueueGate`
that :class:`~scrapy_adaptive_throttle.ThrottlingManager` exposes once, as
its ``queue_gate`` attribute: the queue and the downloader talk to it, not
to the manager's whole surface. Checks, reservations and listeners go
straight to the :class:`~scrapy_adaptive_throttle._scope_gate.ScopeGate`;
what a subclass of the manager may override (scope resolution, ``release``,
the per-request delay, the slot key) is the manager's bound method, looked
up once when the gate is built: the subclass's override, with no frame of
the gate in between on the hot path (one call per request each).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ._scope_resolver import sent_scope_values

if TYPE_CHECKING:
    from scrapy import Request
    from twisted.internet.defer import Deferred

    from ._manager import ThrottlingManager
    from ._scope_gate import ScopeGate, ScopeValues
    from ._scope_registry import ScopeRegistry
    from ._scopes import RequestScopes, ScopeID
    from ._settings import ThrottlingSettings

__all__ = ["ManagerGate"]

ReleaseListener = Callable[["ScopeID"], None]


class ManagerGate:
    """:class:`~scrapy_adaptive_throttle._queue_gate.QueueGate` of a
    :class:`~scrapy_adaptive_throttle.ThrottlingManager` (or subclass)."""

    #: :meth:`check_scopes` needs scopes only, not the request.
    needs_head = False

    def __init__(
        self,
        manager: ThrottlingManager,
        gate: ScopeGate,
        registry: ScopeRegistry,
        config: ThrottlingSettings,
    ) -> None:
        self._manager = manager
        self._gate = gate
        self._registry = registry
        # Bound once: a subclass's override is what gets bound, and the queue
        # and the downloader call it directly (instance attributes, not
        # methods of this class that would call it, one frame more each).
        self.resolve_scopes_now: Callable[
            [Request], RequestScopes | Deferred[RequestScopes]
        ] = manager.resolve_scopes_now
        self.release: Callable[[Request], None] = manager.release
        self.get_request_delay: Callable[..., float] = manager.get_request_delay
        self.get_slot_key: Callable[[Request], str] = manager.get_slot_key
        self.check_scopes: Callable[..., tuple[float, ScopeID | None]] = (
            gate.check_scopes
        )
        self.reserve_scopes: Callable[[Request, ScopeValues, float], None] = (
            gate.reserve_scopes
        )
        self._request_scopes: Callable[[Request], RequestScopes] = (
            manager.get_request_scopes
        )
        #: The quota of each configured quota scope.
        self.quotas: Mapping[ScopeID, float] = {
            scope_id: scope.quota
            for scope_id, scope in config.scopes.items()
            if scope.quota
        }

    @property
    def clock(self) -> Callable[[], float]:
        """The manager's monotonic clock."""
        return self._gate.clock

    @property
    def wall_clock(self) -> Callable[[], float]:
        """The manager's wall clock."""
        return self._manager.wall_clock

    # -- by request: the protocol's checks, for the manager's methods ---------

    def sent_scope_values(self, request: Request) -> ScopeValues:
        """The ``(scope, quota amount)`` pairs *request* was (or will be)
        sent under (see ``sent_scope_values`` of ``_scope_resolver.py``)."""
        return sent_scope_values(
            request, self._gate.reserved.get(request), self._request_scopes
        )

    def is_ready(self, request: Request) -> bool:
        """Whether *request* could be sent right now (its delay and every
        gate of its scopes)."""
        if self.get_request_delay(request) > 0:
            return False
        wait, blocked = self.check_scopes(
            self.sent_scope_values(request), self._gate.clock()
        )
        return wait <= 0 and blocked is None

    def time_until_ready(self, request: Request) -> float | None:
        """Seconds until *request*'s delay and every time gate of its scopes
        open; ``None`` if they are open."""
        wait, _ = self.check_scopes(self.sent_scope_values(request), self._gate.clock())
        wait = max(wait, self.get_request_delay(request))
        return wait or None

    def reserve(self, request: Request) -> None:
        """Record *request* as sent on its scopes, now."""
        self.reserve_scopes(
            request, self.sent_scope_values(request), self._gate.clock()
        )

    def refund_cached(self, request: Request) -> None:
        """Give back the send of *request*, answered from Scrapy's HTTP cache.

        It never reached the host, so it does not space the next request of
        its scopes (delay and jitter) nor use their quota: a crawl served
        from the cache runs as fast as with Scrapy's own downloader, which
        applies ``DOWNLOAD_DELAY`` only to requests it downloads. Its slots
        are freed by the release, as for every request. Scope managers other
        than the built-in ones keep what they recorded.
        """
        if not self._gate.reserved.get(request):
            return
        self._gate.refund(request, dict(self.sent_scope_values(request)))

    def reached_downloader(self, request: Request) -> None:
        """*request* reached Scrapy's downloader, after the downloader
        middlewares: the delay of its scopes counts from now, as Scrapy's
        ``DOWNLOAD_DELAY`` does, so that the time it spent between the
        queue and the downloader (a busy event loop, a slow middleware)
        never brings two sends of a scope closer than its delay."""
        self._gate.restamp(request)

    # -- listeners and slots ------------------------------------------------------

    def has_free_slot(self, scope_id: ScopeID) -> bool:
        """Whether *scope_id* has room for one more request now."""
        try:
            return not self._registry.get(scope_id).concurrency_blocked()
        except Exception:  # reported when a request meets it
            return True

    def add_release_listener(self, listener: ReleaseListener) -> None:
        """Call *listener* with the scope id whenever a slot of it is freed."""
        self._gate.release_listeners.append(listener)

    def remove_release_listener(self, listener: ReleaseListener) -> None:
        """Stop calling *listener* on releases."""
        _discard(self._gate.release_listeners, listener)

    def add_timer_listener(self, listener: ReleaseListener) -> None:
        """Call *listener* with the scope id whenever a time gate of it opened
        sooner than it said (a cache hit gave its send back)."""
        self._gate.timer_listeners.append(listener)

    def remove_timer_listener(self, listener: ReleaseListener) -> None:
        """Stop calling *listener* on early openings."""
        _discard(self._gate.timer_listeners, listener)


def _discard(listeners: list[ReleaseListener], listener: object) -> None:
    if listener in listeners:
        listeners.remove(listener)
