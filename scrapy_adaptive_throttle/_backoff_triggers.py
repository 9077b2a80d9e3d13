"""Backoff data applied to scopes, counted and logged.

What backs off is decided by the manager's hooks (``get_response_backoff``
and ``get_exception_backoff``, with the rules of
``_algorithms/response_policy.py``); this module applies their result to
the scope managers, shares holds with other processes, and keeps the
``throttling/backoff/...`` stats and the debug log of each trigger.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ._algorithms.response_policy import valid_hold
from ._decisions import record_backoff_decision
from ._types import BackoffData, iter_scopes

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from ._scope_adapter import ScopeAdapter
    from ._scope_registry import ScopeRegistry
    from ._settings import ThrottlingSettings
    from ._shared_state import SharedState
    from ._types import ScopeID

__all__ = ["BackoffTriggers"]


class BackoffTriggers:
    """Applies backoff data to the scopes of a registry."""

    def __init__(
        self,
        crawler: Crawler,
        config: ThrottlingSettings,
        registry: ScopeRegistry,
        shared: SharedState | None,
    ) -> None:
        self.crawler = crawler
        self.config = config
        self.registry = registry
        self.shared = shared

    def apply(self, backoff: BackoffData, now: float, cause: str) -> None:
        """Apply *backoff* (see
        :meth:`~scrapy_adaptive_throttle.ThrottlingManager.apply_backoff`)."""
        if backoff is None:
            return
        items: Iterable[tuple[ScopeID, object]]
        if isinstance(backoff, dict):
            items = backoff.items()
        else:
            items = ((scope, None) for scope in iter_scopes(backoff))
        for scope_id, entry in items:
            adapter = self.registry.get(scope_id)
            delay = None
            if isinstance(entry, dict):
                consumed = entry.get("consumed")
                remaining = entry.get("remaining")
                if consumed is not None or remaining is not None:
                    adapter.reconcile_quota(consumed, remaining, now)
                    if "delay" not in entry:
                        continue
                delay = valid_hold(entry.get("delay"))
            if not adapter.record_backoff(delay, now):
                continue  # a custom scope manager that never backs off
            self._applied(adapter, delay, cause, now, server_delay=delay is not None)

    def delay_scope(self, scope_id: ScopeID, seconds: float, now: float) -> None:
        """Hold *scope_id* for *seconds*, uncapped (a trusted delay)."""
        adapter = self.registry.get(scope_id)
        if not adapter.record_backoff(seconds, now, cap=False):
            return  # a custom scope manager that never backs off
        self._applied(adapter, seconds, "delay_scope", now, server_delay=False)

    def record_rate_limited(
        self, backoff: BackoffData, now: float, sent_at: float | None
    ) -> None:
        """Tell the scopes that backed off on a 429 that they were refused
        for their rate, with when the request was sent, so they can learn
        the pace the server accepts."""
        scopes = backoff.keys() if isinstance(backoff, dict) else iter_scopes(backoff)
        for scope_id in list(scopes):
            self.registry.get(scope_id).record_rate_limited(now, sent_at)

    def _applied(
        self,
        adapter: ScopeAdapter,
        delay: float | None,
        cause: str,
        now: float,
        *,
        server_delay: bool,
    ) -> None:
        if self.shared is not None:
            # Hold the scope in every process for as long as it waits here.
            try:
                wait = adapter.backoff_wait(now)
            except Exception:  # reported when a request meets it
                pass
            else:
                self.shared.hold(adapter.scope_id, wait)
        stats = self.crawler.stats
        if stats is not None:
            stats.inc_value("throttling/backoff/count")
            stats.inc_value(f"throttling/backoff/{cause}_count")
            if server_delay:
                stats.inc_value("throttling/backoff/server_delay_count")
        record_backoff_decision(
            self.crawler,
            adapter.scope_id,
            adapter,
            delay,
            cause,
            now,
            debug=self.config.debug,
        )
