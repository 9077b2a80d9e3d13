"""The diagnostic hook: scope states in the log and in the stats.

The guide "Adapting Crawl Rate to Host Latency" ends on it: export each
host's current limit and recent best latency, because a host whose limit sits
at the minimum for long periods is overloaded or has a baseline that no longer
fits, and one pinned at the maximum has capacity you chose not to use; neither
shows in aggregate pages per second. Every scope's state is readable at any
time through ``crawler.throttler.get_scope_state(scope)`` and
``iter_scope_states()``; this extension logs the busiest scopes periodically
with :setting:`THROTTLING_DEBUG`, and sums them up in stats when the spider
closes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.utils.asyncio import create_looping_call

from ._settings import ThrottlingSettings

if TYPE_CHECKING:
    from collections.abc import Iterable

    from scrapy.crawler import Crawler
    from typing_extensions import Self

__all__ = ["ThrottlingDiagnostics"]

logger = logging.getLogger(__name__)

#: Seconds between two logs of scope states with THROTTLING_DEBUG.
LOG_INTERVAL = 10.0
#: Scopes named in each periodic log line, and per stats list at close.
LISTED_SCOPES = 10
#: A scope is "pinned" at a bound when at least this share of its latency
#: samples was taken there ...
PINNED_SHARE = 0.5
#: ... out of at least this many samples (fewer say nothing about a host).
PINNED_MIN_SAMPLES = 20


class ThrottlingDiagnostics:
    """Log scope states with :setting:`THROTTLING_DEBUG`; sum them up in stats.

    Enabled by the add-on. At spider close it sets, for scopes with an
    adaptive limit (:class:`~scrapy_adaptive_throttle.LatencyScopeManager`):

    * ``throttling/latency/scope_count``: such scopes alive at close;
    * ``throttling/latency/pinned_floor_count`` and
      ``throttling/latency/pinned_floor_scopes`` (up to 10 ids, most sampled
      first): scopes whose limit sat at its floor for at least half of their
      latency samples;
    * ``throttling/latency/pinned_ceiling_count`` and
      ``throttling/latency/pinned_ceiling_scopes``: the same at the ceiling;
    * ``throttling/latency/fixed_count``: scopes whose ceiling equals their
      floor (nothing to adapt).
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.debug = ThrottlingSettings.from_crawler(crawler).debug
        self.task: Any = None
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def _states(self) -> list[dict[str, Any]]:
        throttler = getattr(self.crawler, "throttler", None)
        iter_states = getattr(throttler, "iter_scope_states", None)
        if iter_states is None:
            return []
        states: Iterable[dict[str, Any]] = iter_states()
        return list(states)

    def spider_opened(self) -> None:
        if self.debug:
            self.task = create_looping_call(self.log_states)
            self.task.start(LOG_INTERVAL, now=False)

    def log_states(self) -> None:
        """Log the busiest scopes (most requests in flight, then highest limit)."""
        states = self._states()
        if not states:
            return
        busiest = sorted(
            states,
            key=lambda state: (state.get("in_flight") or 0, state.get("limit") or 0),
            reverse=True,
        )[:LISTED_SCOPES]
        logger.info(
            "Throttling: %d live scope(s); busiest: %s",
            len(states),
            "; ".join(format_state(state) for state in busiest),
        )

    def spider_closed(self) -> None:
        if self.task is not None and self.task.running:
            self.task.stop()
        stats = self.crawler.stats
        if stats is None:
            return
        adaptive = [state for state in self._states() if "ceiling" in state]
        if not adaptive:
            return
        fixed = [s for s in adaptive if s["ceiling"] <= s["floor"]]
        adapting = [
            s
            for s in adaptive
            if s["ceiling"] > s["floor"]
            and s.get("latency_samples", 0) >= PINNED_MIN_SAMPLES
        ]
        stats.set_value("throttling/latency/scope_count", len(adaptive))
        stats.set_value("throttling/latency/fixed_count", len(fixed))
        for bound in ("floor", "ceiling"):
            share_key = f"at_{bound}_share"
            pinned = sorted(
                (s for s in adapting if s.get(share_key, 0.0) >= PINNED_SHARE),
                key=lambda state: state.get("latency_samples", 0),
                reverse=True,
            )
            stats.set_value(f"throttling/latency/pinned_{bound}_count", len(pinned))
            if pinned:
                names = [str(state["scope"]) for state in pinned[:LISTED_SCOPES]]
                stats.set_value(f"throttling/latency/pinned_{bound}_scopes", names)
                logger.info(
                    "Throttling: %d scope(s) spent most of the crawl with their "
                    "concurrency limit at its %s: %s%s",
                    len(pinned),
                    bound,
                    ", ".join(names),
                    ", ..." if len(pinned) > len(names) else "",
                )


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
