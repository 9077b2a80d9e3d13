"""The latency-aware scope manager: a concurrency limit that follows the host.

:class:`LatencyScopeManager` is the default scope manager with one change: its
concurrency limit is not fixed but adapted to the scope's response times by
:class:`~scrapy_adaptive_throttle._algorithms.latency.LatencyLimit` (additive
increase while latency stays within a tolerance of the host's unloaded median
latency, multiplicative decrease on slow rounds and overloads), between a floor
(``min_concurrency``) and a ceiling (the scope's concurrency, as the default
manager would enforce it). Delays, jitter, backoff, quotas and robots.txt
Crawl-delay work as in :class:`~scrapy_adaptive_throttle.ThrottlingScopeManager`,
and every gate applies, so the most conservative one wins.

The rule and the figures behind it come from the guide "Adapting Crawl Rate
to Host Latency" (``shared/reference/000_3452b3576d47e7cc.txt``); SPEC.md
section 3 states how it fits Scrapy's settings.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any

from ._algorithms import LatencyLimit
from ._algorithms.concurrency import AdaptiveLimit, ConcurrencyLimit
from ._decisions import limit_changed
from ._native import register_latency_scope
from ._scope_manager import ThrottlingScopeManager
from ._settings import ThrottlingSettings

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

__all__ = ["LatencyScopeManager"]

logger = logging.getLogger(__name__)

#: Settings already named in a "nothing to adapt" warning, per crawler: the
#: warning is said once per crawl, not once per scope (a broad crawl creates
#: thousands of scopes with the same default).
_WARNED: weakref.WeakKeyDictionary[Crawler, set[str]] = weakref.WeakKeyDictionary()

#: Seconds of added latency below which no answer counts as slow. Scrapy
#: measures ``download_latency`` on its event loop, which adds milliseconds
#: of noise growing with the crawl's own load (measured on 2 shared cores:
#: p50 2-3 ms and p90 5 ms above the best with no request queued at the
#: host); a tolerance of 1.5 on a host answering in 1.5 ms would read that
#: noise as the host queueing.
LATENCY_RESOLUTION = 0.005


class LatencyScopeManager(ThrottlingScopeManager):
    """A scope manager whose concurrency limit adapts to the scope's latency.

    Use it as :setting:`THROTTLING_SCOPE_MANAGER` (the add-on's default) or
    as the ``"manager"`` of a :setting:`THROTTLING_SCOPES` entry.

    The limit starts at :setting:`THROTTLING_LATENCY_INITIAL_CONCURRENCY`;
    each normal response whose latency is within
    :setting:`THROTTLING_LATENCY_TOLERANCE` times the baseline latency (the
    median latency of the least loaded responses of the last two
    :setting:`THROTTLING_LATENCY_WINDOW` seconds: the host's unloaded median)
    raises it by about ``1 / limit`` while the limit is in use (a whole
    request until a queue first shows: slow start), a round of responses
    mostly slower multiplies it by 0.9 (on a noisy host a round pools enough
    responses for its median to beat the noise), and a backoff trigger
    halves it. Every two windows a probe round halves the limit for a few
    responses, to measure the host unloaded. It never leaves
    ``[min_concurrency, ceiling]``, where the ceiling is the scope's
    concurrency (its ``"concurrency"``, else the default for its kind, e.g.
    :setting:`CONCURRENT_REQUESTS_PER_DOMAIN`; without any,
    :setting:`CONCURRENT_REQUESTS`), lowered by a robots.txt Crawl-delay.
    The rule is
    :class:`~scrapy_adaptive_throttle._algorithms.latency.LatencyLimit`.

    :attr:`concurrency` is the whole-number limit enforced now;
    :meth:`get_state` adds the adaptive state to the default diagnostics.
    """

    def __init__(self, crawler: Crawler, config: dict[str, Any]) -> None:
        super().__init__(crawler, config)
        adaptive = self.adaptive_limit
        limit = adaptive.algorithm
        # With rampup, the ceiling starts at the floor and ramps up: that is
        # not a configuration with nothing to adapt.
        if limit.maximum <= limit.minimum and self.config.rampup is None:
            self._warn_nothing_to_adapt()
        # Under Scrapy's own throttling manager, latency samples come from
        # LatencySampleMiddleware, which finds this scope manager here.
        register_latency_scope(crawler, self)

    def build_limit(self, ceiling: int | None) -> ConcurrencyLimit:
        """A limit adapted to the scope's latency, under *ceiling* (no
        ceiling: :setting:`CONCURRENT_REQUESTS`)."""
        settings = self.config
        maximum = AdaptiveLimit.to_ceiling(ceiling, self._total_concurrency)
        algorithm = LatencyLimit(
            initial=settings.initial_concurrency,
            minimum=self._min_concurrency,
            maximum=maximum,
            tolerance=settings.latency_tolerance,
            window=settings.latency_window,
            resolution=LATENCY_RESOLUTION,
        )
        return AdaptiveLimit(
            algorithm, ceiling=maximum, no_ceiling=self._total_concurrency
        )

    # -- concurrency ------------------------------------------------------

    @property
    def adaptive_limit(self) -> AdaptiveLimit:
        """The latency-adaptive strategy of this scope (under rampup, if any)."""
        strategy = self.scope.strategy
        assert isinstance(strategy, AdaptiveLimit)
        return strategy

    @property
    def concurrency(self) -> int:
        """The adaptive limit, in whole requests, enforced now."""
        return self.adaptive_limit.limit

    @property
    def ceiling(self) -> int:
        """The highest limit adaptation may reach."""
        return self.adaptive_limit.ceiling

    @property
    def latency_limit(self) -> LatencyLimit:
        """The adaptive limit's algorithm state (read-only use, please)."""
        return self.adaptive_limit.algorithm

    def set_concurrency(self, concurrency: int) -> None:
        """Set the ceiling of the adaptive limit (never below ``min_concurrency``).

        A robots.txt Crawl-delay sets it to 1, which pins the limit there.
        """
        self.scope.set_concurrency(concurrency)

    def concurrency_blocked(self) -> bool:
        """Whether the scope is at its adaptive limit."""
        return self.scope.concurrency_blocked()

    def get_load(self) -> float:
        """Active requests / the adaptive limit."""
        return self.scope.get_load()

    def _set_current(self, new: int) -> None:
        # Enforce *new* until the next adaptation (kept for tests and tools).
        old = self.adaptive_limit.limit
        self.adaptive_limit.set_limit(new)
        if new > old:
            self._on_slots_raised(new - old)

    # -- adapting ---------------------------------------------------------------

    def record_response(
        self, latency: float | None, status: int | None, now: float | None = None
    ) -> None:
        """Adapt the limit to one response's latency (seconds) and status.

        Responses without a latency (cached, or not downloaded) are ignored,
        as are backoff codes and the response that triggered a backoff
        (already handled by :meth:`record_backoff`). Error pages (status >=
        400) may lower the limit but never raise it.
        """
        if latency is None:
            return
        now = self._now() if now is None else now
        changed = self.scope.record_response(latency, status, now)
        if changed is not None:
            limit_changed(self, changed[0], changed[1], now)

    # -- diagnostics -----------------------------------------------------------------

    def _warn_nothing_to_adapt(self) -> None:
        setting = self._ceiling_setting()
        warned = _WARNED.setdefault(self.crawler, set())
        if setting in warned:
            return
        warned.add(setting)
        logger.warning(
            "LatencyScopeManager has nothing to adapt for scope %r (and any "
            "other scope configured by %s): its concurrency ceiling (%d) is not "
            "above its floor (min_concurrency %d). Raise %s to let the limit "
            "follow the host's latency, or set THROTTLING_SCOPE_MANAGER to "
            "scrapy_adaptive_throttle.ThrottlingScopeManager for a fixed limit.",
            self.id,
            setting,
            self.ceiling,
            self._min_concurrency,
            setting,
        )

    def _ceiling_setting(self) -> str:
        """The setting that defines this scope's ceiling, for messages."""
        settings = self.config
        if settings.explicit_concurrency:
            return f"THROTTLING_SCOPES[{self.id!r}]['concurrency']"
        if settings.concurrency is None:
            return "CONCURRENT_REQUESTS"
        if settings.kind == "domain":
            return "CONCURRENT_REQUESTS_PER_DOMAIN"
        if settings.kind == "ip":
            if ThrottlingSettings.from_crawler(self.crawler).ip_concurrency:
                return "CONCURRENT_REQUESTS_PER_IP"
            return "CONCURRENT_REQUESTS_PER_DOMAIN"
        return "THROTTLING_SCOPE_CONCURRENCY"

    def __repr__(self) -> str:
        adaptive = self.adaptive_limit
        limit = adaptive.algorithm
        return (
            f"<{type(self).__name__} {self.id!r} active={self.active} "
            f"limit={adaptive.limit} ({limit.limit:.2f} in "
            f"[{self._min_concurrency}, {adaptive.ceiling}]) "
            f"best={limit.best}>"
        )
