"""The progress line and the live gauges: one bounded pass over the scopes.

Every :setting:`LOGSTATS_INTERVAL`, :class:`~._diagnostics.ThrottlingDiagnostics`
surveys the live scopes (attribute reads, no copies: this runs over every
live scope, 100 000 in ``bench/observe_cost.py``), sets the
``throttling/live/...`` gauges and, with :setting:`THROTTLING_PROGRESS`, logs
the line built here.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._explain import REASONS, primary_reason, scope_wait_reasons

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from scrapy.statscollectors import StatsCollector

    from ._scope_adapter import ScopeAdapter
    from ._timeline import ScopeTraffic
    from ._types import ScopeID

__all__ = ["PROGRESS_SCOPES", "Survey", "format_progress", "set_gauges", "survey"]

#: Scopes named as the busiest in the progress line.
PROGRESS_SCOPES = 3


@dataclass
class Survey:
    """One pass over the live scopes: what the progress line and the gauges say."""

    scopes: int = 0
    in_flight: int = 0
    #: Scopes with requests waiting in the scheduler, by the reason they wait.
    held: dict[str, int] | None = None
    #: ``(in flight, scope, adapter)`` of the busiest scopes.
    busiest: list[tuple[int, ScopeID, ScopeAdapter]] | None = None
    longest_hold: float = 0.0
    longest_hold_scope: ScopeID | None = None
    scheduler_requests: int | None = None


def survey(
    scopes: Mapping[ScopeID, ScopeAdapter], pending: Iterable[ScopeID], now: float
) -> Survey:
    """Survey the live *scopes* at *now*; *pending* are the scopes with
    requests waiting in the scheduler (whose wait reasons are counted)."""
    result = Survey(scopes=len(scopes), held=dict.fromkeys(REASONS, 0))
    assert result.held is not None
    in_flight = 0
    longest = 0.0
    longest_scope = None
    busy: list[tuple[int, ScopeID, ScopeAdapter]] = []
    # One pass of attribute reads: this runs over every live scope.
    for scope, adapter in scopes.items():
        active = adapter.in_flight
        if active:
            in_flight += active
            busy.append((active, scope, adapter))
        hold = _hold_until(adapter)
        if hold is not None and hold - now > longest:
            longest, longest_scope = hold - now, scope
    result.in_flight = in_flight
    result.longest_hold = longest
    result.longest_hold_scope = longest_scope
    result.busiest = heapq.nlargest(PROGRESS_SCOPES, busy, key=lambda item: item[0])
    for scope in pending:
        pending_adapter = scopes.get(scope)
        if pending_adapter is None:
            continue
        reason = primary_reason(scope_wait_reasons(pending_adapter, now))
        if reason is not None:
            result.held[reason] = result.held.get(reason, 0) + 1
    return result


def _hold_until(adapter: ScopeAdapter) -> float | None:
    """When the server-given hold of a default scope manager ends (``None``
    for a custom one, which does not say)."""
    scope = adapter.scope
    return scope.backoff.hold_until if scope is not None else None


def set_gauges(stats: StatsCollector, survey: Survey) -> None:
    """Set the ``throttling/live/...`` gauge stats from *survey*."""
    stats.set_value("throttling/live/scopes", survey.scopes)
    stats.set_value("throttling/live/in_flight", survey.in_flight)
    held = survey.held or {}
    stats.set_value("throttling/live/held_scopes", sum(held.values()))
    for reason, count in held.items():
        stats.set_value(f"throttling/live/held/{reason}", count)
    stats.set_value("throttling/live/longest_hold", round(survey.longest_hold, 3))
    if survey.scheduler_requests is not None:
        stats.set_value("throttling/live/scheduler_requests", survey.scheduler_requests)


def format_progress(
    survey: Survey, traffic: ScopeTraffic, scopes: Mapping[ScopeID, ScopeAdapter]
) -> str:
    """The progress line (one line, a few hundred characters at most)."""
    from ._decisions import last_backoff_cause

    parts = [f"Throttling: {survey.scopes} scope(s), {survey.in_flight} in flight"]
    held = {reason: n for reason, n in (survey.held or {}).items() if n}
    if held:
        parts.append(
            f"{sum(held.values())} holding requests back ("
            + ", ".join(f"{reason}={n}" for reason, n in held.items())
            + ")"
        )
    else:
        parts.append("none holding requests back")
    if survey.busiest:
        described = []
        for active, scope, adapter in survey.busiest:
            limit = adapter.limit
            text = f"{scope} ({active}/{'-' if limit is None else limit} in flight"
            histogram = traffic.latencies.get(scope)
            if histogram is not None:
                (p50,) = histogram.percentiles(0.5)
                if p50 is not None:
                    text += f", p50 {p50 * 1000:.0f} ms"
            described.append(text + ")")
        parts.append("busiest: " + ", ".join(described))
    if survey.longest_hold_scope is not None:
        held_adapter = scopes.get(survey.longest_hold_scope)
        cause = (
            last_backoff_cause(held_adapter.manager)
            if held_adapter is not None
            else None
        )
        parts.append(
            f"longest server hold {survey.longest_hold:.1f}s on "
            f"{survey.longest_hold_scope}" + (f" ({cause})" if cause else "")
        )
    if survey.scheduler_requests is not None:
        parts.append(f"{survey.scheduler_requests} request(s) in the scheduler")
    return "; ".join(parts)
