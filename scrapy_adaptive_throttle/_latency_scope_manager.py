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
from time import monotonic
from typing import TYPE_CHECKING, Any

from ._algorithms import LatencyLimit
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
        # Set before the base __init__, which assigns self._concurrency (the
        # ceiling here, see the property below) before anything else exists.
        self._ceiling = 1
        self._latency_limit: LatencyLimit | None = None
        super().__init__(crawler, config)
        settings = self.config
        self._latency_limit = limit = LatencyLimit(
            initial=settings.initial_concurrency,
            minimum=self._min_concurrency,
            maximum=self._ceiling,
            tolerance=settings.latency_tolerance,
            window=settings.latency_window,
            resolution=LATENCY_RESOLUTION,
        )
        self._current = limit.current()
        self._http_codes = settings.http_codes
        self._backoff_at: float | None = None
        # Latency samples, and those taken at the floor or at the ceiling:
        # a scope that spends most of its crawl at either bound is worth a
        # look (the guide's diagnostic hook), and says so in the stats.
        self._samples = 0
        self._at_floor = 0
        self._at_ceiling = 0
        # With rampup, the ceiling starts at the floor and ramps up: that is
        # not a configuration with nothing to adapt.
        if limit.maximum <= limit.minimum and settings.rampup is None:
            self._warn_nothing_to_adapt()
        # Under Scrapy's own throttling manager, latency samples come from
        # LatencySampleMiddleware, which finds this scope manager here.
        register_latency_scope(crawler, self)

    # The base class keeps its fixed limit in ``_concurrency``; here that is
    # the ceiling of the adaptive limit, so that anything the base class
    # does to it (robots.txt, rampup) moves the ceiling.
    @property
    def _concurrency(self) -> int:
        return self._ceiling

    @_concurrency.setter
    def _concurrency(self, value: int | None) -> None:
        if value is None:
            # No scope limit: CONCURRENT_REQUESTS is the only one left.
            value = self._total_concurrency
        self._ceiling = max(1, int(value))
        limit = self._latency_limit
        if limit is not None:
            limit.set_bounds(self._min_concurrency, self._ceiling)
            self._set_current(limit.current())

    # -- concurrency ------------------------------------------------------

    @property
    def concurrency(self) -> int:
        """The adaptive limit, in whole requests, enforced now."""
        return self._current

    @property
    def ceiling(self) -> int:
        """The highest limit adaptation may reach."""
        return self._ceiling

    @property
    def latency_limit(self) -> LatencyLimit:
        """The adaptive limit's algorithm state (read-only use, please)."""
        assert self._latency_limit is not None
        return self._latency_limit

    def set_concurrency(self, concurrency: int) -> None:
        """Set the ceiling of the adaptive limit (never below ``min_concurrency``).

        A robots.txt Crawl-delay sets it to 1, which pins the limit there.
        """
        self._concurrency = max(self._min_concurrency, int(concurrency))

    def concurrency_blocked(self) -> bool:
        """Whether the scope is at its adaptive limit."""
        return self.active >= self._current

    def get_load(self) -> float:
        """Active requests / the adaptive limit."""
        return self.active / self._current

    def _set_current(self, new: int) -> None:
        old = self._current
        self._current = new
        if new > old:
            self._on_limit_raised(new - old)

    def _on_limit_raised(self, slots: int) -> None:
        # Requests waiting for this scope must hear of the new slots: gate
        # waiters through slot events, the scheduler queue through the
        # manager's release listeners.
        throttler = getattr(self.crawler, "throttler", None)
        notify = getattr(throttler, "notify_slots_changed", None)
        for _ in range(slots):
            self.wake_waiter()
            if notify is not None:
                notify(self.id)

    # -- adapting ---------------------------------------------------------------

    def record_sent(
        self, now: float | None = None, amount: float | None = None
    ) -> None:
        """Record a send, and tell the adaptive limit how many are in flight.

        The in-flight count at send time is the load the answer's latency
        measures (the baseline is made of the least loaded answers).
        """
        if now is None:
            now = monotonic()
        super().record_sent(now, amount)
        limit = self._latency_limit
        if limit is not None:
            limit.on_sent(now, self.active)

    def record_backoff(
        self, delay: float | None = None, now: float | None = None, cap: bool = True
    ) -> None:
        """Apply a backoff trigger and halve the limit.

        The base class holds the scope for the backoff delay (at least
        *delay*, e.g. Retry-After); the halving comes before any latency rule
        for the same response (:meth:`record_response` then ignores it).
        """
        if now is None:
            now = monotonic()
        super().record_backoff(delay, now, cap)
        limit = self.latency_limit
        limit.on_overload(now)
        self._current = limit.current()
        self._backoff_at = now

    def record_response(
        self, latency: float | None, status: int | None, now: float | None = None
    ) -> None:
        """Adapt the limit to one response's latency (seconds) and status.

        Responses without a latency (cached, or not downloaded) are ignored,
        as are backoff codes (already handled by :meth:`record_backoff`).
        Error pages (status >= 400) may lower the limit but never raise it.
        """
        if latency is None:
            return
        if now is None:
            now = monotonic()
        limit = self._latency_limit
        assert limit is not None
        if now == self._backoff_at or status in self._http_codes:
            return
        if status is not None and status >= 400:
            limit.on_error_response(now, latency)
        else:
            limit.on_response(now, latency, self.active)
        current = limit.current()
        if current != self._current:
            limit_changed(self, self._current, current, now)
            self._set_current(current)
        self._samples += 1
        if current <= limit.minimum:
            self._at_floor += 1
        elif current >= self._ceiling:
            self._at_ceiling += 1

    # -- diagnostics -----------------------------------------------------------------

    def get_state(self, now: float | None = None) -> dict[str, Any]:
        """The default diagnostics plus the adaptive limit's state.

        ``limit`` is the whole-number limit enforced now (halved during a
        probe round, ``probing``), ``limit_value`` its fractional value,
        ``floor``/``ceiling`` its bounds, ``best_latency`` the baseline
        latency (the host's estimated unloaded median) and ``last_latency``
        the last one (seconds, ``None`` before the first sample),
        ``round_size`` the responses a round needs at least (more on a noisy
        host), ``at_floor_share`` and
        ``at_ceiling_share`` the share of latency samples taken with the
        limit at either bound.
        """
        state = super().get_state(now)
        limit = self.latency_limit
        samples = self._samples
        state.update(
            limit_value=limit.limit,
            floor=limit.minimum,
            ceiling=self._ceiling,
            best_latency=limit.best,
            last_latency=limit.last_latency,
            latency_tolerance=limit.tolerance,
            latency_window=limit.window,
            increase_count=limit.increase_count,
            decrease_count=limit.decrease_count,
            overload_count=limit.overload_count,
            rebaseline_count=limit.rebaseline_count,
            slow_start=limit.in_slow_start,
            probing=limit.probing,
            round_size=limit.round_size,
            latency_samples=samples,
            at_floor_share=self._at_floor / samples if samples else 0.0,
            at_ceiling_share=self._at_ceiling / samples if samples else 0.0,
        )
        return state

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
            self._ceiling,
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
        limit = self._latency_limit
        return (
            f"<{type(self).__name__} {self.id!r} active={self.active} "
            f"limit={self._current} ({limit.limit if limit else 0:.2f} in "
            f"[{self._min_concurrency}, {self._ceiling}]) "
            f"best={limit.best if limit else None}>"
        )
