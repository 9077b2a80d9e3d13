"""Per-scope stats at close, the adaptive-limit summary and the state log line.

The guide "Adapting Crawl Rate to Host Latency" ends on the diagnostic hook:
a host whose limit sits at the minimum for long periods is overloaded or has
a baseline that no longer fits, one pinned at the maximum has capacity you
chose not to use. The ``throttling/latency/...`` summary names them; the
``throttling/scopes/<scope>/...`` stats give a bounded set of scopes their
final limit and latency percentiles.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from scrapy.statscollectors import StatsCollector

    from ._scope_adapter import ScopeAdapter
    from ._scope_state import AdaptiveLimitState
    from ._timeline import ScopeTraffic
    from ._types import ScopeID

__all__ = [
    "choose_stats_scopes",
    "format_state",
    "set_latency_summary",
    "set_scope_stats",
]

# The extension's logger: these lines were always its own.
logger = logging.getLogger("scrapy_adaptive_throttle._diagnostics")

#: Scopes named in each periodic log line, and per stats list at close.
LISTED_SCOPES = 10
#: Configured scopes given per-scope stats at close, at most.
CONFIGURED_STATS_SCOPES = 50
#: A scope is "pinned" at a bound when at least this share of its latency
#: samples was taken there ...
PINNED_SHARE = 0.5
#: ... out of at least this many samples (fewer say nothing about a host).
PINNED_MIN_SAMPLES = 20


def choose_stats_scopes(
    configured: Iterable[ScopeID],
    traffic: ScopeTraffic,
    scopes: Mapping[ScopeID, ScopeAdapter],
    busiest: int,
) -> list[ScopeID]:
    """The configured scopes seen in the crawl (up to 50), then the *busiest*
    scopes by responses."""
    chosen = [
        scope
        for scope in list(configured)[:CONFIGURED_STATS_SCOPES]
        if scope in traffic.responses or scope in scopes
    ]
    for scope in traffic.top(busiest):
        if scope not in chosen:
            chosen.append(scope)
    return chosen


def set_scope_stats(
    stats: StatsCollector,
    scopes: Iterable[ScopeID],
    traffic: ScopeTraffic,
    limit_of: Callable[[ScopeID], int | None],
) -> None:
    """Responses, latency percentiles and final limit of *scopes*, as
    ``throttling/scopes/<scope>/<name>`` stats."""
    for scope in scopes:
        prefix = f"throttling/scopes/{scope}"
        stats.set_value(f"{prefix}/response_count", traffic.responses.get(scope, 0))
        histogram = traffic.latencies.get(scope)
        if histogram is not None:
            for name, value in zip(
                ("latency_p50", "latency_p90", "latency_p99"),
                histogram.percentiles(0.5, 0.9, 0.99),
                strict=True,
            ):
                if value is not None:
                    stats.set_value(f"{prefix}/{name}", round(value, 4))
        limit = limit_of(scope)
        if limit is not None:
            stats.set_value(f"{prefix}/limit", limit)


def set_latency_summary(
    stats: StatsCollector, adaptive: list[tuple[ScopeID, AdaptiveLimitState]]
) -> None:
    """The ``throttling/latency/...`` stats of the scopes with an adaptive
    limit: how many, how many with nothing to adapt, which were pinned at a
    bound for most of their samples."""
    if not adaptive:
        return
    fixed = [state for _, state in adaptive if state.ceiling <= state.floor]
    adapting = [
        (scope, state)
        for scope, state in adaptive
        if state.ceiling > state.floor and state.latency_samples >= PINNED_MIN_SAMPLES
    ]
    stats.set_value("throttling/latency/scope_count", len(adaptive))
    stats.set_value("throttling/latency/fixed_count", len(fixed))
    for bound in ("floor", "ceiling"):
        pinned = sorted(
            (
                (scope, state)
                for scope, state in adapting
                if _share_at(state, bound) >= PINNED_SHARE
            ),
            key=lambda item: item[1].latency_samples,
            reverse=True,
        )
        stats.set_value(f"throttling/latency/pinned_{bound}_count", len(pinned))
        if pinned:
            names = [str(scope) for scope, _ in pinned[:LISTED_SCOPES]]
            stats.set_value(f"throttling/latency/pinned_{bound}_scopes", names)
            logger.info(
                "Throttling: %d scope(s) spent most of the crawl with their "
                "concurrency limit at its %s: %s%s",
                len(pinned),
                bound,
                ", ".join(names),
                ", ..." if len(pinned) > len(names) else "",
            )


def _share_at(state: AdaptiveLimitState, bound: str) -> float:
    return state.at_floor_share if bound == "floor" else state.at_ceiling_share


def format_state(state: dict[str, Any]) -> str:
    """One scope's state in a few words, for the log."""
    parts = [f"{state.get('scope')}: limit {state.get('limit')}"]
    if "ceiling" in state:
        parts[0] += (
            f" ({state['limit_value']:.1f} in [{state['floor']}, {state['ceiling']}])"
        )
        best = state.get("best_latency")
        last = state.get("last_latency")
        if best is not None:
            parts.append(f"best {best * 1000:.0f} ms")
        if last is not None:
            parts.append(f"last {last * 1000:.0f} ms")
    parts.append(f"in flight {state.get('in_flight')}")
    delay = state.get("delay")
    if delay:
        parts.append(f"delay {delay:.3g} s")
    if state.get("backoff_level"):
        parts.append(
            f"backoff level {state['backoff_level']} "
            f"(wait {state.get('backoff_wait', 0.0):.3g} s)"
        )
    return ", ".join(parts)
