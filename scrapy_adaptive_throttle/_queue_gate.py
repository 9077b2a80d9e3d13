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
``reserve``, ``release``). It is the one place that
looks for optional methods of a custom manager.
"""

from __future__ import annotations

import logging
import weakref
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ._clock import MONOTONIC_CLOCK, WALL_CLOCK
from ._containment import validate_scopes
from ._types import RESOLVED_SCOPES_META_KEY, RequestScopes, ScopeID

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from twisted.internet.defer import Deferred

logger = logging.getLogger(__name__)

ScopeValues = list[tuple[ScopeID, "float | None"]]
ReleaseListener = Callable[[ScopeID], None]

#: The methods of ThrottlingManagerProtocol without which the add-on cannot
#: throttle: a THROTTLING_MANAGER lacking one fails at start-up, not at its
#: first request. The others are used when present (see ProtocolManagerGate).
REQUIRED_MANAGER_METHODS = (
    "get_scopes",
    "acquire",
    "release",
    "process_response",
    "process_exception",
)
#: What the scheduler queue needs to hand out only sendable requests.
QUEUE_CHECK_METHODS = ("is_ready", "get_time_until_ready", "reserve")

#: The scope a protocol-only manager's request waits on when it has no
#: scope: woken by every release.
ANY_SCOPE: ScopeID = "\x00any"

#: How long a request blocked by a protocol-only manager waits before it is
#: looked at again when no request in flight can free its slot (the
#: manager's reasons are its own: nothing tells the queue when they end).
PROTOCOL_RECHECK_INTERVAL = 0.25


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


def missing_manager_methods(cls: type) -> list[str]:
    """The methods of :data:`REQUIRED_MANAGER_METHODS` that *cls* lacks."""
    return [
        name
        for name in REQUIRED_MANAGER_METHODS
        if not callable(getattr(cls, name, None))
    ]


class ProtocolManagerGate:
    """:class:`QueueGate` for a manager written only to the documented protocol.

    The protocol answers per request: ``is_ready`` (every gate open),
    ``get_time_until_ready`` (how long the time gates stay closed, ``None``
    if they are open). A request that is not ready with no time to wait is
    blocked by concurrency: it waits for a slot of its busiest scope (by
    ``get_scope_load``) to be released, or, when no request in flight
    could free that slot, is looked at again after
    :data:`PROTOCOL_RECHECK_INTERVAL`, so that a crawl never hangs on a
    manager whose reasons the queue cannot see.

    Only :data:`REQUIRED_MANAGER_METHODS` are required. Without
    ``is_ready``, ``get_time_until_ready`` or ``reserve`` the queue hands
    requests out in order and the manager's ``acquire`` holds them at the
    downloader gate (head-of-line blocking, said once at start-up); without
    ``get_request_delay`` there is no per-request delay, and without
    ``get_slot_key`` the slot key is the request's scopes joined by ``+``.
    """

    needs_head = True

    def __init__(self, throttler: Any) -> None:
        self.throttler = throttler
        #: Whether every release goes through :meth:`release` (the plugin's
        #: downloader), so that waiting for one is safe.
        self.releases_seen = False
        self.quotas: Mapping[ScopeID, float] = {}
        # The protocol has no clock: the defaults of the plugin's manager.
        self.clock: Callable[[], float] = MONOTONIC_CLOCK
        self.wall_clock: Callable[[], float] = WALL_CLOCK
        self._release = throttler.release
        # Optional: the queue's checks, the per-request delay, the slot key
        # and the scope load (which picks the scope to wait on); a manager
        # of the plugin's kind may also resolve scopes without a coroutine.
        self._is_ready = getattr(throttler, "is_ready", None)
        self._time_until_ready = getattr(throttler, "get_time_until_ready", None)
        self._reserve = getattr(throttler, "reserve", None)
        self.checks = not any(
            getattr(throttler, name, None) is None for name in QUEUE_CHECK_METHODS
        )
        if not self.checks:
            logger.warning(
                "THROTTLING_MANAGER %s has no %s: the throttling-aware scheduler "
                "queue cannot tell which requests are sendable, so requests wait "
                "at the downloader gate (acquire) and a throttled scope may hold "
                "back others (head-of-line blocking).",
                _name(throttler),
                " / ".join(QUEUE_CHECK_METHODS),
            )
        self._request_delay = getattr(throttler, "get_request_delay", None)
        self._slot_key = getattr(throttler, "get_slot_key", None)
        self._scope_load = getattr(throttler, "get_scope_load", None)
        self._resolve_now = getattr(throttler, "resolve_scopes_now", None)
        self._listeners: list[ReleaseListener] = []
        self._reserved: dict[Request, list[ScopeID]] = {}
        self._in_flight: defaultdict[ScopeID, int] = defaultdict(int)

    def resolve_scopes_now(
        self, request: Request
    ) -> RequestScopes | Deferred[RequestScopes]:
        if self._resolve_now is not None:
            return self._resolve_now(request)  # type: ignore[no-any-return]
        return resolve_with_get_scopes(self.throttler, request)

    def get_request_delay(self, request: Request, now: float | None = None) -> float:
        if self._request_delay is None:
            return 0.0
        return float(self._request_delay(request))

    def get_slot_key(self, request: Request) -> str:
        if self._slot_key is not None:
            return str(self._slot_key(request))
        return "+".join(sorted(_scope_ids(request.meta.get(RESOLVED_SCOPES_META_KEY))))

    def check_scopes(
        self, scope_values: ScopeValues, now: float, head: Request | None = None
    ) -> tuple[float, ScopeID | None]:
        assert head is not None, "ProtocolManagerGate needs the head request"
        if not self.checks:
            return 0.0, None  # acquire() holds it at the downloader gate
        assert self._is_ready is not None
        assert self._time_until_ready is not None
        if self._is_ready(head):
            return 0.0, None
        wait = self._time_until_ready(head) or 0.0
        if wait > 0:
            return wait, None
        scope = self._busiest(scope_values)
        if not self.releases_seen or not self._in_flight.get(scope):
            # Nothing in flight will free it: look again soon instead.
            return PROTOCOL_RECHECK_INTERVAL, None
        return 0.0, scope

    def _busiest(self, scope_values: ScopeValues) -> ScopeID:
        if not scope_values:
            return ANY_SCOPE
        if len(scope_values) == 1 or self._scope_load is None:
            return scope_values[0][0]
        loads = {scope: self._scope_load(scope) for scope, _ in scope_values}
        return max(loads, key=loads.__getitem__)

    def reserve_scopes(
        self, request: Request, scope_values: ScopeValues, now: float
    ) -> None:
        if not self.checks or self._reserve is None:
            return  # acquire() reserves it at the downloader gate
        self._reserve(request)
        scopes = [scope for scope, _ in scope_values] or [ANY_SCOPE]
        self._reserved[request] = scopes
        for scope in scopes:
            self._in_flight[scope] += 1

    def release(self, request: Request) -> None:
        self._release(request)
        scopes = self._reserved.pop(request, None)
        if scopes is None:
            # Sent through the gate middleware (acquire), not the queue.
            scopes = _scope_ids(request.meta.get(RESOLVED_SCOPES_META_KEY))
        else:
            in_flight = self._in_flight
            for scope in scopes:
                in_flight[scope] -= 1
                if in_flight[scope] <= 0:
                    del in_flight[scope]
        for listener in self._listeners:
            for scope in scopes:
                listener(scope)
            listener(ANY_SCOPE)

    def has_free_slot(self, scope_id: ScopeID) -> bool:
        if self._scope_load is None or scope_id == ANY_SCOPE:
            return True
        try:
            return float(self._scope_load(scope_id)) < 1.0
        except Exception:  # reported when a request meets it
            return True

    def add_release_listener(self, listener: ReleaseListener) -> None:
        self._listeners.append(listener)

    def remove_release_listener(self, listener: ReleaseListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def add_timer_listener(self, listener: ReleaseListener) -> None:
        # The protocol has no refunds: its time gates open when they said.
        pass

    def remove_timer_listener(self, listener: ReleaseListener) -> None:
        pass


def _name(component: object) -> str:
    cls = type(component)
    return f"{cls.__module__}.{cls.__qualname__}"


def _scope_ids(scopes: RequestScopes) -> list[ScopeID]:
    if scopes is None:
        return []
    if isinstance(scopes, str):
        return [scopes]
    return list(scopes.keys() if isinstance(scopes, dict) else scopes)


def resolve_with_get_scopes(
    throttler: Any, request: Request
) -> RequestScopes | Deferred[RequestScopes]:
    """Resolve *request*'s scopes with the protocol's ``get_scopes``: its
    result at once when it does not really await, else a Deferred."""
    coroutine = throttler.get_scopes(request)
    try:
        coroutine.send(None)
    except StopIteration as stop:
        scopes = validate_scopes(stop.value, request)
        request.meta[RESOLVED_SCOPES_META_KEY] = scopes
        return scopes
    coroutine.close()
    from scrapy.utils.defer import deferred_from_coro

    async def resolve() -> RequestScopes:
        scopes = validate_scopes(await throttler.get_scopes(request), request)
        request.meta[RESOLVED_SCOPES_META_KEY] = scopes
        return scopes

    return deferred_from_coro(resolve())
