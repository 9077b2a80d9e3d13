"""Backoff data applied to scopes, counted and logged.

What backs off is decided by the manager's hooks (``get_response_backoff``
and ``get_exception_backoff``, with the rules of
``_algorithms/response_policy.py``); this module applies their result to
the scope managers, shares holds with other processes, and keeps the
``throttling/backoff/...`` stats and the debug log of each trigger.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ._algorithms.response_policy import decide_response_backoff, valid_hold
from ._decisions import record_backoff_decision
from ._types import BackoffData, dont_track, iter_scopes

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from ._scope_adapter import ScopeAdapter
    from ._scope_gate import ScopeValues
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
        #: Every status that some scope backs off on.
        self.codes = config.common.http_codes.union(
            *(scope.http_codes for scope in config.scopes.values())
        )

    def of_response(
        self,
        response: Response,
        request: Request | None,
        scope_values: Callable[[Request], ScopeValues],
        delay: Callable[[], float | None],
        quota_delay: Callable[[], float | None],
    ) -> BackoffData:
        """The backoff that *response* to *request* calls for (see
        :meth:`~scrapy_adaptive_throttle.ThrottlingManager.get_response_backoff`);
        *delay* and *quota_delay* are the manager's header hooks."""
        if request is None or dont_track(request.meta):
            return None
        status = response.status
        headers = response.headers
        if status not in self.codes and not (
            b"RateLimit" in headers or b"RateLimit-Remaining" in headers
        ):
            return None  # the common case, decided without looking at scopes
        return decide_response_backoff(  # type: ignore[return-value]
            status,
            (
                (scope, self.config.scope(scope).http_codes)
                for scope, _ in scope_values(request)
            ),
            delay,
            quota_delay,
        )

    def of_exception(
        self, scope_values: ScopeValues, exception: BaseException
    ) -> BackoffData:
        """The scopes of *scope_values* that back off on *exception*."""
        scopes = [
            scope
            for scope, _ in scope_values
            if isinstance(exception, self.config.scope(scope).exceptions)
        ]
        return scopes or None

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
                    self._reconcile_shared(adapter, consumed, remaining)
                    if "delay" not in entry:
                        continue
                delay = valid_hold(entry.get("delay"))
            if not adapter.record_backoff(delay, now):
                continue  # a custom scope manager that never backs off
            self._applied(adapter, delay, cause, now, server_delay=delay is not None)

    def _reconcile_shared(
        self, adapter: ScopeAdapter, consumed: object, remaining: object
    ) -> None:
        """Correct the quota window every process spends from, as the
        scope's own window was (with :setting:`THROTTLING_STATE_URL`)."""
        if self.shared is None:
            return
        quota = adapter.shared_quota()
        if quota is None:
            return
        self.shared.reconcile_quota(
            adapter.scope_id,
            quota,
            _number(consumed),
            _number(remaining),
        )

    def delay_scope(self, scope_id: ScopeID, delay: float, now: float) -> None:
        """Hold *scope_id* for *delay* seconds, uncapped (a trusted delay).

        :raises ValueError: if *delay* is negative or not a finite number.
        """
        message = f"Invalid delay for scope {scope_id!r}: {delay!r}"
        try:
            seconds = float(delay)
        except (TypeError, ValueError):
            raise ValueError(message) from None
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(message)
        adapter = self.registry.get(scope_id)
        if not adapter.record_backoff(seconds, now, cap=False):
            return  # a custom scope manager that never backs off
        self._applied(adapter, seconds, "delay_scope", now, server_delay=False)

    def record_rate_limited(
        self,
        backoff: BackoffData,
        now: float,
        sent_at: float | None,
        *,
        again: bool = False,
    ) -> None:
        """Tell the scopes that backed off on a 429 that they were refused
        for their rate, with when the request was sent, so they can learn
        the pace the server accepts. *again*: the request had a backoff
        answer before (this is a retry of it), which counts the refusal
        but teaches no pace."""
        scopes = backoff.keys() if isinstance(backoff, dict) else iter_scopes(backoff)
        for scope_id in list(scopes):
            self.registry.get(scope_id).record_rate_limited(now, sent_at, again=again)

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


def _number(value: object) -> float | None:
    """*value* as a float, or None when it is not a number (a report the
    scope's own quota ignored as well)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
