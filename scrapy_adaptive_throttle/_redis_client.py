"""The Redis client of the shared scope state: connecting, the start-up
errors, when to try a lost server again, and the batching of releases.

The scope logic is in :mod:`._shared_state`, its scripts in
:mod:`._redis_scripts`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any
from urllib.parse import urlsplit, urlunsplit

#: Longest a release waits to go out with the next check (the send that
#: usually follows it at once) before it is sent on its own.
RELEASE_BATCH_DELAY = 0.005
#: Longest the release of a lease that the next send may take over (every
#: scope one this process leads alone, see ``SharedState.check``) waits:
#: no other process is kept waiting for it, and a crawler busy parsing
#: often asks for the next send more than :data:`RELEASE_BATCH_DELAY`
#: after the answer that freed the lease.
HANDOVER_RELEASE_DELAY = 0.025
#: Longest what does not free a lease (latency samples, leases handed on
#: from one send to the next, see ``SharedState.check``) waits for a round
#: trip to ride on before it is sent on its own: a scope's leader drains
#: the samples every 0.1 s, and a handed-on lease is counted all along.
SAMPLE_BATCH_DELAY = 0.025
#: The URL schemes of :setting:`THROTTLING_STATE_URL`.
URL_SCHEMES = ("redis", "rediss", "unix")
#: First and longest wait before retrying a lost Redis connection.
RECONNECT_MIN_DELAY = 0.25
RECONNECT_MAX_DELAY = 10.0
#: Socket timeouts of the Redis client: calls are synchronous (the reactor
#: waits for them), so an unresponsive server must fail fast.
SOCKET_TIMEOUT = 1.0


class SharedStateUnavailableError(ValueError):
    """:setting:`THROTTLING_STATE_URL` names a Redis server that cannot be
    reached when the crawl starts (or the ``redis`` package is missing)."""


def redact_url(url: str) -> str:
    """*url* without its password, for logs and error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


class RedisFailure(Exception):
    """A Redis call failed; the fallback is on."""


def is_redis_error(error: BaseException) -> bool:
    from redis.exceptions import RedisError

    return isinstance(error, RedisError | OSError)


def connect(url: str) -> Any:
    try:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError:
        raise SharedStateUnavailableError(
            f"THROTTLING_STATE_URL is set ({redact_url(url)!r}) but the redis "
            "package is not installed: pip install 'scrapy-adaptive-throttle[redis]'"
        ) from None
    # No retries inside the client: calls block the reactor, and a lost
    # server is handled by the fallback, which retries with backoff. One
    # connection, no pool: every call comes from the reactor thread, and
    # the pool's bookkeeping cost about a third of each call (measured:
    # 30 vs 48 us per trivial EVALSHA on a local server).
    try:
        return _connect(redis, url, Retry(NoBackoff(), 0))
    except Exception as exc:
        raise unreachable(url, exc) from None


def unreachable(url: str, error: BaseException) -> SharedStateUnavailableError:
    """The start-up error of a Redis that *url* names and that fails."""
    return SharedStateUnavailableError(
        f"THROTTLING_STATE_URL {redact_url(url)!r}: cannot reach Redis "
        f"({type(error).__name__}: {error})"
    )


def _connect(redis: Any, url: str, retry: Any) -> Any:
    # The single-connection client connects here.
    return redis.Redis.from_url(
        url,
        single_connection_client=True,
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=SOCKET_TIMEOUT,
        retry=retry,
        retry_on_timeout=False,
        health_check_interval=0,
    )


class Reconnection:
    """When to try a lost Redis again, and how loud a loss is.

    Retries back off exponentially, from :data:`RECONNECT_MIN_DELAY` to
    :data:`RECONNECT_MAX_DELAY`; a loss is worth a warning once a minute,
    not a flood when a Redis that answers PING fails every script (e.g. a
    key of another type under the prefix): further losses are INFO.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._retry_at = 0.0
        self._retry_delay = RECONNECT_MIN_DELAY
        self._warned_at: float | None = None

    def lost(self) -> int:
        """Start an outage: retries start again from the shortest delay.
        Returns the logging level of its message."""
        self._retry_delay = RECONNECT_MIN_DELAY
        now = self._clock()
        if self._warned_at is not None and now - self._warned_at < 60.0:
            return logging.INFO
        self._warned_at = now
        return logging.WARNING

    def due(self) -> bool:
        """Whether the backoff allows trying Redis again now."""
        return self._clock() >= self._retry_at

    def failed(self) -> None:
        """A call (or a retry) failed: the next retry waits twice as long."""
        self._retry_at = self._clock() + self._retry_delay
        self._retry_delay = min(self._retry_delay * 2, RECONNECT_MAX_DELAY)

    def settle_time(self) -> float:
        """After a reconnection, how long another process that lost Redis
        at about the same time may still be in its fallback: its retries
        back off on the same schedule, so it tries again within the delay
        this process would have waited next."""
        return self._retry_delay


class ReleaseBatch:
    """Lease releases not sent yet, as ``(lease key, token)`` pairs.

    They go out with the next check (a freed slot is usually taken at once
    by the next request, in the same round trip), or through *flush* after
    :data:`RELEASE_BATCH_DELAY` (:data:`HANDOVER_RELEASE_DELAY` for one a
    hand-over may take back); what frees no lease (:meth:`later`) waits
    up to :data:`SAMPLE_BATCH_DELAY`. Without *schedule* (``schedule(delay,
    function)``, Scrapy's ``call_later``) each is flushed at once.
    """

    def __init__(
        self,
        flush: Callable[[], None],
        schedule: Callable[[float, Callable[[], None]], Any] | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._flush = flush
        self._schedule = schedule
        self._clock = clock
        self._call: Any = None
        #: When the armed timer fires (on *clock*).
        self._due = 0.0
        #: When the oldest thing not sent yet was added (on *clock*).
        self._since: float | None = None
        #: The shortest delay of the releases waiting.
        self._delay = SAMPLE_BATCH_DELAY
        self.pending: list[tuple[str, str]] = []

    def add(
        self, releases: list[tuple[str, str]], delay: float = RELEASE_BATCH_DELAY
    ) -> None:
        """Queue *releases*; flush now or arm the timer to send them at most
        *delay* after the oldest thing waiting."""
        self.pending.extend(releases)
        self._delay = min(self._delay, delay)
        self._arm(self._delay)

    def later(self) -> None:
        """Something that frees no lease waits to be sent: arm the timer for
        :data:`SAMPLE_BATCH_DELAY` after the oldest thing waiting, unless
        releases wait too."""
        if self.pending:
            self._arm(self._delay)
        else:
            self._arm(SAMPLE_BATCH_DELAY, relax=True)

    def _arm(self, delay: float, *, relax: bool = False) -> None:
        if self._schedule is None:
            self._flush()
            return
        now = self._clock()
        if self._since is None:
            self._since = now
        due = self._since + delay
        if self._call is not None:
            if due >= self._due and not relax:
                return
            if due == self._due:
                return
            with suppress(Exception):
                self._call.cancel()
        self._due = due
        self._call = self._schedule(max(0.0, due - now), self._on_timer)

    def _on_timer(self) -> None:
        self._call = None
        self._flush()

    def take(self, keys: Sequence[str] | None = None) -> list[tuple[str, str]]:
        """Return the releases not sent yet and forget them (everything
        waiting goes out with them). With *keys*, only the releases of
        leases on those keys: the others wait to be handed on (see
        :meth:`take_token`) or for the timer."""
        if keys is not None and self.pending:
            wanted = set(keys)
            mine = {token for key, token in self.pending if key in wanted}
            releases = [entry for entry in self.pending if entry[1] in mine]
            self.pending = [entry for entry in self.pending if entry[1] not in mine]
            if self.pending:
                return releases
        else:
            releases, self.pending = self.pending, []
        self._since = None
        self._delay = SAMPLE_BATCH_DELAY
        return releases

    def take_token(self, keys: Sequence[str]) -> str | None:
        """Take back the release of a lease on exactly the lease *keys*
        (the scopes of a send), not sent yet: its token, or ``None``."""
        wanted = sorted(keys)
        tokens: dict[str, list[str]] = {}
        for key, token in self.pending:
            tokens.setdefault(token, []).append(key)
        for token, held in tokens.items():
            if sorted(held) == wanted:
                self.pending = [entry for entry in self.pending if entry[1] != token]
                return token
        return None

    def cancel(self) -> None:
        """Stop the timer (the crawl ends)."""
        if self._call is not None:
            with suppress(Exception):
                self._call.cancel()
            self._call = None
