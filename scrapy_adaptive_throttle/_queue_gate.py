"""What the scheduler queue and the downloader need from the manager.

The throttling-aware queue only hands out requests whose scopes allow them
now, so it needs more than :class:`~scrapy_adaptive_throttle.ThrottlingManagerProtocol`
says: a synchronous scope resolution (``push`` is synchronous), a check by
scope set that tells a closed time gate (how long) from a full concurrency
slot (which scope), a reservation, and a call when a slot frees up. That is
:class:`QueueGate`.

:class:`~scrapy_adaptive_throttle.ThrottlingManager` exposes one as its
``queue_gate`` (``_manager_gate.py``), which goes straight to the manager's
scope gate: no adapter on the hot path. Any other
:setting:`THROTTLING_MANAGER` written to the documented protocol gets
:class:`ProtocolManagerGate`, which builds the same interface from the
protocol's request-level methods (``is_ready``, ``get_time_until_ready``,
``reserve``, ``release``), in ``_protocol_manager.py``: the one place that
looks for optional methods of a custom manager.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ._protocol_manager import (
    ANY_SCOPE,
    PROTOCOL_RECHECK_INTERVAL,
    ProtocolManagerGate,
    missing_manager_methods,
)
from ._types import RequestScopes, ScopeID

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from twisted.internet.defer import Deferred

__all__ = [
    "ANY_SCOPE",
    "PROTOCOL_RECHECK_INTERVAL",
    "ProtocolManagerGate",
    "QueueGate",
    "missing_manager_methods",
    "queue_gate",
]

ScopeValues = list[tuple[ScopeID, "float | None"]]
ReleaseListener = Callable[[ScopeID], None]


class QueueGate(Protocol):
    """The interface between the scheduler queue (and downloader) and the manager."""

    @property
    def needs_head(self) -> bool:
        """Whether :meth:`check_scopes` needs the request at the head of the
        queue (the protocol's checks are per request) or the scopes suffice."""

    @property
    def quotas(self) -> Mapping[ScopeID, float]:
        """The quota of each configured quota scope (the queue orders by share)."""

    @property
    def clock(self) -> Callable[[], float]:
        """The monotonic clock of *now* in :meth:`check_scopes` and
        :meth:`reserve_scopes` (the manager's own clock)."""

    @property
    def wall_clock(self) -> Callable[[], float]:
        """The wall clock of ``throttling_delay`` deadlines and HTTP dates."""

    def resolve_scopes_now(
        self, request: Request
    ) -> RequestScopes | Deferred[RequestScopes]:
        """Resolve and persist the scopes of *request*, or a Deferred of them."""

    def check_scopes(
        self, scope_values: ScopeValues, now: float, head: Request | None = None
    ) -> tuple[float, ScopeID | None]:
        """``(wait, blocked)``: time until every time gate opens, and a scope
        whose concurrency blocks the request (``None`` if none)."""

    def reserve_scopes(
        self, request: Request, scope_values: ScopeValues, now: float
    ) -> None:
        """Record *request* as sent on its scopes."""

    def release(self, request: Request) -> None:
        """Free the reservation of *request* and tell the release listeners."""

    def get_request_delay(self, request: Request, now: float | None = None) -> float:
        """Remaining ``throttling_delay`` of *request*."""

    def get_slot_key(self, request: Request) -> str:
        """The scopes of *request* as one string (the downloader's slot key)."""

    def has_free_slot(self, scope_id: ScopeID) -> bool:
        """Whether *scope_id* has room for one more request now."""

    def add_release_listener(self, listener: ReleaseListener) -> None:
        """Call *listener* with a scope id whenever a slot of it may be free."""

    def remove_release_listener(self, listener: ReleaseListener) -> None:
        """Stop calling *listener*."""

    def add_timer_listener(self, listener: ReleaseListener) -> None:
        """Call *listener* with a scope id whenever a time gate of it opened
        sooner than :meth:`check_scopes` said (a cache hit gave its send
        back)."""

    def remove_timer_listener(self, listener: ReleaseListener) -> None:
        """Stop calling *listener*."""


#: One gate per crawler: the queue and the downloader must share it, since
#: the downloader's releases are what wakes the queue.
_GATES: weakref.WeakKeyDictionary[Crawler, QueueGate] = weakref.WeakKeyDictionary()


def queue_gate(
    crawler: Crawler, throttler: Any, *, releasing: bool = False
) -> QueueGate:
    """The :class:`QueueGate` of *throttler* (``crawler.throttler``).

    The downloader passes ``releasing=True``: it releases every request
    through the gate, so the queue hears of each freed slot. Without it (the
    plugin's queue with a downloader of Scrapy's own throttling, which
    releases through the manager), a request blocked by a protocol-only
    manager is looked at again every :data:`PROTOCOL_RECHECK_INTERVAL`.
    """
    gate = _GATES.get(crawler)
    if gate is None:
        from ._manager import ThrottlingManager

        gate = (
            throttler.queue_gate
            if isinstance(throttler, ThrottlingManager)
            else ProtocolManagerGate(throttler)
        )
        _GATES[crawler] = gate
    if releasing and isinstance(gate, ProtocolManagerGate):
        gate.releases_seen = True
    return gate
