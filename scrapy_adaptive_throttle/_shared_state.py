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
per send (the check that admits it also takes its lease), one per release,
and releases ride on the next check. A lease freed in this process and
taken at once by its next send of the same scopes, which it leads alone,
is *handed on* without a round trip (see :meth:`SharedState.check`).
Every key has a TTL, so the state of scopes nobody uses any more expires.

When Redis is lost mid-crawl, the processes fall back to in-process limits
(each scope's limit divided by :setting:`THROTTLING_STATE_PROCESSES`),
retry the connection with exponential backoff, and share again once it is
back, leasing again what they have in flight (and keeping to their fallback
share for one more retry delay, while the others may not be back yet). A
Redis emptied without a failed call (redis-py reconnected by itself to a
restarted server, a flush, a failover) is noticed by this process's marker
key, missing at a check: the requests in flight are leased again the same
way.
"""

from __future__ import annotations

import itertools
import logging
import math
import uuid
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from ._clock import MONOTONIC_CLOCK
from ._redis_client import (
    HANDOVER_RELEASE_DELAY,
    RECONNECT_MIN_DELAY,
    RELEASE_BATCH_DELAY,
    RedisFailure,
    ReleaseBatch,
    SharedStateUnavailableError,
    connect,
    redact_url,
    unreachable,
)
from ._redis_scripts import (
    ACQUIRE_SCRIPT,
    ADOPT_SCRIPT,
    HOLD_SCRIPT,
    RECONCILE_SCRIPT,
    REFUND_SCRIPT,
    RELEASE_SCRIPT,
)
from ._settings import report_invalid_setting
from ._shared_connection import ScopeCheck, SharedConnection, fallback_check
from ._shared_limit import AdaptiveScopes
from ._shared_pace import SharedPaces
from ._shared_state_settings import LEASE_MARGIN, SharedStateSettings

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

    from ._scopes import ScopeID

logger = logging.getLogger(__name__)

__all__ = [
    "HANDOVER_FOR",
    "LEASE_MARGIN",
    "RECHECK_INTERVAL",
    "RECONNECT_MIN_DELAY",
    "RELEASE_BATCH_DELAY",
    "ScopeCheck",
    "ScopeQuota",
    "SharedState",
    "SharedStateSettings",
    "SharedStateUnavailableError",
    "fallback_check",
    "redact_url",
    "unreachable",
]

#: Seconds between two looks at a scope whose leases are all held by other
#: processes (nothing in this process will release one and wake it).
RECHECK_INTERVAL = 0.02

#: Seconds after a check by Redis admitted a send during which a lease
#: freed in this process may be handed on to the next send of the same
#: scopes (led alone) without asking Redis again (see
#: :meth:`SharedState.check`): how stale this process's view of the
#: scopes' holds and paces may be when it hands a lease on.
HANDOVER_FOR = 0.05

#: The keys of a scope a check reads or writes, in the check script's order.
SCOPE_KEYS = (
    "lease",
    "next",
    "hold",
    "samples",
    "limit",
    "sends",
    "pace",
    "quota",
    "turns",
)

#: A scope's quota in a check: ``(quota, window, amount)``, the request's
#: amount ``None`` when it gave none.
ScopeQuota = tuple[float, float, "float | None"]


def _quota_args(quota: ScopeQuota | None) -> tuple[float, int, float]:
    """The check script's quota arguments: quota (-1: none), window (µs),
    amount (0.0 for none, as in QuotaWindow.consume)."""
    if quota is None:
        return -1, 0, 0.0
    limit, window, amount = quota
    spent = amount if amount is not None and amount > 0 else 0.0
    if not math.isfinite(spent):
        spent = 0.0
    return limit, max(0, round(window * 1e6)), spent


class SharedState(SharedConnection):
    """The Redis side of the scope state of one crawler process.

    :meth:`check` admits a send and takes its lease in one round trip,
    :meth:`claim` ties that lease to the request reserved right after it,
    :meth:`release` frees it, :meth:`hold` shares a backoff hold. Any Redis
    error switches to the fallback (:attr:`sharing` false) until a
    reconnection succeeds (see :class:`SharedConnection`).
    """

    def __init__(
        self,
        config: SharedStateSettings,
        *,
        client: Any = None,
        clock: Callable[[], float] = MONOTONIC_CLOCK,
        stats: Any = None,
        schedule: Callable[[float, Callable[[], None]], Any] | None = None,
    ) -> None:
        if client is None:
            assert config.url is not None
            client = connect(config.url)
        super().__init__(config, client, clock, stats)
        #: Releases not sent yet; *schedule* (Scrapy's ``call_later``) sends
        #: them on their own if no check takes them first.
        self._releases = ReleaseBatch(self.flush_releases, schedule, clock)
        self._acquire = client.register_script(ACQUIRE_SCRIPT)
        self._adopt = client.register_script(ADOPT_SCRIPT)
        self._release = client.register_script(RELEASE_SCRIPT)
        self._hold = client.register_script(HOLD_SCRIPT)
        self._refund = client.register_script(REFUND_SCRIPT)
        self._reconcile = client.register_script(RECONCILE_SCRIPT)
        self._ttl = round(config.lease_ttl * 1e6)
        self._token_prefix = uuid.uuid4().hex[:12]
        #: This process's marker: missing at a check while this process has
        #: leases in flight, Redis lost its state without a failed call.
        self._marker = f"{config.prefix}:process:{self._token_prefix}"
        self._tokens = itertools.count(1)
        #: The lease taken by the last successful check, until claimed.
        self._pending: tuple[tuple[ScopeID, ...], str] | None = None
        #: The last successful check's admission, for a refund: the server's
        #: time (µs) and the spacing it set per scope (µs; 0: paced, kept).
        self._admitted: tuple[int, dict[ScopeID, int]] = (0, {})
        #: Leases handed on, not sent yet: ``(lease key, sends key, old
        #: token, new token, sent at)``, in order.
        self._handovers: list[tuple[str, str, str, str, float]] = []
        #: When a check by Redis last admitted a send of each set of scopes
        #: (on *clock*): hand-overs are allowed for :data:`HANDOVER_FOR`.
        self._checked: dict[tuple[ScopeID, ...], float] = {}
        #: When Redis last said each set of scopes may be asked about again
        #: (on *clock*): the time gate's wait it answered, this process's
        #: turn among the processes waiting for a spaced scope. Asked
        #: again before that, the check answers the rest of the wait
        #: itself, without a round trip.
        self._opens: dict[tuple[ScopeID, ...], float] = {}
        #: Each leased request's admission (see ``_admitted``), until it is
        #: released, for :meth:`refund`.
        self._sends: dict[Request, tuple[str, int, dict[ScopeID, int]]] = {}
        #: Every reserved request: its lease token (``None``: reserved during
        #: a fallback, not leased) and scopes.
        self._leases: dict[Request, tuple[str | None, tuple[ScopeID, ...]]] = {}
        #: The latency-adaptive scopes: one limit per scope across processes.
        self.adaptive = AdaptiveScopes(self, self._key, schedule, self._releases.later)
        #: The paces learned from 429s: one per scope across processes.
        self.paces = SharedPaces(self, self._key)

    @classmethod
    def from_crawler(
        cls, crawler: Crawler, *, clock: Callable[[], float] = MONOTONIC_CLOCK
    ) -> SharedState | None:
        """The shared state of *crawler*, connected; ``None`` when
        :setting:`THROTTLING_STATE_URL` is not set. *clock* is the one the
        manager reads (it times the reconnection backoff).

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

            state = cls(config, clock=clock, stats=crawler.stats, schedule=call_later)
            state.ping()
            state.adaptive.install(crawler)
            state.paces.install(crawler)
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

    # -- keys -------------------------------------------------------------

    def _key(self, kind: str, scope_id: ScopeID) -> str:
        return f"{self.config.prefix}:{kind}:{scope_id}"

    def lease_key(self, scope_id: ScopeID) -> str:
        """The sorted set of the leases of *scope_id*."""
        return self._key("lease", scope_id)

    # -- sends ------------------------------------------------------------

    def check(
        self,
        scopes: Sequence[ScopeCheck],
        quotas: Sequence[ScopeQuota | None] | None = None,
    ) -> tuple[float, ScopeID | None]:
        """``(wait, blocked)`` for a send whose local checks passed.

        *quotas*: per scope, ``(quota, window, amount)`` of its quota and
        the request's amount (``None``: no quota), spent from one window
        in Redis with the lease.

        When the send is allowed, its lease is taken at once (the same round
        trip) and waits for :meth:`claim`. A send kept waiting by a spaced
        scope (a spacing or a learned pace) waits for this process's turn,
        which Redis gives each waiting process one interval after the one
        before (see ``ACQUIRE_SCRIPT``); asked again before it, the check
        answers the rest of the wait without a round trip. A scope whose
        leases are all taken by other processes is returned as *blocked*
        when this process has a request of it in flight (its release wakes
        the queue), else as a wait of :data:`RECHECK_INTERVAL`, so that it
        is looked at again.

        A lease this process freed and has not released in Redis yet, on
        exactly these scopes, is handed on to this send instead, without a
        round trip (the count of leases does not change), when every scope
        is an adaptive one this process leads alone (no other process's
        sample in its last drain: see :mod:`._shared_limit`), Redis
        admitted a send of these scopes less than :data:`HANDOVER_FOR` ago,
        and none of them has a spacing, a quota or a learned pace (which
        Redis must see each send of); the new token, its expiry and the
        send's place among the scope's sends go out with the next round
        trip. A process that joins sees the lease counted all along; a
        hold it takes reaches a process handing leases on at that
        process's next check by Redis (at most :data:`HANDOVER_FOR` later)
        or once its next drain finds the joiner's samples.
        """
        self.drop_pending()
        if not self.sharing and not self._reconnect():
            return fallback_check(scopes, self.config.processes)
        if self.settling():
            # Back from a fallback before the others may be: their shares
            # are not leased yet, so keep to this process's share as well.
            wait, blocked = fallback_check(scopes, self.config.processes)
            if blocked is not None:
                return wait, blocked
        elif self._releases.pending and self._hand_over(scopes, quotas):
            return 0.0, None
        scope_ids = tuple(scope[0] for scope in scopes)
        opens = self._opens.get(scope_ids) if self._opens else None
        if opens is not None:
            remaining = opens - self._clock()
            if remaining > 0:
                return remaining, None
            del self._opens[scope_ids]
        releases = self._releases.take([self._key("lease", s[0]) for s in scopes])
        samples = self.adaptive.take_samples()
        handovers, self._handovers = self._handovers, []
        keys = [key for key, _ in releases]
        args: list[Any] = [token := self._new_token(), self._ttl, len(releases)]
        args += (len(samples), len(handovers))
        args += (released for _, released in releases)
        for samples_key, lease_key, sample in samples:
            keys += (samples_key, lease_key)
            args.append(sample)
        self._handover_args(handovers, keys, args)
        ceiling = self.adaptive.ceiling
        pace = self.paces.check_args
        if quotas is None:
            quotas = [None] * len(scopes)
        for (scope_id, limit, _, spacing), quota in zip(scopes, quotas, strict=True):
            keys += (self._key(kind, scope_id) for kind in SCOPE_KEYS)
            args += (
                -1 if limit is None else limit,
                max(0, round(spacing * 1e6)),
                ceiling(scope_id),
                *pace(scope_id),
                *_quota_args(quota),
            )
        keys.append(self._marker)
        args.append(len(self._leases))
        try:
            status, wait, server_now, *answers = self._call(
                self._acquire, keys, args, purpose="check"
            )
            if status == 2:
                self._lost_silently()
                status, wait, server_now, *answers = self._call(
                    self._acquire, keys, args, purpose="check"
                )
        except RedisFailure:
            return fallback_check(scopes, self.config.processes)
        count = len(scopes)
        for (scope_id, *_), value, published in zip(
            scopes, answers[:count], answers[count:], strict=True
        ):
            if status == 1 and ceiling(scope_id):
                self.adaptive.recorded_sample(scope_id)
            self.adaptive.published(scope_id, int(value))
            if published:
                self.paces.published(scope_id, published, int(server_now))
        if status == 1:
            if int(wait) > 0:
                # Others wait for a spaced scope of this send: Redis gave
                # this process its next turn already.
                self._remember_wait(scope_ids, int(wait) / 1e6)
            self._pending = (tuple(scope for scope, *_ in scopes), token)
            self._checked[self._pending[0]] = self._clock()
            self._admitted = (
                int(server_now),
                {
                    scope_id: 0 if pace(scope_id)[0] else max(0, round(spacing * 1e6))
                    for scope_id, _, _, spacing in scopes
                },
            )
            return 0.0, None
        if status < 0 and ceiling(scopes[-int(status) - 1][0]):
            # Its ``w`` sample (see the check script) is this process's own.
            self.adaptive.recorded_sample(scopes[-int(status) - 1][0])
        seconds = int(wait) / 1e6
        if seconds > 0:
            if any(spacing > 0 or pace(s_id)[0] for s_id, *_, spacing in scopes):
                # A spaced scope's wait is this process's turn, which Redis
                # keeps for it: asking again sooner would be answered the same.
                self._remember_wait(scope_ids, seconds)
            return seconds, None
        scope_id, _, in_flight, _ = scopes[-int(status) - 1]
        if in_flight:
            return 0.0, scope_id
        return RECHECK_INTERVAL, None

    def _remember_wait(self, scope_ids: tuple[ScopeID, ...], seconds: float) -> None:
        """Remember that *scope_ids* may not send for *seconds* (see
        ``_opens``); forget the waits that are over when many are kept."""
        now = self._clock()
        opens = self._opens
        if len(opens) >= 1024:
            self._opens = opens = {
                key: when for key, when in opens.items() if when > now
            }
        opens[scope_ids] = now + seconds

    def _hand_over(
        self,
        scopes: Sequence[ScopeCheck],
        quotas: Sequence[ScopeQuota | None] | None,
    ) -> bool:
        """Hand a lease freed in this process on to the send *scopes* are
        checked for, if allowed (see :meth:`check`)."""
        scope_ids = tuple(scope_id for scope_id, *_ in scopes)
        now = self._clock()
        checked = self._checked.get(scope_ids)
        if checked is None or now - checked > HANDOVER_FOR:
            if len(self._checked) > 1024:
                self._checked = {
                    key: when
                    for key, when in self._checked.items()
                    if now - when <= HANDOVER_FOR
                }
            return False
        alone = self.adaptive.alone
        if not all(scope_id in alone for scope_id in scope_ids):
            return False
        if quotas is not None and any(quota is not None for quota in quotas):
            return False
        pace = self.paces.check_args
        for scope_id, _, _, spacing in scopes:
            if spacing > 0 or pace(scope_id)[0]:
                return False
        keys = [self._key("lease", scope_id) for scope_id in scope_ids]
        old = self._releases.take_token(keys)
        if old is None:
            return False
        token = self._new_token()
        for scope_id, key in zip(scope_ids, keys, strict=True):
            self._handovers.append((key, self._key("sends", scope_id), old, token, now))
        self._pending = (scope_ids, token)
        self._admitted = (0, {})  # nothing to refund but the send itself
        self._releases.later()
        if self._stats is not None:
            self._stats.inc_value("throttling/shared_state/handover_count")
        return True

    def _handover_args(
        self,
        handovers: list[tuple[str, str, str, str, float]],
        keys: list[str],
        args: list[Any],
    ) -> None:
        now = self._clock()
        for lease_key, sends_key, old, new, sent_at in handovers:
            keys += (lease_key, sends_key)
            args += (old, new, max(0, round((now - sent_at) * 1e6)))

    def claim(
        self,
        request: Request,
        scope_ids: Sequence[ScopeID],
        sent_at: float | None = None,
    ) -> None:
        """Tie the lease of the last check to *request*, just reserved (at
        *sent_at*, on the manager's clock: a 429 for it then finds its send
        among the scope's sends, see :mod:`._shared_pace`).

        A reservation without a check before it (a custom caller of
        ``reserve()``) is leased now, whatever the limits, so that other
        processes still count it.
        """
        scopes = tuple(scope_ids)
        pending = self._pending
        self._pending = None
        if pending is not None and pending[0] == scopes:
            self._leases[request] = (pending[1], scopes)
            self._sends[request] = (pending[1], *self._admitted)
            if sent_at is not None:
                self.paces.sent(sent_at, pending[1])
            return
        if pending is not None:
            self._free(*pending)
        token: str | None = None
        if scopes and self.sharing:
            token = self._new_token()
            try:
                self._lease_in_flight([(token, scopes)])
            except RedisFailure:
                token = None
        self._leases[request] = (token, scopes)

    def release(self, request: Request) -> None:
        """Free the lease of *request* (idempotent).

        With a scheduler, the release goes out with the next check (a freed
        slot is usually taken at once by the next request, in the same
        round trip), or on its own after :data:`RELEASE_BATCH_DELAY`
        (:data:`HANDOVER_RELEASE_DELAY` when every scope of the lease is one
        this process leads alone: the next send may take the lease over).
        """
        self._sends.pop(request, None)
        entry = self._leases.pop(request, None)
        if entry is None:
            return
        token, scopes = entry
        if token is not None and scopes:
            self._free(scopes, token)

    def refund(
        self,
        request: Request,
        scopes: Sequence[tuple[ScopeID, float | None, float | None]],
    ) -> list[ScopeID]:
        """Give back what the send of *request*, answered from a cache
        (it never reached the host), took from the shared state, before its
        release: *scopes* are ``(scope, amount, quota window)`` (``None``:
        no amount, no quota).

        The send leaves the scope's sends; its spacing is given back to the
        shared next-send time if nothing moved it since (another process's
        send, a pace), and its amount to the quota window it was spent
        from, if still open. Return the scopes whose next-send times opened
        sooner. One round trip; nothing while Redis is lost.
        """
        admitted = self._sends.pop(request, None)
        if admitted is None or not self.sharing:
            return []
        token, stamp, spacings = admitted
        keys: list[str] = []
        args: list[Any] = [token, stamp]
        refunded: list[ScopeID] = []
        for scope_id, amount, window in scopes:
            if scope_id not in spacings:
                continue
            refunded.append(scope_id)
            keys += (self._key(kind, scope_id) for kind in ("next", "sends", "quota"))
            spent = amount if amount is not None and math.isfinite(amount) else 0.0
            args += (
                spacings[scope_id],
                max(0.0, spent),
                0 if window is None else max(0, round(window * 1e6)),
            )
        if not keys:
            return []
        try:
            opened = self._call(self._refund, keys, args, purpose="refund")
        except RedisFailure:
            return []
        sooner = [scope for scope, flag in zip(refunded, opened, strict=True) if flag]
        if sooner and self._opens:
            # A wait answered before the refund may be over sooner.
            self._opens = {
                key: when
                for key, when in self._opens.items()
                if not any(scope_id in key for scope_id in sooner)
            }
        return sooner

    def reconcile_quota(
        self,
        scope_id: ScopeID,
        quota: tuple[float, float],
        consumed: float | None,
        remaining: float | None,
    ) -> None:
        """Correct the shared quota window of *scope_id* (*quota*:
        ``(quota, window)``) with what a server reported about a request
        (see :meth:`QuotaWindow.reconcile
        <scrapy_adaptive_throttle._algorithms.quota.QuotaWindow.reconcile>`):
        *consumed*, the difference between the request's actual and
        estimated use, or *remaining*, what the server says is left of its
        window (it wins). The window is the crawl's, so every process sees
        the correction. Non-finite values are ignored; nothing is done
        while Redis is lost (each process then spends its own window, which
        the caller corrects).
        """
        limit, window = quota
        difference = _finite(consumed)
        left = _finite(remaining)
        if not self.sharing or (difference is None and left is None):
            return
        if not (math.isfinite(window) and window > 0):
            return
        args = [
            limit,
            round(window * 1e6),
            "" if difference is None else repr(difference),
            "" if left is None else repr(left),
        ]
        with suppress(RedisFailure):
            self._call(
                self._reconcile,
                [self._key("quota", scope_id)],
                args,
                purpose="reconcile",
            )

    def _free(self, scopes: Sequence[ScopeID], token: str) -> None:
        if not self.sharing:
            return  # it expires with its TTL
        alone = self.adaptive.alone
        self._releases.add(
            [(self._key("lease", scope_id), token) for scope_id in scopes],
            (
                HANDOVER_RELEASE_DELAY
                if all(scope_id in alone for scope_id in scopes)
                else RELEASE_BATCH_DELAY
            ),
        )

    def flush_releases(self) -> None:
        """Send the releases (and latency samples, and leases handed on) not
        sent yet."""
        if not self.sharing or not (
            self._releases.pending or self.adaptive.samples or self._handovers
        ):
            return
        releases = self._releases.take()
        samples = self.adaptive.take_samples()
        handovers, self._handovers = self._handovers, []
        keys = [key for key, _ in releases]
        args: list[Any] = [len(releases), len(samples), len(handovers), self._ttl]
        args += (token for _, token in releases)
        for samples_key, lease_key, sample in samples:
            keys += (samples_key, lease_key)
            args.append(sample)
        self._handover_args(handovers, keys, args)
        with suppress(RedisFailure):
            self._call(self._release, keys, args, purpose="release")

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
        with suppress(RedisFailure):
            self._call(self._hold, [key], [round(seconds * 1e6)], purpose="hold")

    def close(self) -> None:
        """Free every lease still held (the crawl ends)."""
        self.drop_pending()
        for request in list(self._leases):
            self.release(request)
        self.flush_releases()
        self._releases.cancel()
        self.adaptive.close()
        with suppress(Exception):
            self._client.close()

    # -- faults (see SharedConnection) ---------------------------------------

    def _forget_unsent(self) -> None:
        # Releases not sent: their leases expire with their TTL; samples
        # not sent are lost (the fallback adapts on its own samples); leases
        # handed on are leased again under their new tokens on resuming
        # (the old ones expire with their TTL, as unsent releases).
        self._releases.take()
        self.adaptive.forget()
        self._handovers = []

    def _resume(self) -> int:
        in_flight = []
        for request, (held, scopes) in list(self._leases.items()):
            if not scopes:
                continue
            token = held if held is not None else self._new_token()
            self._leases[request] = (token, scopes)
            in_flight.append((token, scopes))
        self._lease_in_flight(in_flight)
        return len(in_flight)

    def _lost_silently(self) -> None:
        """Redis answers but lost this process's leases (a restart that
        redis-py reconnected to by itself, a flush, a failover): lease the
        requests in flight again, as after a noticed loss."""
        leased = self._resume()
        if self._stats is not None:
            self._stats.inc_value("throttling/shared_state/reconnect_count")
        logger.warning(
            "The shared throttling state at %s (THROTTLING_STATE_URL) lost this "
            "process's leases without a failed call (Redis restarted empty, "
            "flushed or failed over?): %d request(s) in flight leased again",
            self.url,
            leased,
        )

    def _lease_in_flight(self, entries: list[tuple[str, tuple[ScopeID, ...]]]) -> None:
        keys: list[str] = [self._marker]
        tokens: list[str] = []
        for token, scopes in entries:
            for scope_id in scopes:
                keys.append(self._key("lease", scope_id))
                tokens.append(token)
        self._call(self._adopt, keys, ["", self._ttl, *tokens], purpose="resume")

    def _new_token(self) -> str:
        return f"{self._token_prefix}:{next(self._tokens)}"


def _finite(value: float | None) -> float | None:
    """*value* as a float when it is a finite number, else None."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)
