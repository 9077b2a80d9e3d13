"""Why is this request waiting? The answer, scope by scope.

A request leaves the scheduler only when every one of its scopes allows it.
Each scope can hold it back for one of a few reasons, each with its own
remedy, so the answer names the reason and not only the wait:

* ``"backoff_hold"``: a hold imposed by the server (``Retry-After``,
  ``RateLimit-*``) or by
  :meth:`~scrapy_adaptive_throttle.ThrottlingManager.delay_scope`; nothing is
  sent before it ends.
* ``"backoff"``: the spacing between sends grew after backoff triggers and
  shrinks again after quiet windows.
* ``"crawl_delay"``: the spacing is robots.txt's ``Crawl-delay``.
* ``"delay"``: the spacing is the scope's own delay.
* ``"quota"``: the scope's quota for the current window is used up.
* ``"concurrency"``: the scope has as many requests in flight as its limit
  allows; it waits for one of them, not for a time.

Reading the state never changes it: no scope manager is created, and no
backoff recovers because somebody looked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy import Request

from ._meta_keys import (
    DELAY_DEADLINE_META_KEY,
    DELAY_META_KEY,
    DELAYED_META_KEY,
    RESOLVED_SCOPES_META_KEY,
)
from ._types import ScopeID, iter_scope_values

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._manager import ThrottlingManager
    from ._scope import Scope
    from ._scope_adapter import ScopeAdapter

__all__ = ["Explanation", "ScopeExplanation", "explain", "scope_wait_reasons"]

#: The reasons to wait, most to least imposed from outside: when two gates
#: are closed for the same time, the first one named is the one to act on.
REASONS = ("backoff_hold", "backoff", "crawl_delay", "delay", "quota", "concurrency")


@dataclass(frozen=True)
class ScopeExplanation:
    """What one scope says about sending a request now."""

    #: The scope id.
    scope: ScopeID
    #: The reason that holds the request back the longest (one of
    #: ``"backoff_hold"``, ``"backoff"``, ``"crawl_delay"``, ``"delay"``,
    #: ``"quota"``, ``"concurrency"``), ``"other"`` for a custom scope manager
    #: that does not say, or ``None`` when this scope allows the request now.
    reason: str | None
    #: Seconds until the time gates of the scope open (0.0: open now; a scope
    #: held only by ``"concurrency"`` waits for a response, not for a time).
    wait: float
    #: Every closed gate and its wait in seconds (0.0 for ``"concurrency"``).
    reasons: dict[str, float]
    #: The concurrency limit enforced now (``None``: none).
    limit: int | None
    #: Requests of the scope in flight.
    in_flight: int
    #: The spacing between two sends now, in seconds (grown by backoff).
    delay: float
    #: The backoff level (0: not backed off).
    backoff_level: int
    #: What caused the last backoff of the scope (e.g. ``"status/429"``,
    #: ``"exception/..."``, ``"delay_scope"``) and the header that gave its
    #: hold, if any (e.g. ``"Retry-After: 30"``); ``None`` if it never backed off.
    backoff_cause: str | None
    #: Whether a scope manager exists for the scope (``False``: no request of
    #: it was seen yet, or its idle state was evicted; it would be created
    #: from its configuration).
    known: bool
    #: The scope manager's full :meth:`get_state` snapshot.
    state: dict[str, Any] = field(repr=False)

    def __str__(self) -> str:
        limit = "no limit" if self.limit is None else f"limit {self.limit}"
        head = f"{self.scope}: in flight {self.in_flight}/{limit}"
        if not self.known:
            return f"{self.scope}: no state yet (it would start from its configuration)"
        if self.reason is None:
            return f"{head}; ready"
        waits = []
        for reason, wait in self.reasons.items():
            if reason == "concurrency":
                waits.append(f"concurrency {self.in_flight}/{self.limit}")
            else:
                waits.append(f"{reason} {wait:.3g}s")
        text = f"{head}; waiting: {', '.join(waits)}"
        if self.backoff_cause and (
            "backoff_hold" in self.reasons or "backoff" in self.reasons
        ):
            text += f" (backoff caused by {self.backoff_cause})"
        return text


@dataclass(frozen=True, repr=False)
class Explanation:
    """Why a request (or a scope) waits: the answer of
    :meth:`~scrapy_adaptive_throttle.ThrottlingManager.explain`.

    Its ``repr`` is the readable text (what the telnet console shows); read
    the fields for the details.
    """

    #: The request explained, or ``None`` when a scope was.
    request: Request | None
    #: One answer per scope of the request.
    scopes: tuple[ScopeExplanation, ...]
    #: Seconds left of the request's own :reqmeta:`throttling_delay`.
    request_delay: float = 0.0

    @property
    def ready(self) -> bool:
        """Whether every scope would let the request go now."""
        return self.request_delay <= 0 and all(s.reason is None for s in self.scopes)

    @property
    def wait(self) -> float:
        """Seconds until every time gate opens (concurrency aside)."""
        return max([self.request_delay, *(s.wait for s in self.scopes)])

    @property
    def reasons(self) -> dict[ScopeID, str]:
        """``{scope: reason}`` for the scopes that hold the request back."""
        return {s.scope: s.reason for s in self.scopes if s.reason is not None}

    def __str__(self) -> str:
        subject = self.request.url if self.request is not None else "scope"
        lines = [f"{subject}: {'ready' if self.ready else 'waiting'}"]
        if self.request_delay > 0:
            lines.append(f"  throttling_delay: {self.request_delay:.3g}s left")
        lines.extend(f"  {scope}" for scope in self.scopes)
        return "\n".join(lines)

    __repr__ = __str__


def scope_wait_reasons(
    adapter: ScopeAdapter, now: float, amount: float | None = None
) -> dict[str, float]:
    """``{reason: seconds}`` for each gate of the scope of *adapter* that is
    closed at *now*.

    Reads the default scope managers' state without changing it; any other
    scope manager is asked through its protocol (``can_send``,
    ``concurrency_blocked``) and answers ``"other"``.
    """
    scope = adapter.scope
    if scope is not None:
        reasons = _time_gate_reasons(scope, now, amount)
    else:
        wait = float(adapter.can_send(now, amount))
        reasons = {"other": wait} if wait > 0 else {}
    if adapter.concurrency_blocked():
        reasons["concurrency"] = 0.0
    return reasons


def _time_gate_reasons(
    scope: Scope, now: float, amount: float | None
) -> dict[str, float]:
    """``{reason: seconds}`` for each time gate of *scope* closed at *now*."""
    reasons: dict[str, float] = {}
    backoff = scope.backoff
    hold = backoff.hold_until - now
    if hold > 0:
        reasons["backoff_hold"] = hold
    spacing = scope.gate.next_send_at - now
    if spacing > 0:
        if backoff.level:
            reasons["backoff"] = spacing
        elif 0 < backoff.base_delay <= scope.gate.floor:
            reasons["crawl_delay"] = spacing
        else:
            reasons["delay"] = spacing
    quota = scope.quota
    if quota is not None:
        # QuotaWindow.wait would roll the window forward; reading changes nothing.
        quota_wait = quota.peek_wait(now, amount)
        if quota_wait > 0:
            reasons["quota"] = quota_wait
    return reasons


def primary_reason(reasons: dict[str, float]) -> str | None:
    """The reason that holds the longest (ties: the most external one)."""
    if not reasons:
        return None
    order = {reason: index for index, reason in enumerate(REASONS)}
    return max(reasons, key=lambda r: (reasons[r], -order.get(r, len(order))))


def explain_scope(
    throttler: ThrottlingManager,
    scope_id: ScopeID,
    amount: float | None = None,
    now: float | None = None,
) -> ScopeExplanation:
    """The answer of one scope (see :func:`explain`)."""
    from ._decisions import last_backoff_cause

    if now is None:
        now = throttler.clock()
    adapter = throttler.scope_adapters().get(scope_id)
    if adapter is None:
        return ScopeExplanation(
            scope=scope_id,
            reason=None,
            wait=0.0,
            reasons={},
            limit=throttler.config.scope(scope_id).concurrency,
            in_flight=0,
            delay=throttler.config.scope(scope_id).delay,
            backoff_level=0,
            backoff_cause=None,
            known=False,
            state={},
        )
    reasons = scope_wait_reasons(adapter, now, amount)
    timed = [wait for reason, wait in reasons.items() if reason != "concurrency"]
    cause = last_backoff_cause(adapter.manager)
    typed = adapter.scope_state(now)
    if typed is not None:
        return ScopeExplanation(
            scope=scope_id,
            reason=primary_reason(reasons),
            wait=max(timed, default=0.0),
            reasons=reasons,
            limit=typed.limit,
            in_flight=typed.in_flight,
            delay=typed.delay,
            backoff_level=typed.backoff_level,
            backoff_cause=cause,
            known=True,
            state=typed.as_dict(),
        )
    state = adapter.get_state(now)
    return ScopeExplanation(
        scope=scope_id,
        reason=primary_reason(reasons),
        wait=max(timed, default=0.0),
        reasons=reasons,
        limit=state.get("limit", adapter.limit),
        in_flight=int(state.get("in_flight", adapter.in_flight)),
        delay=float(state.get("delay", 0.0)),
        backoff_level=int(state.get("backoff_level", 0)),
        backoff_cause=cause,
        known=True,
        state=state,
    )


def explain(
    throttler: ThrottlingManager, request_or_scope: Request | ScopeID
) -> Explanation:
    """Why *request_or_scope* waits, according to *throttler*.

    A :class:`~scrapy.Request` is explained scope by scope (its resolved
    scopes if it went through the scheduler, else the scopes
    :meth:`~scrapy_adaptive_throttle.ThrottlingManager.get_request_scopes`
    gives it); a scope id (a string) on its own.
    """
    now = throttler.clock()
    if isinstance(request_or_scope, Request):
        request = request_or_scope
        meta = request.meta
        if RESOLVED_SCOPES_META_KEY in meta:
            values = list(iter_scope_values(meta[RESOLVED_SCOPES_META_KEY]))
        else:
            values = list(iter_scope_values(throttler.get_request_scopes(request)))
        delay = _remaining_request_delay(request, throttler.wall_clock)
        return Explanation(
            request=request,
            scopes=tuple(
                explain_scope(throttler, scope, amount, now) for scope, amount in values
            ),
            request_delay=delay,
        )
    return Explanation(
        request=None, scopes=(explain_scope(throttler, request_or_scope, None, now),)
    )


def _remaining_request_delay(
    request: Request, wall_clock: Callable[[], float]
) -> float:
    # The deadline is a wall-clock time: it survives a JOBDIR restart.

    meta = request.meta
    if not meta.get(DELAY_META_KEY) or meta.get(DELAYED_META_KEY):
        return 0.0
    deadline = meta.get(DELAY_DEADLINE_META_KEY)
    if deadline is None:
        try:
            return max(0.0, float(meta[DELAY_META_KEY]))
        except (TypeError, ValueError):
            return 0.0
    return max(0.0, float(deadline) - wall_clock())
