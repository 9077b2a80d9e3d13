"""The scheduler queue's gate over the plugin's own manager.

:class:`ManagerGate` is the :class:`~scrapy_adaptive_throttle._queue_gate.QueueGate`
that :class:`~scrapy_adaptive_throttle.ThrottlingManager` exposes once, as
its ``queue_gate`` attribute: the queue and the downloader talk to it, not
to the manager's whole surface. Checks, reservations and listeners go
straight to the :class:`~scrapy_adaptive_throttle._scope_gate.ScopeGate`
(no extra call on the hot path); what a subclass of the manager may
override (scope resolution, ``release``, the per-request delay, the slot
key) goes through the manager.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

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

    def resolve_scopes_now(
        self, request: Request
    ) -> RequestScopes | Deferred[RequestScopes]:
        """See :meth:`ThrottlingManager.resolve_scopes_now`."""
        return self._manager.resolve_scopes_now(request)

    def check_scopes(
        self, scope_values: ScopeValues, now: float, head: Request | None = None
    ) -> tuple[float, ScopeID | None]:
        """``(wait, blocked)`` of *scope_values* (*head* is not needed)."""
        return self._gate.check_scopes(scope_values, now)

    def reserve_scopes(
        self, request: Request, scope_values: ScopeValues, now: float
    ) -> None:
        """Record *request* as sent on its scopes, all or nothing."""
        self._gate.reserve_scopes(request, scope_values, now)

    def release(self, request: Request) -> None:
        """Free the slots of *request* (through the manager's ``release``)."""
        self._manager.release(request)

    def get_request_delay(self, request: Request, now: float | None = None) -> float:
        """Remaining ``throttling_delay`` of *request*."""
        return self._manager.get_request_delay(request)

    def get_slot_key(self, request: Request) -> str:
        """The downloader's slot key of *request*."""
        return self._manager.get_slot_key(request)

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
