"""Throttling decisions at DEBUG level, rate-limited per scope.

With :setting:`THROTTLING_DEBUG`, each decision that changes how fast a scope
is crawled is logged: backoff steps and holds (with the header that gave the
hold), recoveries, robots.txt Crawl-delays and changes of the adaptive limit.
A broad crawl makes thousands of them a second, so a scope logs at most one
line per :data:`SCOPE_INTERVAL` seconds (the next line says how many were
left out), and the whole crawl at most :data:`LINES_PER_SECOND` lines a
second.

The module also remembers the cause of each scope's last backoff, which
:meth:`~scrapy_adaptive_throttle.ThrottlingManager.explain` reports.
"""

from __future__ import annotations

import logging
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from ._latency_scope_manager import LatencyScopeManager
    from ._scope_adapter import ScopeAdapter
    from ._types import ScopeID

__all__ = [
    "DecisionLog",
    "last_backoff_cause",
    "limit_changed",
    "log_decision",
    "record_backoff_decision",
    "refused_again",
    "responding",
]

logger = logging.getLogger(__name__)

#: Decision lines of one scope and kind written in a burst ...
SCOPE_BURST = 5
#: ... and then one every this many seconds.
SCOPE_INTERVAL = 10.0
#: Decision lines per second for the whole crawl.
LINES_PER_SECOND = 20
#: Scopes whose last line time is remembered (the oldest are forgotten).
TRACKED_SCOPES = 10_000

#: The response being turned into backoff, for the header of a server hold.
_RESPONSE: ContextVar[Response | None] = ContextVar(
    "_THROTTLING_RESPONSE", default=None
)
#: Whether that response is a backoff answer to a retry whose request had
#: one before (not a new trigger: see ``_download_outcomes``).
_AGAIN: ContextVar[bool] = ContextVar("_THROTTLING_REFUSED_AGAIN", default=False)
#: The cause of each scope manager's last backoff.
_CAUSES: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_LOGS: weakref.WeakKeyDictionary[Crawler, DecisionLog] = weakref.WeakKeyDictionary()
#: Headers that give a server hold, in the order they are named.
_HOLD_HEADERS = (
    b"Retry-After",
    b"RateLimit-Reset",
    b"RateLimit",
    b"RateLimit-Remaining",
)


class DecisionLog:
    """Decide which decision lines to write: a pure rate limiter.

    Each scope and kind of decision (backoff, adaptive limit, ...) has a
    bucket of :data:`SCOPE_BURST` lines, refilled by one line every
    :data:`SCOPE_INTERVAL` seconds: the first steps of a backoff all show, a
    host that flaps for an hour does not fill the log. The crawl as a whole
    writes at most :data:`LINES_PER_SECOND` lines a second.

    :meth:`allow` returns ``None`` when the line must be left out, else the
    number of lines of that scope and kind left out since its last line.
    """

    def __init__(
        self,
        scope_interval: float = SCOPE_INTERVAL,
        scope_burst: int = SCOPE_BURST,
        lines_per_second: int = LINES_PER_SECOND,
        tracked_scopes: int = TRACKED_SCOPES,
    ) -> None:
        self.scope_interval = scope_interval
        self.scope_burst = scope_burst
        self.lines_per_second = lines_per_second
        self.tracked_scopes = tracked_scopes
        # (scope, kind) -> [tokens, time of the last refill, lines left out]
        self._buckets: OrderedDict[tuple[ScopeID, str], list[float]] = OrderedDict()
        self._second = float("-inf")
        self._lines = 0
        #: Lines left out by the crawl-wide budget, not yet reported.
        self.dropped = 0

    def allow(self, scope_id: ScopeID, now: float, kind: str = "") -> int | None:
        key = (scope_id, kind)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = [float(self.scope_burst), now, 0]
            if len(self._buckets) > self.tracked_scopes:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
            refill = (now - bucket[1]) / self.scope_interval
            if refill > 0:
                bucket[0] = min(float(self.scope_burst), bucket[0] + refill)
                bucket[1] = now
        if bucket[0] < 1:
            bucket[2] += 1
            return None
        if now - self._second >= 1.0:
            self._second = now
            self._lines = 0
        if self._lines >= self.lines_per_second:
            self.dropped += 1
            return None
        self._lines += 1
        bucket[0] -= 1
        skipped = int(bucket[2])
        bucket[2] = 0
        return skipped


def _decision_log(crawler: Crawler) -> DecisionLog:
    log = _LOGS.get(crawler)
    if log is None:
        log = _LOGS[crawler] = DecisionLog()
    return log


def log_decision(
    crawler: Crawler,
    scope_id: ScopeID,
    now: float,
    kind: str,
    message: str,
    *args: Any,
) -> bool:
    """Log one decision of *kind* about *scope_id* at DEBUG, unless
    rate-limited (see :class:`DecisionLog`). Returns whether it was written.
    """
    log = _decision_log(crawler)
    skipped = log.allow(scope_id, now, kind)
    if skipped is None:
        return False
    if skipped:
        message += " (%d earlier decision(s) of this kind for this scope not logged)"
        args = (*args, skipped)
    if log.dropped:
        message += " (%d decision(s) of other scopes not logged: too many)"
        args = (*args, log.dropped)
        log.dropped = 0
    logger.debug(message, *args)
    return True


@contextmanager
def responding(response: Response, *, again: bool = False) -> Iterator[None]:
    """Within the block, backoff decisions come from *response*; *again*:
    it answers a retry whose request had a backoff answer before."""
    token = _RESPONSE.set(response)
    again_token = _AGAIN.set(again)
    try:
        yield
    finally:
        _AGAIN.reset(again_token)
        _RESPONSE.reset(token)


def refused_again() -> bool:
    """Whether the backoff being applied answers a retry whose request had
    a backoff answer before: only its server-given hold applies, as it says
    nothing new of the host's load."""
    return _AGAIN.get()


def hold_header(response: Response | None) -> str | None:
    """The first header of *response* that can give a server hold, as
    ``"Name: value"``."""
    if response is None:
        return None
    headers = response.headers
    for name in _HOLD_HEADERS:
        value = headers.get(name)
        if value is not None:
            return f"{name.decode()}: {value.decode('latin-1')}"
    return None


def last_backoff_cause(manager: Any) -> str | None:
    """What caused the last backoff of *manager* (``None``: none seen)."""
    try:
        return _CAUSES.get(manager)
    except TypeError:  # not weak-referenceable
        return None


def record_backoff_decision(  # noqa: PLR0917 (the call sites read as a sentence)
    crawler: Crawler,
    scope_id: ScopeID,
    scope: ScopeAdapter,
    hold: float | None,
    cause: str,
    now: float,
    *,
    debug: bool,
) -> None:
    """Remember and (with *debug*) log a backoff trigger applied to a scope."""
    header = hold_header(_RESPONSE.get()) if hold is not None else None
    with suppress(TypeError):  # a scope manager that is not weak-referenceable
        _CAUSES[scope.manager] = f"{cause}, {header}" if header else cause
    if not debug:
        return
    state = scope.get_state(now)
    if hold is not None:
        log_decision(
            crawler,
            scope_id,
            now,
            "backoff",
            "Backoff hold for scope %s (%s): nothing sent for %.3fs%s",
            scope_id,
            cause,
            state.get("backoff_wait", hold),
            f" ({header})" if header else "",
        )
    elif "delay" in state:
        log_decision(
            crawler,
            scope_id,
            now,
            "backoff",
            "Backoff step for scope %s (%s): delay %.3fs (level %s)",
            scope_id,
            cause,
            state["delay"],
            state.get("backoff_level", "?"),
        )
    else:
        log_decision(
            crawler,
            scope_id,
            now,
            "backoff",
            "Backoff step for scope %s (%s)",
            scope_id,
            cause,
        )


def limit_changed(manager: LatencyScopeManager, old: int, new: int, now: float) -> None:
    """The hook a scope manager calls when its adaptive limit changes.

    Logs the change at DEBUG (rate-limited) with :setting:`THROTTLING_DEBUG`;
    costs one attribute read otherwise.
    """
    if not manager._debug:
        return
    limit = manager.latency_limit
    last, best = limit.last_latency, limit.best
    log_decision(
        manager.crawler,
        manager.id,
        now,
        "limit",
        "Adaptive limit of scope %s: %d -> %d (latency %s, baseline %s)",
        manager.id,
        old,
        new,
        "-" if last is None else f"{last * 1000:.0f} ms",
        "-" if best is None else f"{best * 1000:.0f} ms",
    )
