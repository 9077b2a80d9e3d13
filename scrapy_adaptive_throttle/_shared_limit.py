"""One latency-adaptive limit per scope, fed by every process's samples.

Without sharing, each process's
:class:`~._algorithms.concurrency.AdaptiveLimit` sees only its own requests
in flight and its own answers, so four processes each settle at what the
host allows one of them, and together load it four times over. With
:setting:`THROTTLING_STATE_URL`, an adaptive scope's strategy is a
:class:`SharedAdaptiveLimit` instead:

* every process sends its samples to Redis, in round trips it makes anyway:
  the check that admits a send appends an ``s`` sample (the scope's leases,
  i.e. its requests in flight across processes, just after the send), and a
  response's latency (or an overload) goes out with the next check or
  release, stamped with the server's time and the scope's leases then;
  the list is capped (:data:`~._redis_scripts.SAMPLES_CAP`) and expires;
* one process per scope leads it (a key taken with ``SET NX PX``, renewed
  every :data:`LEADER_INTERVAL`, given up when its crawl ends and taken
  over by another process once it is free; a process that only follows,
  its every scope led by others at its last try, tries again every
  :data:`FOLLOW_INTERVAL`): every :data:`LEADER_INTERVAL` it drains the
  samples of every process into its own limit, through
  :class:`~._algorithms.concurrency.AdaptiveLimit`'s public methods (so the
  rule sees the *global* in-flight count), and publishes the limit and its
  baseline latency; a limit the drain changed is published at once (a
  second round trip), and what the change starts (a round, growth, a
  probe) counts only answers to requests sent once it is enforced
  (``LatencyLimit.hold``): counted, the answers the drain had not reached
  yet lowered the limit again and took a queue for a slowdown;
* the check script enforces the published limit on the scope's leases, for
  every process (capped by each process's own ceiling).

So the host sees one adaptive limit, whatever the number of processes. A
scope no process leads yet (or whose published limit expired) is limited by
the asking process's own limit.

A leader whose last drain held samples and all of them its own leads the
scope **alone** (:attr:`AdaptiveScopes.alone`): until another process's
sample shows up in a drain (a send, an answer, or a send the leases kept
waiting: a ``w`` sample, so that a process the leader's leases keep out
ends it too), it feeds its own sends and answers to its limit as they come
and enforces that limit at once, as without sharing (its checks still
count every process's leases against it, and every drain still publishes
it for a process that joins). One process with the Redis backend so adapts
as one process without it: with changes published once a drain (0.1 s)
and held until then, slow start took a step a drain and the limit settled
at about half of one process's (``bench/RESULTS.md``, "One process with
the Redis backend: a host led alone, and leases handed on").

While Redis is lost, each process adapts on its own samples again and
keeps to its share of its own limit (the limit divided by
:setting:`THROTTLING_STATE_PROCESSES`). A process that takes the
lead over goes on from the published limit and baseline (``adopt``), not
from its own limit, which no sample fed while another process led: that
one restarted slow start from the floor and took the loaded answers of the
hand-over for its baseline, and held the host at up to its ceiling.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from ._algorithms.concurrency import AdaptiveLimit, ConcurrencyLimit
from ._redis_client import RedisFailure
from ._redis_scripts import LEADER_SCRIPT, PUBLISH_SCRIPT, RESIGN_SCRIPT

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from ._algorithms import LatencyLimit
    from ._shared_connection import SharedConnection
    from ._types import ScopeID

__all__ = [
    "FOLLOW_INTERVAL",
    "LEADER_INTERVAL",
    "LEADER_TTL",
    "AdaptiveScopes",
    "SharedAdaptiveLimit",
    "share_limit",
]

#: Seconds between two drains of a scope's samples by its leader (and two
#: renewals of the lead).
LEADER_INTERVAL = 0.1
#: Seconds between two tries of a process that leads none of its scopes
#: (each led by another process at its last try) to take a lead over: a
#: lead left free is taken within this, and four processes on one host
#: make about a third as many round trips for their leads as at
#: :data:`LEADER_INTERVAL` each.
FOLLOW_INTERVAL = 0.5
#: Seconds the lead of a scope outlives its last renewal: after that,
#: another process takes it over.
LEADER_TTL = 1.0
#: Seconds a published limit outlives its last publication.
LIMIT_TTL = 5.0
#: Seconds after its last send or answer in this process that a scope
#: still takes part in this process's leads.
ACTIVE_FOR = 2.0

#: The shared state of each crawler with :setting:`THROTTLING_STATE_URL`.
_SHARED: weakref.WeakKeyDictionary[Crawler, AdaptiveScopes] = (
    weakref.WeakKeyDictionary()
)


class SharedAdaptiveLimit(AdaptiveLimit):
    """An adaptive limit that is one limit across processes.

    While :attr:`AdaptiveScopes.sharing`, samples go to Redis instead of the
    local rule, and :attr:`limit` is the limit the scope's leader published
    (see the module); otherwise it is the plain
    :class:`~._algorithms.concurrency.AdaptiveLimit`.
    """

    __slots__ = (
        "__weakref__",
        "_scopes",
        "active_at",
        "fed_at",
        "published",
        "scope_id",
    )

    def __init__(
        self,
        algorithm: LatencyLimit,
        *,
        ceiling: int,
        no_ceiling: int,
        scope_id: ScopeID,
        scopes: AdaptiveScopes,
    ) -> None:
        super().__init__(algorithm, ceiling=ceiling, no_ceiling=no_ceiling)
        self.scope_id = scope_id
        self._scopes = scopes
        #: The limit last published for the scope (``None``: none yet).
        self.published: int | None = None
        #: When this process last sent or heard from the scope (its clock).
        self.active_at = scopes.now()
        #: The latest time a sample was fed at: a drain that follows local
        #: feeding (led alone) never feeds the rule an earlier time.
        self.fed_at = float("-inf")
        scopes.register(self)

    @property
    def own_limit(self) -> int:
        """This process's own adaptive limit (the leader's is the shared one)."""
        return self._current

    @property
    def limit(self) -> int:
        published = self.published
        if published is None or not self._scopes.shared(self.scope_id):
            return self._current
        return max(1, min(published, self.ceiling))

    def on_sent(self, now: float, in_flight: int) -> None:
        self.active_at = now
        if self._scopes.shared(self.scope_id):
            return  # the check that admitted it recorded the send in Redis
        self.fed_at = max(self.fed_at, now)
        super().on_sent(now, in_flight)

    def on_overload(self, now: float) -> None:
        self.active_at = now
        if self._scopes.shared(self.scope_id):
            self._scopes.add_sample(self.scope_id, "o", 0.0)
            return
        self.fed_at = max(self.fed_at, now)
        super().on_overload(now)

    def on_response(
        self, now: float, latency: float, in_flight: int, *, error: bool
    ) -> bool:
        self.active_at = now
        if not self._scopes.shared(self.scope_id):
            self.fed_at = max(self.fed_at, now)
            return super().on_response(now, latency, in_flight, error=error)
        self._scopes.add_sample(self.scope_id, "e" if error else "r", latency)
        return False

    @property
    def baseline(self) -> float:
        """The baseline latency to publish with the limit (-1: none yet)."""
        best = self.algorithm.best
        return -1.0 if best is None else best

    def adopt(self, now: float, limit: str, baseline: str) -> None:
        """Lead on from the *limit* and *baseline* the previous leader
        published (``''``: none), instead of from this process's own
        limit, which no sample fed while another process led."""
        try:
            value = int(limit)
            best = float(baseline) if baseline else None
        except ValueError:  # none published, or not by this package
            return
        self.algorithm.adopt(now, value, best)
        self._current = self.algorithm.current()

    def feed(self, kind: str, now: float, latency: float, in_flight: int) -> None:
        """Feed one sample of any process (the leader does). Once the whole
        limit changes, the algorithm is held (see ``LatencyLimit.hold``)
        until :meth:`release`: the change is enforced only once published."""
        if kind == "w":
            return  # a send kept waiting: only a sign of another process
        before = self._current
        now = self.fed_at = max(self.fed_at, now)
        if kind == "s":
            super().on_sent(now, in_flight)
        elif kind == "o":
            super().on_overload(now)
        else:
            super().on_response(now, latency, in_flight, error=kind == "e")
        if self._current != before:
            self.algorithm.hold(now)

    def release(self, now: float) -> None:
        """The limit is published: its change is enforced from *now* on."""
        self.algorithm.release(now)


def share_limit(
    crawler: Crawler, scope_id: ScopeID, limit: ConcurrencyLimit, no_ceiling: int
) -> ConcurrencyLimit:
    """*limit*, shared across processes when it is adaptive and the crawl
    has :setting:`THROTTLING_STATE_URL`; else *limit* itself."""
    scopes = _SHARED.get(crawler)
    if scopes is None or type(limit) is not AdaptiveLimit:
        return limit
    return SharedAdaptiveLimit(
        limit.algorithm,
        ceiling=limit.ceiling,
        no_ceiling=no_ceiling,
        scope_id=scope_id,
        scopes=scopes,
    )


class AdaptiveScopes:
    """The adaptive scopes of one process's shared state: their samples not
    sent yet, and their leads (see the module).

    :param connection: the shared state, whose calls count and fall back.
    :param key: ``key(kind, scope)``, the Redis key of a scope.
    :param schedule: Scrapy's ``call_later`` (``None``: :meth:`lead` is
        called by hand, as in unit tests).
    :param send_soon: arms the sending of :attr:`samples` (with the next
        check or release).
    """

    def __init__(
        self,
        connection: SharedConnection,
        key: Callable[[str, ScopeID], str],
        schedule: Callable[[float, Callable[[], None]], Any] | None,
        send_soon: Callable[[], None],
    ) -> None:
        self._connection = connection
        self._key = key
        self._schedule = schedule
        self._send_soon = send_soon
        self._script = connection._client.register_script(LEADER_SCRIPT)
        self._publisher = connection._client.register_script(PUBLISH_SCRIPT)
        self._resigner = connection._client.register_script(RESIGN_SCRIPT)
        self._id = uuid.uuid4().hex
        self.limits: weakref.WeakValueDictionary[ScopeID, SharedAdaptiveLimit] = (
            weakref.WeakValueDictionary()
        )
        #: Samples not sent yet: ``(samples key, lease key, "kind latency")``.
        self.samples: list[tuple[str, str, str]] = []
        #: The scopes this process leads.
        self.leading: set[ScopeID] = set()
        #: The scopes this process leads alone (see the module): their
        #: samples are fed here as they come, none goes to Redis.
        self.alone: set[ScopeID] = set()
        #: Per samples key, the samples this process sent since the last
        #: drain (its answers, and the sends its checks recorded): a drain
        #: of no more than these holds no other process's sample.
        self._sent: dict[str, int] = {}
        self._timer: Any = None
        #: When the armed timer fires (on the connection's clock).
        self._timer_due = 0.0
        #: The scopes another process led at this process's last try.
        self._followed: set[ScopeID] = set()
        self._closed = False

    def install(self, crawler: Crawler) -> None:
        """Share the adaptive scopes *crawler* builds from now on."""
        _SHARED[crawler] = self

    @property
    def sharing(self) -> bool:
        return self._connection.sharing

    def shared(self, scope_id: ScopeID) -> bool:
        """Whether *scope_id*'s samples go to Redis and its limit is the
        published one (sharing, and not led alone)."""
        return self._connection.sharing and scope_id not in self.alone

    def now(self) -> float:
        return self._connection._clock()

    def register(self, limit: SharedAdaptiveLimit) -> None:
        self.limits[limit.scope_id] = limit
        if self._schedule is None or self._closed:
            return
        if self._timer is not None:
            if self._timer_due <= self.now() + LEADER_INTERVAL:
                return
            # Following only: a new scope may be free to lead.
            with suppress(Exception):  # already fired
                self._timer.cancel()
        self._arm(LEADER_INTERVAL)

    def _arm(self, delay: float) -> None:
        assert self._schedule is not None
        self._timer_due = self.now() + delay
        self._timer = self._schedule(delay, self._on_timer)

    def ceiling(self, scope_id: ScopeID) -> int:
        """The ceiling the check script caps a published limit of *scope_id*
        with (0: the scope is not adaptive, or led alone: the check enforces
        this process's limit and records no sample)."""
        limit = self.limits.get(scope_id)
        if limit is None or scope_id in self.alone:
            return 0
        return limit.ceiling

    def recorded_sample(self, scope_id: ScopeID) -> None:
        """A check recorded a sample of the adaptive *scope_id* in Redis: a
        send (``s``), or a send kept waiting by the leases (``w``)."""
        key = self._key("samples", scope_id)
        self._sent[key] = self._sent.get(key, 0) + 1

    def add_sample(self, scope_id: ScopeID, kind: str, latency: float) -> None:
        self.samples.append(
            (
                self._key("samples", scope_id),
                self._key("lease", scope_id),
                f"{kind} {latency:.6f}",
            )
        )
        self._send_soon()

    def take_samples(self) -> list[tuple[str, str, str]]:
        """The samples not sent yet, for the round trip about to send them."""
        samples, self.samples = self.samples, []
        sent = self._sent
        for key, _, _ in samples:
            sent[key] = sent.get(key, 0) + 1
        return samples

    def forget(self) -> None:
        """Redis is lost: the samples not sent are dropped, and no scope is
        led (alone or not) until a drain says so again."""
        self.samples = []
        self._sent.clear()
        self.alone.clear()
        self._followed.clear()

    def published(self, scope_id: ScopeID, value: int) -> None:
        """The check script read *value* (-1: none) as *scope_id*'s limit."""
        limit = self.limits.get(scope_id)
        if limit is not None:
            limit.published = None if value < 0 else int(value)

    def _on_timer(self) -> None:
        self._timer = None
        if self._closed:
            return
        self.lead()
        if self.limits:
            since = self.now() - ACTIVE_FOR
            following = all(
                limit.scope_id in self._followed
                for limit in self.limits.values()
                if limit.active_at >= since
            )
            self._arm(FOLLOW_INTERVAL if following else LEADER_INTERVAL)

    def lead(self) -> None:
        """Renew or take the lead of each adaptive scope, feed the samples
        of the scopes led to their limits and publish them (one round trip)."""
        if not self.sharing or not self.limits:
            return
        # Only the scopes this process used lately: a broad crawl's idle
        # scopes cost nothing, and the lead of a scope moves to a process
        # that uses it (the others take it 1 s after this one stops).
        since = self.now() - ACTIVE_FOR
        limits = [limit for limit in self.limits.values() if limit.active_at >= since]
        self.leading.intersection_update(limit.scope_id for limit in limits)
        self.alone.intersection_update(self.leading)
        if not limits:
            return
        keys: list[str] = []
        args: list[Any] = [
            self._id,
            round(LEADER_TTL * 1000),
            round(LIMIT_TTL * 1000),
        ]
        sent: list[int] = []
        for limit in limits:
            keys += (
                self._key("leader", limit.scope_id),
                self._key("samples", limit.scope_id),
                self._key("limit", limit.scope_id),
                self._key("baseline", limit.scope_id),
            )
            value = limit.own_limit if limit.scope_id in self.leading else -1
            sent.append(value)
            args += (value, f"{limit.baseline:.6f}")
        try:
            answer = self._connection._call(self._script, keys, args, purpose="lead")
        except RedisFailure:
            return
        server_now = int(answer[0]) / 1e6
        offset = self._connection._clock() - server_now
        changed: list[SharedAdaptiveLimit] = []
        own = self._sent
        self._sent = {}
        for limit, value, entry in zip(limits, sent, answer[1:], strict=True):
            scope_id = limit.scope_id
            drained = len(entry) - 3
            sent_here = own.get(self._key("samples", scope_id), 0)
            if not int(entry[0]):
                self.leading.discard(scope_id)
                self.alone.discard(scope_id)
                self._followed.add(scope_id)
                continue
            self._followed.discard(scope_id)
            if scope_id not in self.leading:
                # Taken over (or first led): go on from the published limit.
                self.leading.add(scope_id)
                limit.adopt(server_now + offset, _decode(entry[1]), _decode(entry[2]))
            alone = scope_id in self.alone
            if alone and drained:
                # Another process's samples: share the limit again.
                self.alone.discard(scope_id)
            last = 0.0
            for sample in entry[3:]:
                kind, stamp, latency, in_flight = _decode(sample).split()
                last = max(last, int(stamp) / 1e6 + offset)
                limit.feed(kind, last, float(latency), int(in_flight))
            if not alone and drained and drained == sent_here:
                # Every sample was this process's own: lead alone.
                self.alone.add(scope_id)
                if limit.algorithm.held:
                    limit.release(self.now())
            limit.published = limit.own_limit
            if limit.own_limit != value or limit.algorithm.held:
                changed.append(limit)
        if changed:
            self._publish(changed)

    def _publish(self, changed: list[SharedAdaptiveLimit]) -> None:
        """Publish the limits a drain changed at once (one round trip): they
        are enforced from then on (and, if Redis is lost, locally)."""
        keys: list[str] = []
        args: list[Any] = [self._id, round(LIMIT_TTL * 1000)]
        for limit in changed:
            keys += (
                self._key("leader", limit.scope_id),
                self._key("limit", limit.scope_id),
                self._key("baseline", limit.scope_id),
            )
            args += (limit.own_limit, f"{limit.baseline:.6f}")
        with suppress(RedisFailure):
            self._connection._call(self._publisher, keys, args, purpose="publish")
        now = self.now()
        for limit in changed:
            limit.release(now)

    def close(self) -> None:
        """Stop leading (the crawl ends): give the leads up, so that another
        process takes them at its next renewal, with the limit published."""
        self._closed = True
        if self._timer is not None:
            timer, self._timer = self._timer, None
            with suppress(Exception):  # already fired
                timer.cancel()
        leading, self.leading = self.leading, set()
        self.alone.clear()
        if leading and self.sharing:
            with suppress(RedisFailure):
                self._connection._call(
                    self._resigner,
                    [self._key("leader", scope_id) for scope_id in leading],
                    [self._id],
                    purpose="resign",
                )


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
