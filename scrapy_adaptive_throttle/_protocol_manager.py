"""A :setting:`THROTTLING_MANAGER` other than the plugin's: the one place
that asks it which optional methods it has.

Only :data:`REQUIRED_MANAGER_METHODS` of
:class:`~scrapy_adaptive_throttle.ThrottlingManagerProtocol` are required;
what the add-on uses of the rest, and how it reads a manager that lacks it,
is here:

- at start-up, :func:`is_protocol_manager` tells a manager class from one
  that only resolves scopes, which :func:`manager_with_resolver` plugs into
  the default manager as its scope resolver;
- :class:`ProtocolManagerGate` is the scheduler queue's
  :class:`~scrapy_adaptive_throttle._queue_gate.QueueGate` built from the
  protocol's request-level methods;
- the ``read_*`` functions are what the diagnostics read of it (through
  ``_throttler_view.py``): what it lacks reads as empty.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from scrapy.utils.misc import build_from_crawler

from ._clock import MONOTONIC_CLOCK, WALL_CLOCK
from ._containment import validate_scopes
from ._types import RESOLVED_SCOPES_META_KEY, RequestScopes, ScopeID

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from twisted.internet.defer import Deferred

    from ._queue_gate import ReleaseListener, ScopeValues

logger = logging.getLogger(__name__)

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


def is_protocol_manager(cls: type) -> bool:
    """Whether the :setting:`THROTTLING_MANAGER` class *cls* is a manager
    (it has ``acquire``), not a scope resolver."""
    return hasattr(cls, "acquire")


def manager_with_resolver(base: type, resolver_cls: type, crawler: Crawler) -> Any:
    """A *base* manager whose scopes come from a *resolver_cls* instance (its
    ``get_request_scopes``, else its ``get_scopes``).

    :raises ValueError: if *resolver_cls* has neither.
    """
    resolver = (
        build_from_crawler(resolver_cls, crawler)
        if hasattr(resolver_cls, "from_crawler")
        else resolver_cls()
    )
    namespace: dict[str, Any] = {}
    if hasattr(resolver, "get_request_scopes"):
        namespace["get_request_scopes"] = lambda self, request: (
            resolver.get_request_scopes(request)
        )
    elif hasattr(resolver, "get_scopes"):

        async def get_scopes(self: Any, request: Request) -> Any:
            return await resolver.get_scopes(request)

        namespace["get_scopes"] = get_scopes
    else:
        raise ValueError(
            f"Invalid THROTTLING_MANAGER value {resolver_cls!r}: it implements "
            "neither the throttling manager protocol (acquire, release, ...) nor "
            "get_request_scopes() / get_scopes()"
        )
    combined = type(f"{resolver_cls.__name__}Manager", (base,), namespace)
    manager = combined(crawler)
    manager.scope_resolver = resolver
    return manager


# -- what the diagnostics read ---------------------------------------------------


def read_scope_managers(throttler: Any) -> Mapping[ScopeID, Any] | None:
    """The manager's ``_scope_managers`` (the attribute the protocol lists for
    the pull request's manager), ``None`` without one."""
    managers = getattr(throttler, "_scope_managers", None)
    return managers if isinstance(managers, Mapping) else None


def read_scope_states(throttler: Any) -> list[dict[str, Any]]:
    """The manager's ``iter_scope_states()``, empty without it."""
    iter_states = getattr(throttler, "iter_scope_states", None)
    if iter_states is None:
        return []
    states: Iterable[dict[str, Any]] = iter_states()
    return list(states)


def read_clock(throttler: Any) -> Callable[[], float] | None:
    """The manager's ``clock``, ``None`` without one."""
    clock: Callable[[], float] | None = getattr(throttler, "clock", None)
    return clock


def read_configured_scopes(throttler: Any) -> Iterable[ScopeID]:
    """The scopes of the manager's ``config``, empty without one."""
    config = getattr(throttler, "config", None)
    scopes: Iterable[ScopeID] = config.scopes if config else ()
    return scopes


def read_request_scopes(throttler: Any, request: Request) -> RequestScopes | None:
    """The manager's ``get_request_scopes(request)``, ``None`` without it."""
    get_scopes = getattr(throttler, "get_request_scopes", None)
    if get_scopes is None:
        return None
    scopes: RequestScopes = get_scopes(request)
    return scopes
