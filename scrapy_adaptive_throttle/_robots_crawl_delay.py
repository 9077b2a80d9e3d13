"""robots.txt Crawl-delay applied to scopes (:setting:`ROBOTSTXT_OBEY`).

The merge rule (what a configured scope keeps) is
:func:`~scrapy_adaptive_throttle._algorithms.response_policy.merge_crawl_delay`;
this module remembers each scope's Crawl-delay so that a scope evicted and
created again gets it back, applies it to the scope manager, and warns once
per scope about a configuration more aggressive than robots.txt.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy import signals

from ._algorithms.response_policy import ConfiguredLimits, merge_crawl_delay

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from ._scope_adapter import ScopeAdapter
    from ._scope_registry import ScopeRegistry
    from ._settings import ThrottlingSettings
    from ._types import ScopeID

__all__ = ["CrawlDelays"]

logger = logging.getLogger(__name__)


class CrawlDelays:
    """The Crawl-delay of each scope that robots.txt gave one."""

    def __init__(
        self, config: ThrottlingSettings, stats: StatsCollector | None = None
    ) -> None:
        self.config = config
        self.stats = stats
        self.delays: dict[ScopeID, float] = {}
        self._warned: set[ScopeID] = set()

    def listen(
        self,
        crawler: Crawler,
        scope_of: Callable[[Request], ScopeID],
        apply: Callable[[ScopeID, float], None],
    ) -> None:
        """Apply the Crawl-delay of each robots.txt that RobotsTxtMiddleware
        parses (its ``robots_parsed`` signal) with *apply* to the scope
        *scope_of* its request: the manager's ``apply_robots_crawl_delay``
        and ``get_crawl_delay_scope``, which a subclass may override."""
        self._scope_of = scope_of
        self._apply = apply
        crawler.signals.connect(self.on_robots_parsed, signal=signals.robots_parsed)

    def on_robots_parsed(self, robotparser: Any, request: Request) -> None:
        """The ``robots_parsed`` handler (see :meth:`listen`)."""
        seconds = self.read(robotparser)
        if seconds is not None:
            self._apply(self._scope_of(request), seconds)

    def read(self, robotparser: Any) -> float | None:
        """The Crawl-delay that a parsed robots.txt gives our user agent, in
        seconds, or ``None``."""
        try:
            delay = robotparser.crawl_delay(self.config.user_agent)
        except Exception:  # a third-party parser must never break the crawl
            logger.debug(
                "Could not read Crawl-delay from %r", robotparser, exc_info=True
            )
            return None
        if delay is None:
            return None
        try:
            return float(delay)
        except (TypeError, ValueError):
            return None

    def remember(self, scope_id: ScopeID, delay: float) -> float | None:
        """Record a Crawl-delay of *delay* seconds for *scope_id*; return it
        capped at :setting:`THROTTLING_ROBOTSTXT_MAX_DELAY`, or ``None`` if
        it is not to be applied (robots.txt not obeyed, or not a positive
        finite number)."""
        if not self.config.robotstxt_obey:
            return None
        if not (math.isfinite(delay) and delay > 0):
            return None
        capped = min(delay, self.config.robotstxt_max_delay)
        self.delays[scope_id] = max(capped, self.delays.get(scope_id, 0.0))
        return capped

    def apply_to_scope(
        self, registry: ScopeRegistry, scope_id: ScopeID, delay: float
    ) -> bool:
        """Remember and apply a Crawl-delay of *delay* seconds to *scope_id*
        (see ``ThrottlingManager.apply_robots_crawl_delay``); whether the
        scope changed, so that its reserved requests are gated again."""
        capped = self.remember(scope_id, delay)
        if capped is None or not self.apply(registry.get(scope_id), capped, warn=True):
            return False
        if self.stats is not None:
            self.stats.inc_value("throttling/robotstxt/crawl_delay_count")
        return True

    def reapply(self, adapter: ScopeAdapter) -> None:
        """Apply the remembered Crawl-delay, if any, to a new scope manager."""
        delay = self.delays.get(adapter.scope_id)
        if delay is not None:
            self.apply(adapter, delay)

    def apply(self, adapter: ScopeAdapter, delay: float, *, warn: bool = False) -> bool:
        """Apply *delay* to the scope of *adapter*; whether anything changed."""
        scope_id = adapter.scope_id
        configured = self.config.scopes.get(scope_id)
        limits = None
        if configured is not None:
            limits = ConfiguredLimits(
                ignore_robots_txt=configured.ignore_robots_txt,
                explicit_delay=configured.explicit_delay,
                delay=configured.delay,
                explicit_concurrency=configured.explicit_concurrency,
                concurrency=configured.concurrency,
                min_concurrency=configured.min_concurrency,
            )
        merge = merge_crawl_delay(limits, delay)
        if merge.conflicts and warn and scope_id not in self._warned:
            self._warned.add(scope_id)
            logger.warning(
                "THROTTLING_SCOPES[%r] is more aggressive than the robots.txt "
                "Crawl-delay of %ss (%s); the configured values are used. Set "
                "'ignore_robots_txt': True in that entry to silence this warning.",
                scope_id,
                delay,
                " and ".join(merge.conflicts),
            )
        if not merge.changes_anything:
            return False
        adapter.apply_crawl_delay(
            None if merge.keep_delay else delay,
            None if merge.keep_concurrency else 1,
        )
        if self.config.debug:
            logger.debug(
                "robots.txt Crawl-delay for scope %s: delay %s, concurrency %s",
                scope_id,
                "kept" if merge.keep_delay else f"{delay:.3f}s",
                "kept" if merge.keep_concurrency else 1,
            )
        return True
