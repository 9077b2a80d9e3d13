"""The pace learned from 429 answers, one pace per scope across processes.

Without sharing, each process learns the pace of a rate-limited scope from
its own sends (:class:`~._algorithms.LearnedRate`): four processes against
an API that allows R requests/s each count their share at the moment of
their first refusal (low while the others ramp up, measured 3 to 42
requests/s with R = 50), keep it until a probe 30 windows later, and
together pace at anything from 0.3 to 1.8 R, paying a shared
``Retry-After`` hold for each overshoot (``bench/RESULTS.md``, "The shared
pace of a rate-limited API"). With :setting:`THROTTLING_STATE_URL`:

* the check script that admits a send adds it to the scope's ``sends``
  sorted set (server time), kept 2 s: the *global* count of the scope's
  sends;
* a 429 goes to :data:`~._redis_scripts.REFUSE_SCRIPT`, which records it
  and claims the episode for the first process refused (a key set with
  ``NX`` for a period): that process learns the pace from the global count
  (every process's sends over the second before the refused one, minus the
  refusals) and publishes what it learned (the ``pace`` key); the refusals
  of the other processes in that episode are only counted. As in one
  process, the count starts at the scope's first refusal (the ``counted``
  key keeps when, for :data:`PACE_TTL`): the first 429 only holds the
  scope, and the next episode learns from the sends since. Counting from
  the crawl's start instead, one 429 of one page in its first tenth of a
  second set a pace of a few requests a second on every process, for the
  30 windows before a probe (a 2-process test crawl of 30 pages each took
  9-23 s instead of 3);
* every check passes the scope's pace state this process knows, and gets
  back the published one when it differs: the process takes it over
  (:meth:`~._algorithms.LearnedRate.adopt`), so every process has the same
  interval and, since the probing schedule follows from that state and the
  time, probes at the same moments;
* every check passes the pace's interval, and the script spaces the
  scope's sends by it on one schedule for all processes (the shared
  next-send time): the host sees one pace, not four.

No round trip is added per send (the count and the pace ride on the
check); a 429 costs two (the refusal and, for the process that learns from
it, the publication) besides its hold. While Redis is lost, each process
keeps its own copy of the pace and spaces its own sends by that interval
times :setting:`THROTTLING_STATE_PROCESSES` (its share), and a refusal is
learned from its own sends, as without sharing.
"""

from __future__ import annotations

import weakref
from contextlib import suppress
from typing import TYPE_CHECKING, Any, NamedTuple

from ._algorithms.ratelimit import LearnedState
from ._redis_client import RedisFailure
from ._redis_scripts import PACE_SCRIPT, REFUSE_SCRIPT

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from ._scope import Scope
    from ._shared_connection import SharedConnection
    from ._types import ScopeID

__all__ = ["PACE_TTL", "Refusal", "SharedPace", "SharedPaces", "share_pace"]

#: Seconds a published pace outlives its last publication: a process that
#: starts later (or a scope evicted and built again) takes it over.
PACE_TTL = 3600.0

#: How many of the latest sends' lease tokens are kept (see
#: :meth:`SharedPaces.sent`): a 429 comes back within seconds, thousands
#: of sends later at most.
SENT_TOKENS = 4096

#: The shared paces of each crawler with :setting:`THROTTLING_STATE_URL`.
_SHARED: weakref.WeakKeyDictionary[Crawler, SharedPaces] = weakref.WeakKeyDictionary()


class Refusal(NamedTuple):
    """What the shared state says of a 429 (see :meth:`SharedPace.refuse`)."""

    #: The requests every process got accepted over the period before the
    #: refused one; ``None``: another process learns from this episode.
    accepted: float | None
    #: The server's time of the refusal (µs), the version of what it teaches.
    server_time: int


class SharedPace:
    """The link between one scope's learned pace and the shared state."""

    __slots__ = ("__weakref__", "_paces", "_scope", "scope_id", "state")

    def __init__(self, scope: Scope, paces: SharedPaces) -> None:
        self.scope_id: ScopeID = scope.id
        self._scope = weakref.ref(scope)
        self._paces = paces
        #: The published pace state this process has (``""``: none).
        self.state = ""

    @property
    def sharing(self) -> bool:
        """Whether Redis answers (else each process keeps its share)."""
        return self._paces.connection.sharing

    def processes(self) -> int:
        """How many processes pace on their own copy of the pace: 1 while
        sharing (the check script spaces every process's sends), else
        :setting:`THROTTLING_STATE_PROCESSES`."""
        connection = self._paces.connection
        return 1 if connection.sharing else connection.config.processes

    def interval(self) -> float:
        """The interval the check script spaces the scope's sends by
        (seconds, 0.0: no pace learned)."""
        scope = self._scope()
        learned = None if scope is None else scope.learned
        return 0.0 if learned is None else learned.interval

    def refuse(
        self, now: float, sent_at: float | None, *, learn: bool = True
    ) -> Refusal | None:
        """Record a 429 of this scope in Redis (*sent_at*: when the refused
        request was sent, on the clock of *now*); ``None`` when Redis is
        lost (learn from this process's own sends). *learn* ``False`` (the
        retry of a request refused before): counted, never the refusal an
        episode is learned from."""
        return self._paces.refuse(self, now, sent_at, learn=learn)

    def publish(self, state: LearnedState, refusal: Refusal) -> None:
        """Publish what the refusal *refusal* taught this process."""
        self._paces.publish(self, state, refusal)

    def adopt(self, published: str, server_now: int) -> None:
        """Take over the pace state *published* by another process (the
        check read it at *server_now*, µs)."""
        scope = self._scope()
        try:
            version, interval, patience, hold, accepted = published.split()
            state = LearnedState(
                float(interval),
                int(patience),
                float(hold),
                None if accepted == "-" else float(accepted),
            )
            age = (server_now - int(version)) / 1e6
        except ValueError:
            return  # not a state of this version: learn anew
        self.state = published
        if scope is not None and state.interval > 0:
            scope.adopt_pace(state, scope.clock() - max(0.0, age))


class SharedPaces:
    """The shared paces of one process's scopes (see the module).

    :param connection: the shared state, whose calls count and fall back.
    :param key: ``key(kind, scope)``, the Redis key of a scope.
    """

    def __init__(self, connection: SharedConnection, key: Any) -> None:
        self.connection = connection
        self._key = key
        self._refuse = connection._client.register_script(REFUSE_SCRIPT)
        self._publish = connection._client.register_script(PACE_SCRIPT)
        self.paces: weakref.WeakValueDictionary[ScopeID, SharedPace] = (
            weakref.WeakValueDictionary()
        )
        self._refusals = 0
        #: The lease tokens of the latest sends by their send time (this
        #: process's clock): a refusal's token gives its send's exact place
        #: among the scope's sends (its server time).
        self._tokens: dict[float, str] = {}

    def install(self, crawler: Crawler) -> None:
        """Share the paces of the scopes *crawler* builds from now on."""
        _SHARED[crawler] = self

    def register(self, scope: Scope) -> SharedPace:
        pace = self.paces[scope.id] = SharedPace(scope, self)
        return pace

    def sent(self, sent_at: float, token: str) -> None:
        """A send at *sent_at* took the lease *token*."""
        tokens = self._tokens
        tokens[sent_at] = token
        if len(tokens) > SENT_TOKENS:
            del tokens[next(iter(tokens))]

    def check_args(self, scope_id: ScopeID) -> tuple[int, str]:
        """The pace arguments of a check of *scope_id*: its interval (µs)
        and the pace state this process has."""
        pace = self.paces.get(scope_id)
        if pace is None:
            return 0, ""
        return max(0, round(pace.interval() * 1e6)), pace.state

    def published(self, scope_id: ScopeID, value: Any, server_now: int) -> None:
        """The check read *value* as the pace of *scope_id* (empty: the one
        this process has)."""
        if not value:
            return
        pace = self.paces.get(scope_id)
        if pace is not None:
            pace.adopt(_decode(value), server_now)

    def refuse(
        self, pace: SharedPace, now: float, sent_at: float | None, *, learn: bool = True
    ) -> Refusal | None:
        connection = self.connection
        if not connection.sharing:
            return None
        scope_id = pace.scope_id
        scope = pace._scope()
        period = 1.0 if scope is None or scope.learned is None else scope.learned.period
        age = -1 if sent_at is None else max(0, round((now - sent_at) * 1e6))
        token = "" if sent_at is None else self._tokens.get(sent_at, "")
        self._refusals += 1
        keys = [
            self._key(kind, scope_id)
            for kind in ("sends", "refused", "episode", "counted")
        ]
        args = [
            age,
            round(period * 1e6),
            f"r{id(self):x}:{self._refusals}",
            token,
            round(PACE_TTL * 1000),
            1 if learn else 0,
        ]
        try:
            answer = connection._call(self._refuse, keys, args, purpose="refuse")
        except RedisFailure:
            return None
        server_time = int(answer[1])
        if not int(answer[0]):
            return Refusal(None, server_time)
        return Refusal(float(answer[2]), server_time)

    def publish(self, pace: SharedPace, state: LearnedState, refusal: Refusal) -> None:
        if state.interval <= 0:
            return
        accepted = "-" if state.accepted is None else repr(state.accepted)
        published = (
            f"{refusal.server_time} {state.interval!r} {state.patience} "
            f"{state.hold!r} {accepted}"
        )
        pace.state = published
        with suppress(RedisFailure):
            self.connection._call(
                self._publish,
                [self._key("pace", pace.scope_id)],
                [published, round(PACE_TTL * 1000)],
                purpose="pace",
            )


def share_pace(crawler: Crawler, scope: Scope) -> None:
    """Give *scope* its shared pace when the crawl has
    :setting:`THROTTLING_STATE_URL`."""
    paces = _SHARED.get(crawler)
    if paces is not None:
        scope.shared_pace = paces.register(scope)


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
