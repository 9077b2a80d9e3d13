"""Scope state shared by several crawler processes through Redis.

With :setting:`THROTTLING_STATE_URL` set, every process of a crawl takes
its sends from one Redis server, so that a scope's limits hold across all of
them (see :ref:`shared-state`):

* **concurrency as leases**: a send adds a lease (a token with an expiry
  time) to the scope's sorted set, and may only do so while the set holds
  fewer live leases than the scope's limit; its release removes it. A lease
  expires by itself after :setting:`DOWNLOAD_TIMEOUT` plus
  :data:`LEASE_MARGIN` seconds, so that a process killed with SIGKILL does
  not hold a host for ever;
* **delay and jitter as a shared next-send time**: each send sets the
  scope's earliest next send (its own spacing, jitter included, from the
  server's clock), which every process honours;
* **backoff holds**: a hold taken in one process (a 429 or 503, its
  ``Retry-After``, :meth:`~scrapy_adaptive_throttle.ThrottlingManager.delay_scope`)
  is written as the scope's hold-until time, which every process honours.

Each update is one Lua script, so it is atomic, and reads the time with
Redis's ``TIME``, so that the machines' clocks do not matter: one round trip
per send (the check that admits it also takes its lease), one per release.
Every key has a TTL, so the state of scopes nobody uses any more expires.

When Redis is lost mid-crawl, the processes fall back to in-process limits
(each scope's limit divided by :setting:`THROTTLING_STATE_PROCESSES`),
retry the connection with exponential backoff, and share again once it is
back, leasing again what they have in flight.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from ._settings import SettingsReader, report_invalid_setting, to_float, to_int

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

    from ._types import ScopeID

logger = logging.getLogger(__name__)

#: Seconds a lease outlives :setting:`DOWNLOAD_TIMEOUT`: a request is
#: reserved a little before its download starts (downloader middlewares)
#: and released a little after it ends.
LEASE_MARGIN = 5.0
#: Seconds between two looks at a scope whose leases are all held by other
#: processes (nothing in this process will release one and wake it).
RECHECK_INTERVAL = 0.02
#: First and longest wait before retrying a lost Redis connection.
RECONNECT_MIN_DELAY = 0.25
RECONNECT_MAX_DELAY = 10.0
#: Socket timeouts of the Redis client: calls are synchronous (the reactor
#: waits for them), so an unresponsive server must fail fast.
SOCKET_TIMEOUT = 1.0
#: Longest a release waits to go out with the next check (the send that
#: usually follows it at once) before it is sent on its own.
RELEASE_BATCH_DELAY = 0.005
_SCHEMES = ("redis", "rediss", "unix")

# Times in the scripts are microseconds of the Redis server's clock (exact
# in Lua's doubles), durations are passed in microseconds too.
_NOW = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
"""

#: KEYS: the lease keys of R releases, then the lease, next-send and hold
#: key of each scope. ARGV: token, lease TTL, R, the R released tokens, then
#: the limit (-1: none) and the spacing of each scope. Returns ``{status,
#: wait}``: status 1 = leased (every scope), 0 = not leased, -i = not leased
#: and scope i is at its limit; wait = microseconds until every time gate
#: opens. Releases go first, batched into the next check (see
#: SharedState.release).
_ACQUIRE = (
    _NOW
    + """
local ttl = tonumber(ARGV[2])
local released = tonumber(ARGV[3])
for i = 1, released do redis.call('ZREM', KEYS[i], ARGV[3 + i]) end
local base = 3 + released
local scopes = (#KEYS - released) / 3
local blocked = 0
local wait = 0
for i = 1, scopes do
  local k = released + 3 * (i - 1)
  local lease = KEYS[k + 1]
  redis.call('ZREMRANGEBYSCORE', lease, '-inf', now)
  local limit = tonumber(ARGV[base + 2 * i - 1])
  if blocked == 0 and limit >= 0 and redis.call('ZCARD', lease) >= limit then
    blocked = i
  end
  local next_send = tonumber(redis.call('GET', KEYS[k + 2]) or '0')
  local hold = tonumber(redis.call('GET', KEYS[k + 3]) or '0')
  local gate = math.max(next_send, hold) - now
  if gate > wait then wait = gate end
end
if blocked > 0 then return {-blocked, wait} end
if wait > 0 then return {0, wait} end
for i = 1, scopes do
  local k = released + 3 * (i - 1)
  redis.call('ZADD', KEYS[k + 1], now + ttl, ARGV[1])
  redis.call('PEXPIRE', KEYS[k + 1], math.ceil(ttl / 1000))
  local spacing = tonumber(ARGV[base + 2 * i])
  if spacing > 0 then
    redis.call('SET', KEYS[k + 2], now + spacing, 'PX',
               math.ceil(spacing / 1000) + 1000)
  end
end
return {1, 0}
"""
)

#: KEYS: lease keys. ARGV: token, lease TTL, then one token per key: lease
#: without looking at limits (a request already in flight).
_ADOPT = (
    _NOW
    + """
local ttl = tonumber(ARGV[2])
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], now + ttl, ARGV[2 + i])
  redis.call('PEXPIRE', KEYS[i], math.ceil(ttl / 1000))
end
return #KEYS
"""
)

#: KEYS: lease keys. ARGV: the token to remove from each.
_RELEASE = """
for i = 1, #KEYS do redis.call('ZREM', KEYS[i], ARGV[i]) end
return #KEYS
"""

#: KEYS: hold key. ARGV: microseconds from now. A hold only ever grows.
_HOLD = (
    _NOW
    + """
local hold = now + tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if hold > current then
  redis.call('SET', KEYS[1], hold, 'PX', math.ceil(tonumber(ARGV[1]) / 1000) + 1000)
end
return 0
"""
)


class SharedStateUnavailableError(ValueError):
    """:setting:`THROTTLING_STATE_URL` names a Redis server that cannot be
    reached when the crawl starts (or the ``redis`` package is missing)."""


@dataclass(frozen=True)
class SharedStateSettings:
    """The shared-state settings of a crawl, read and validated once."""

    #: :setting:`THROTTLING_STATE_URL` (``None``: in-process state).
    url: str | None
    #: :setting:`THROTTLING_STATE_PREFIX`.
    prefix: str
    #: :setting:`THROTTLING_STATE_PROCESSES`.
    processes: int
    #: Seconds a lease lives: :setting:`DOWNLOAD_TIMEOUT` + :data:`LEASE_MARGIN`.
    lease_ttl: float

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> SharedStateSettings:
        """Read and validate *settings*; raise :exc:`ValueError` on bad input."""
        read = SettingsReader(settings)
        url = read.raw("THROTTLING_STATE_URL")
        if url is not None:
            if not isinstance(url, str) or not url.strip():
                raise ValueError(
                    f"Invalid THROTTLING_STATE_URL value {url!r}: expected a "
                    "redis://, rediss:// or unix:// URL, or None"
                )
            url = url.strip()
            scheme = urlsplit(url).scheme
            if scheme not in _SCHEMES:
                raise ValueError(
                    f"Invalid THROTTLING_STATE_URL value {redact_url(url)!r}: "
                    "expected a redis://, rediss:// or unix:// URL, or None"
                )
        prefix = read.raw("THROTTLING_STATE_PREFIX")
        if not isinstance(prefix, str) or not prefix or prefix != prefix.strip():
            raise ValueError(
                f"Invalid THROTTLING_STATE_PREFIX value {prefix!r}: expected a "
                "non-empty string without surrounding spaces"
            )
        processes = to_int(
            read.raw("THROTTLING_STATE_PROCESSES"),
            "THROTTLING_STATE_PROCESSES",
            minimum=1,
        )
        timeout = to_float(
            settings.get("DOWNLOAD_TIMEOUT", 180), "DOWNLOAD_TIMEOUT", minimum=0.0
        )
        return cls(
            url=url,
            prefix=prefix,
            processes=processes,
            lease_ttl=timeout + LEASE_MARGIN,
        )


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


#: A scope of a check: its id, its limit now (``None``: none), how many
#: requests of it this process has in flight, and the spacing its next send
#: starts (seconds).
ScopeCheck = tuple["ScopeID", "int | None", int, float]


class SharedState:
    """The Redis side of the scope state of one crawler process.

    :meth:`check` admits a send and takes its lease in one round trip,
    :meth:`claim` ties that lease to the request reserved right after it,
    :meth:`release` frees it, :meth:`hold` shares a backoff hold. Any Redis
    error switches to the fallback (:attr:`sharing` false) until a
    reconnection succeeds.
    """

    def __init__(
        self,
        config: SharedStateSettings,
        *,
        client: Any = None,
        clock: Callable[[], float] = time.monotonic,
        stats: Any = None,
        schedule: Callable[[float, Callable[[], None]], Any] | None = None,
    ) -> None:
        assert config.url is not None
        self.config = config
        self.url = redact_url(config.url)
        self._clock = clock
        self._stats = stats
        #: ``schedule(delay, function)`` (Scrapy's ``call_later``) to batch
        #: releases; ``None``: each release is sent at once.
        self._schedule = schedule
        self._flush_call: Any = None
        #: Releases not sent yet: (lease key, token).
        self._releases: list[tuple[str, str]] = []
        if client is None:
            client = _client(config.url)
        self._client = client
        self._acquire = client.register_script(_ACQUIRE)
        self._adopt = client.register_script(_ADOPT)
        self._release = client.register_script(_RELEASE)
        self._hold = client.register_script(_HOLD)
        self._ttl = round(config.lease_ttl * 1e6)
        self._token_prefix = uuid.uuid4().hex[:12]
        self._tokens = itertools.count(1)
        #: The lease taken by the last successful check, until claimed.
        self._pending: tuple[tuple[ScopeID, ...], str] | None = None
        #: Every reserved request: its lease token (``None``: reserved during
        #: a fallback, not leased) and scopes.
        self._leases: dict[Request, tuple[str | None, tuple[ScopeID, ...]]] = {}
        #: Whether Redis answers (else: in-process fallback limits).
        self.sharing = True
        self._warned_at: float | None = None
        self._retry_at = 0.0
        self._retry_delay = RECONNECT_MIN_DELAY
        #: Round trips to Redis (also the ``throttling/shared_state/command_count``
        #: stat).
        self.commands = 0

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> SharedState | None:
        """The shared state of *crawler*, connected; ``None`` when
        :setting:`THROTTLING_STATE_URL` is not set.

        :raises SharedStateUnavailableError: when Redis cannot be reached.
        """
        try:
            config = SharedStateSettings.from_settings(crawler.settings)
        except ValueError as exc:
            report_invalid_setting(exc)
            raise
        if config.url is None:
            return None
        try:
            from scrapy.utils.asyncio import call_later

            state = cls(config, stats=crawler.stats, schedule=call_later)
            state.ping()
        except SharedStateUnavailableError as exc:
            report_invalid_setting(exc)
            raise
        logger.info(
            "Sharing throttling state through Redis at %s (key prefix %r, "
            "lease TTL %gs, fallback limits divided by %d)",
            state.url,
            config.prefix,
            config.lease_ttl,
            config.processes,
        )
        return state

    def ping(self) -> None:
        """Check that Redis answers; raise :exc:`SharedStateUnavailableError`."""
        try:
            self._client.ping()
        except Exception as exc:
            raise unreachable(self.url, exc) from None

    # -- keys -------------------------------------------------------------

    def _key(self, kind: str, scope_id: ScopeID) -> str:
        return f"{self.config.prefix}:{kind}:{scope_id}"

    def lease_key(self, scope_id: ScopeID) -> str:
        """The sorted set of the leases of *scope_id*."""
        return self._key("lease", scope_id)

    # -- sends ------------------------------------------------------------

    def check(self, scopes: Sequence[ScopeCheck]) -> tuple[float, ScopeID | None]:
        """``(wait, blocked)`` for a send whose local checks passed.

        When the send is allowed, its lease is taken at once (the same round
        trip) and waits for :meth:`claim`. A scope whose leases are all taken
        by other processes is returned as *blocked* when this process has a
        request of it in flight (its release wakes the queue), else as a
        wait of :data:`RECHECK_INTERVAL`, so that it is looked at again.
        """
        self.drop_pending()
        if not self.sharing and not self._reconnect():
            return self._fallback_check(scopes)
        releases = self._releases
        self._releases = []
        keys = [key for key, _ in releases]
        args: list[Any] = [token := self._new_token(), self._ttl, len(releases)]
        args += (released for _, released in releases)
        for scope_id, limit, _, spacing in scopes:
            keys += (
                self._key("lease", scope_id),
                self._key("next", scope_id),
                self._key("hold", scope_id),
            )
            args += (
                -1 if limit is None else limit,
                max(0, round(spacing * 1e6)),
            )
        try:
            status, wait = self._call(self._acquire, keys, args)
        except _RedisFailure:
            return self._fallback_check(scopes)
        if status == 1:
            self._pending = (tuple(scope for scope, *_ in scopes), token)
            return 0.0, None
        seconds = int(wait) / 1e6
        if seconds > 0:
            return seconds, None
        scope_id, _, in_flight, _ = scopes[-int(status) - 1]
        if in_flight:
            return 0.0, scope_id
        return RECHECK_INTERVAL, None

    def _fallback_check(
        self, scopes: Sequence[ScopeCheck]
    ) -> tuple[float, ScopeID | None]:
        processes = self.config.processes
        for scope_id, limit, in_flight, _ in scopes:
            if limit is not None and in_flight >= max(1, limit // processes):
                return 0.0, scope_id
        return 0.0, None

    def claim(self, request: Request, scope_ids: Sequence[ScopeID]) -> None:
        """Tie the lease of the last check to *request*, just reserved.

        A reservation without a check before it (a custom caller of
        ``reserve()``) is leased now, whatever the limits, so that other
        processes still count it.
        """
        scopes = tuple(scope_ids)
        pending = self._pending
        self._pending = None
        if pending is not None and pending[0] == scopes:
            self._leases[request] = (pending[1], scopes)
            return
        if pending is not None:
            self._free(*pending)
        token: str | None = None
        if scopes and self.sharing:
            token = self._new_token()
            try:
                self._lease_in_flight([(token, scopes)])
            except _RedisFailure:
                token = None
        self._leases[request] = (token, scopes)

    def release(self, request: Request) -> None:
        """Free the lease of *request* (idempotent).

        With a scheduler, the release goes out with the next check (a freed
        slot is usually taken at once by the next request, in the same
        round trip), or on its own after :data:`RELEASE_BATCH_DELAY`.
        """
        entry = self._leases.pop(request, None)
        if entry is None:
            return
        token, scopes = entry
        if token is not None and scopes:
            self._free(scopes, token)

    def _free(self, scopes: Sequence[ScopeID], token: str) -> None:
        if not self.sharing:
            return  # it expires with its TTL
        self._releases.extend(
            (self._key("lease", scope_id), token) for scope_id in scopes
        )
        if self._schedule is None:
            self.flush_releases()
        elif self._flush_call is None:
            self._flush_call = self._schedule(RELEASE_BATCH_DELAY, self._on_flush_timer)

    def _on_flush_timer(self) -> None:
        self._flush_call = None
        self.flush_releases()

    def flush_releases(self) -> None:
        """Send the releases not sent yet."""
        releases = self._releases
        if not releases or not self.sharing:
            return
        self._releases = []
        keys = [key for key, _ in releases]
        with suppress(_RedisFailure):
            self._call(self._release, keys, [token for _, token in releases])

    def drop_pending(self) -> None:
        """Free the lease of the last check if no request claimed it (e.g. a
        quota backfill looked further), so that it does not count until it
        expires."""
        pending = self._pending
        if pending is not None:
            self._pending = None
            self._free(*pending)

    def hold(self, scope_id: ScopeID, seconds: float) -> None:
        """Hold *scope_id* in every process for *seconds* (a backoff)."""
        if not (seconds > 0 and math.isfinite(seconds)):
            return
        if not self.sharing and not self._reconnect():
            return
        key = self._key("hold", scope_id)
        with suppress(_RedisFailure):
            self._call(self._hold, [key], [round(seconds * 1e6)])

    def close(self) -> None:
        """Free every lease still held (the crawl ends)."""
        self.drop_pending()
        for request in list(self._leases):
            self.release(request)
        self.flush_releases()
        if self._flush_call is not None:
            with suppress(Exception):
                self._flush_call.cancel()
            self._flush_call = None
        with suppress(Exception):
            self._client.close()

    # -- faults -----------------------------------------------------------

    def _call(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        self.commands += 1
        if self._stats is not None:
            self._stats.inc_value("throttling/shared_state/command_count")
        try:
            return script(keys=keys, args=args)
        except Exception as exc:
            if not _is_redis_error(exc):
                raise
            self._lost(exc)
            raise _RedisFailure from exc

    def _lost(self, error: BaseException) -> None:
        # Releases not sent: their leases expire with their TTL.
        self._releases = []
        if self.sharing:
            self.sharing = False
            self._retry_delay = RECONNECT_MIN_DELAY
            if self._stats is not None:
                self._stats.inc_value("throttling/shared_state/fallback_count")
            # One warning per outage, but not a flood when a Redis that
            # answers PING fails every script (e.g. a key of another type
            # under the prefix): further losses within a minute are INFO.
            now = self._clock()
            level = logging.WARNING
            if self._warned_at is not None and now - self._warned_at < 60.0:
                level = logging.INFO
            else:
                self._warned_at = now
            logger.log(
                level,
                "Lost the shared throttling state at %s (THROTTLING_STATE_URL): "
                "%s: %s. Falling back to in-process limits (each scope's limit "
                "divided by THROTTLING_STATE_PROCESSES = %d) until Redis answers "
                "again.",
                self.url,
                type(error).__name__,
                error,
                self.config.processes,
            )
        self._retry_at = self._clock() + self._retry_delay
        self._retry_delay = min(self._retry_delay * 2, RECONNECT_MAX_DELAY)

    def _reconnect(self) -> bool:
        """Try Redis again if the backoff allows; lease again what is in
        flight (Redis may have restarted empty). Whether sharing resumed."""
        if self._clock() < self._retry_at:
            return False
        self.commands += 1
        if self._stats is not None:
            self._stats.inc_value("throttling/shared_state/command_count")
        try:
            self._client.ping()
        except Exception as exc:
            if not _is_redis_error(exc):
                raise
            self._retry_at = self._clock() + self._retry_delay
            self._retry_delay = min(self._retry_delay * 2, RECONNECT_MAX_DELAY)
            return False
        self.sharing = True
        in_flight = []
        for request, (held, scopes) in list(self._leases.items()):
            if not scopes:
                continue
            token = held if held is not None else self._new_token()
            self._leases[request] = (token, scopes)
            in_flight.append((token, scopes))
        try:
            self._lease_in_flight(in_flight)
        except _RedisFailure:
            return False
        if self._stats is not None:
            self._stats.inc_value("throttling/shared_state/reconnect_count")
        logger.info(
            "Reconnected to the shared throttling state at %s: limits are shared "
            "again (%d request(s) in flight leased again)",
            self.url,
            len(in_flight),
        )
        return True

    def _lease_in_flight(self, entries: list[tuple[str, tuple[ScopeID, ...]]]) -> None:
        keys: list[str] = []
        tokens: list[str] = []
        for token, scopes in entries:
            for scope_id in scopes:
                keys.append(self._key("lease", scope_id))
                tokens.append(token)
        if keys:
            self._call(self._adopt, keys, ["", self._ttl, *tokens])

    def _new_token(self) -> str:
        return f"{self._token_prefix}:{next(self._tokens)}"


class _RedisFailure(Exception):
    """A Redis call failed; the fallback is on."""


def _is_redis_error(error: BaseException) -> bool:
    from redis.exceptions import RedisError

    return isinstance(error, RedisError | OSError)


def _client(url: str) -> Any:
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
