"""The one seam between the manager and a scope manager.

Scope managers are pluggable (:setting:`THROTTLING_SCOPE_MANAGER`, a
scope's ``"manager"``): only ``can_send``, ``record_sent`` and
``record_done`` are required, every other method is optional and has a
default. :class:`ScopeAdapter` wraps each scope manager once, when the
registry creates it, and is the only place that asks a scope manager what it
implements (``getattr``, and signature checks for keyword arguments that
older custom scope managers lack). The rest of the wiring calls typed
methods with those defaults built in.

Methods are looked up at each call, not once at wrapping time, so that a
scope manager whose methods change after creation (a test double, a patched
instance) behaves as it did before the adapter existed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ._scope import Scope
from ._types import ScopeID, ThrottlingScopeManagerProtocol

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from twisted.internet.defer import Deferred

    from ._scope_state import ScopeState

__all__ = ["ScopeAdapter", "build_scope_manager"]


def build_scope_manager(
    cls: type, crawler: Crawler, config: dict[str, Any]
) -> ThrottlingScopeManagerProtocol:
    """A scope manager of class *cls* for the scope entry *config*: with its
    ``from_crawler`` when it has one (the protocol's), else ``cls(crawler,
    config)``."""
    if hasattr(cls, "from_crawler"):
        manager = cls.from_crawler(crawler, config)
    else:
        manager = cls(crawler, config)
    return cast(ThrottlingScopeManagerProtocol, manager)


class ScopeAdapter:
    """A scope manager, with a default for each optional method.

    :param scope_id: the scope it holds the state of.
    :param manager: the scope manager, a
        :class:`~scrapy_adaptive_throttle.ThrottlingScopeManager` or any
        object with the required methods of the scope-manager protocol.
    """

    __slots__ = ("__weakref__", "manager", "refunds", "scope_id")

    def __init__(self, scope_id: ScopeID, manager: ThrottlingScopeManagerProtocol):
        self.scope_id = scope_id
        #: The wrapped scope manager, as
        #: :meth:`~scrapy_adaptive_throttle.ThrottlingManager.get_scope_manager`
        #: returns it.
        self.manager = manager
        from ._scope_manager import ThrottlingScopeManager

        #: Whether a send's time gates can be given back (``refund_send``,
        #: a request answered from the HTTP cache) or counted from a later
        #: time (``restamp_send``): only the built-in scope managers can.
        self.refunds = isinstance(manager, ThrottlingScopeManager)

    def _optional(self, name: str) -> Callable[..., Any] | None:
        method: Callable[..., Any] | None = getattr(self.manager, name, None)
        return method

    # -- required -------------------------------------------------------------

    def can_send(self, now: float, amount: float | None) -> float:
        """Seconds until a request consuming *amount* may be sent."""
        return self.manager.can_send(now, amount)

    def record_sent(self, now: float, amount: float | None) -> None:
        self.manager.record_sent(now, amount)

    def record_done(self, now: float) -> None:
        self.manager.record_done(now)

    # -- concurrency and waiting ----------------------------------------------

    def concurrency_blocked(self) -> bool:
        """Whether the scope is at its concurrency limit (``False`` when the
        scope manager cannot say)."""
        blocked = self._optional("concurrency_blocked")
        return bool(blocked()) if blocked is not None else False

    def is_idle(self, now: float, max_idle: float) -> bool:
        """Whether the scope's state may be evicted (without ``is_idle``:
        when nothing of it is in flight)."""
        is_idle = self._optional("is_idle")
        if is_idle is not None:
            return bool(is_idle(now, max_idle))
        return not self.in_flight

    def get_load(self) -> float:
        get_load = self._optional("get_load")
        return float(get_load()) if get_load is not None else 0.0

    def slot_event(self) -> Deferred[None] | None:
        """A Deferred fired when a slot may be free, or ``None`` when the
        scope manager has none (its waiters then poll)."""
        slot_event = self._optional("slot_event")
        if slot_event is None:
            return None
        event: Deferred[None] = slot_event()
        return event

    def discard_slot_event(self, event: Deferred[None]) -> None:
        discard = self._optional("discard_slot_event")
        if discard is not None:
            discard(event)

    def wake_waiter(self) -> None:
        """Hand a freed slot to the next waiter, if the scope has room."""
        wake = self._optional("wake_waiter")
        if wake is not None and not self.concurrency_blocked():
            wake()

    def shared_check(self) -> tuple[ScopeID, int | None, int, float]:
        """What the shared state needs to admit a request of this scope:
        ``(scope, concurrency limit, in flight, spacing of the next send)``."""
        next_spacing = self._optional("next_spacing")
        spacing = next_spacing() if next_spacing is not None else 0.0
        return (
            self.scope_id,
            self.limit,
            self.in_flight,
            float(spacing),
        )

    def shared_quota(self) -> tuple[float, float] | None:
        """``(quota, window)`` of the scope's quota, spent from one window
        shared by every process (:setting:`THROTTLING_STATE_URL`); ``None``
        when the scope has no quota (or its scope manager does not say)."""
        shared_quota = self._optional("shared_quota")
        if shared_quota is None:
            return None
        quota: tuple[float, float] | None = shared_quota()
        return quota

    def refund_send(self, sent_at: float, now: float, amount: float | None) -> bool:
        """Give back a send answered from the cache; whether a time gate of
        the scope opened sooner for it."""
        if not self.refunds:
            return False
        return bool(self.manager.refund_send(sent_at, now, amount))  # type: ignore[attr-defined]

    def restamp_send(self, sent_at: float, now: float) -> None:
        """Count the delay of the send at *sent_at* from *now*, when its
        request reached the downloader (built-in scope managers only)."""
        if self.refunds:
            self.manager.restamp_send(sent_at, now)  # type: ignore[attr-defined]

    # -- outcomes ---------------------------------------------------------------

    def record_response(self, latency: float | None, status: int, now: float) -> None:
        record = self._optional("record_response")
        if record is not None:
            record(latency, status, now)

    def record_rate_limited(
        self, now: float, sent_at: float | None, *, again: bool = False
    ) -> None:
        """Report a 429; *again* (a retry refused again) is dropped for a
        scope manager that predates the argument, which learns from it as
        from any other refusal."""
        record = self._optional("record_rate_limited")
        if record is None:
            return
        if again and _accepts_keyword(record, "refused_before"):
            record(now, sent_at, refused_before=True)
        else:
            record(now, sent_at)

    def reconcile_quota(
        self, consumed: float | None, remaining: float | None, now: float
    ) -> None:
        reconcile = self._optional("reconcile_quota")
        if reconcile is not None:
            reconcile(consumed=consumed, remaining=remaining, now=now)

    def backs_off(self) -> bool:
        """Whether the scope manager takes backoff at all."""
        return self._optional("record_backoff") is not None

    def record_backoff(
        self, delay: float | None, now: float, *, cap: bool = True
    ) -> bool:
        """Apply a backoff trigger; ``False`` if the scope manager never
        backs off. *cap* ``False`` (a trusted delay) is dropped for a scope
        manager that predates the argument."""
        record_backoff = self._optional("record_backoff")
        if record_backoff is None:
            return False
        if not cap and _accepts_keyword(record_backoff, "cap"):
            record_backoff(delay=delay, now=now, cap=False)
        else:
            record_backoff(delay=delay, now=now)
        return True

    def backoff_wait(self, now: float) -> float:
        """How long the scope waits after its last backoff trigger (without
        ``backoff_wait``: how long its time gates are closed)."""
        read = self._optional("backoff_wait") or self.manager.can_send
        return float(read(now))

    # -- delay and limits ---------------------------------------------------------

    def get_base_delay(self) -> float:
        getter = self._optional("get_base_delay")
        return float(getter()) if getter is not None else 0.0

    def set_base_delay(self, delay: float, *, only_increase: bool = True) -> None:
        """Set the base delay.

        :raises TypeError: if the scope manager cannot change its delay.
        """
        set_base_delay = self._optional("set_base_delay")
        if set_base_delay is None:
            raise TypeError(
                f"The scope manager of {self.scope_id!r} "
                f"({type(self.manager).__name__}) has no set_base_delay(): its "
                "delay cannot be changed"
            )
        if not only_increase and _accepts_keyword(set_base_delay, "only_increase"):
            set_base_delay(delay, only_increase=False)
        else:  # e.g. the reference chapter's FixedWindowScopeManager
            set_base_delay(delay)

    def apply_crawl_delay(self, delay: float | None, concurrency: int | None) -> None:
        """Apply a robots.txt Crawl-delay: *delay* as base delay and floor,
        *concurrency* as limit (``None``: kept), with whichever setters the
        scope manager has."""
        if delay is not None:
            setter = self._optional("set_base_delay")
            if setter is not None:
                setter(delay)
            floor = self._optional("set_delay_floor")
            if floor is not None:
                floor(delay)
        if concurrency is not None:
            set_concurrency = self._optional("set_concurrency")
            if set_concurrency is not None:
                set_concurrency(concurrency)

    # -- observation ----------------------------------------------------------------
    # Read-only: diagnostics, explain and stats read scopes only through these.

    @property
    def scope(self) -> Scope | None:
        """The scope object of a default scope manager (its delay gate,
        backoff, quota and concurrency limit), ``None`` for a custom one."""
        scope = getattr(self.manager, "scope", None)
        return scope if isinstance(scope, Scope) else None

    @property
    def in_flight(self) -> int:
        """Requests of the scope in flight (0 when the scope manager has no
        ``active``)."""
        return int(getattr(self.manager, "active", 0))

    @property
    def limit(self) -> int | None:
        """The concurrency limit enforced now (``None``: none, or the scope
        manager has no ``concurrency``)."""
        limit: int | None = getattr(self.manager, "concurrency", None)
        return limit

    @property
    def reports_state(self) -> bool:
        """Whether the scope manager has a ``get_state`` snapshot of its own."""
        return self._optional("get_state") is not None

    def scope_state(self, now: float) -> ScopeState | None:
        """The typed snapshot of a scope manager built on a scope object
        (``None`` for any other: read :meth:`get_state`)."""
        read = self._optional("scope_state")
        if read is None or self.scope is None:
            return None
        state: ScopeState = read(now)
        return state

    def get_state(self, now: float) -> dict[str, Any]:
        """A snapshot of the scope's state (the scope and the class name
        when the scope manager has no ``get_state``)."""
        getter = self._optional("get_state")
        if getter is not None:
            return dict(getter(now))
        return {"scope": self.scope_id, "manager": type(self.manager).__name__}


def _accepts_keyword(method: Callable[..., Any], name: str) -> bool:
    try:
        parameters = inspect.signature(method).parameters
    except (TypeError, ValueError):  # no introspectable signature: assume so
        return True
    return name in parameters or any(
        parameter.kind is inspect.Parameter.VAR_KEYWORD
        for parameter in parameters.values()
    )
