"""The connection side of the shared scope state: Redis calls, losing Redis
and getting it back (see :mod:`._shared_state`).

:class:`SharedConnection` counts every round trip, turns a Redis error into
the in-process fallback (:attr:`~SharedConnection.sharing` false, a
warning naming :setting:`THROTTLING_STATE_URL`), and retries the
connection with exponential backoff; :func:`fallback_check` is the
fallback's limit: each scope's limit divided by
:setting:`THROTTLING_STATE_PROCESSES`. Its messages keep the logger of
:mod:`._shared_state`, where users look for them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._redis_client import (
    Reconnection,
    RedisFailure,
    is_redis_error,
    redact_url,
    unreachable,
)

if TYPE_CHECKING:
    from ._scopes import ScopeID
    from ._shared_state_settings import SharedStateSettings

__all__ = ["ScopeCheck", "SharedConnection", "fallback_check"]

logger = logging.getLogger("scrapy_adaptive_throttle._shared_state")

#: A scope of a check: its id, its limit now (``None``: none), how many
#: requests of it this process has in flight, and the spacing its next send
#: starts (seconds).
ScopeCheck = tuple["ScopeID", "int | None", int, float]


class SharedConnection:
    """Calls to Redis, the fallback when they fail, and the reconnection.

    Subclasses say what to forget when Redis is lost
    (:meth:`_forget_unsent`) and what to write again once it is back
    (:meth:`_resume`).
    """

    def __init__(
        self,
        config: SharedStateSettings,
        client: Any,
        clock: Callable[[], float],
        stats: Any,
    ) -> None:
        assert config.url is not None
        self.config = config
        self.url = redact_url(config.url)
        self._client = client
        self._clock = clock
        self._stats = stats
        #: Whether Redis answers (else: in-process fallback limits).
        self.sharing = True
        self._reconnection = Reconnection(clock)
        #: Round trips to Redis (also the ``throttling/shared_state/command_count``
        #: stat).
        self.commands = 0
        #: Seconds spent in round trips to Redis (also the
        #: ``throttling/shared_state/command_seconds`` stat): each blocks the
        #: reactor thread, so this is time the crawl did nothing else.
        self.command_seconds = 0.0
        #: Until when (this process's clock), after a reconnection, other
        #: processes may still be in their fallback, sending their share
        #: without leases: this one keeps to its share too until then.
        self._settle_until = float("-inf")

    def ping(self) -> None:
        """Check that Redis answers; raise :exc:`SharedStateUnavailableError`."""
        try:
            self._client.ping()
        except Exception as exc:
            raise unreachable(self.url, exc) from None

    def _forget_unsent(self) -> None:
        """Drop what was waiting to be sent (Redis is lost)."""

    def _resume(self) -> int:
        """Write again what Redis may have lost; the requests leased again.

        :raises RedisFailure: when Redis fails again.
        """
        return 0

    def settling(self) -> bool:
        """Whether this process came back from a fallback so recently that
        other processes may still be in theirs (see :meth:`_reconnect`)."""
        return self._clock() < self._settle_until

    def _count_command(self, purpose: str) -> None:
        self.commands += 1
        if self._stats is not None:
            self._stats.inc_value("throttling/shared_state/command_count")
            self._stats.inc_value(f"throttling/shared_state/command_count/{purpose}")

    def _call(
        self, script: Any, keys: list[str], args: list[Any], *, purpose: str
    ) -> Any:
        """Run *script*: one round trip, counted under *purpose* (the
        ``throttling/shared_state/command_count/<purpose>`` stat) and timed.

        :raises RedisFailure: when Redis fails (sharing falls back).
        """
        self._count_command(purpose)
        started = time.perf_counter()
        try:
            return script(keys=keys, args=args)
        except Exception as exc:
            if not is_redis_error(exc):
                raise
            self._lost(exc)
            raise RedisFailure from exc
        finally:
            self._time_command(time.perf_counter() - started)

    def _time_command(self, seconds: float) -> None:
        self.command_seconds += seconds
        if self._stats is not None:
            self._stats.inc_value("throttling/shared_state/command_seconds", seconds)

    def _lost(self, error: BaseException) -> None:
        self._forget_unsent()
        if self.sharing:
            self.sharing = False
            if self._stats is not None:
                self._stats.inc_value("throttling/shared_state/fallback_count")
            logger.log(
                self._reconnection.lost(),
                "Lost the shared throttling state at %s (THROTTLING_STATE_URL): "
                "%s: %s. Falling back to in-process limits (each scope's limit "
                "divided by THROTTLING_STATE_PROCESSES = %d) until Redis answers "
                "again.",
                self.url,
                type(error).__name__,
                error,
                self.config.processes,
            )
        self._reconnection.failed()

    def _reconnect(self) -> bool:
        """Try Redis again if the backoff allows; write again what Redis may
        have lost (it may have restarted empty). Whether sharing resumed."""
        if not self._reconnection.due():
            return False
        self._count_command("reconnect")
        started = time.perf_counter()
        try:
            self._client.ping()
        except Exception as exc:
            if not is_redis_error(exc):
                raise
            self._reconnection.failed()
            return False
        finally:
            self._time_command(time.perf_counter() - started)
        self.sharing = True
        try:
            leased = self._resume()
        except RedisFailure:
            return False
        self._settle_until = self._clock() + self._reconnection.settle_time()
        if self._stats is not None:
            self._stats.inc_value("throttling/shared_state/reconnect_count")
        logger.info(
            "Reconnected to the shared throttling state at %s: limits are shared "
            "again (%d request(s) in flight leased again)",
            self.url,
            leased,
        )
        return True


def fallback_check(
    scopes: Sequence[ScopeCheck], processes: int
) -> tuple[float, ScopeID | None]:
    """``(wait, blocked)`` without Redis: each process keeps to its share of
    each scope's limit (the limit divided by *processes*, at least 1)."""
    for scope_id, limit, in_flight, _ in scopes:
        if limit is not None and in_flight >= max(1, limit // processes):
            return 0.0, scope_id
    return 0.0, None
