"""A scheduler priority queue that only hands out requests their scopes allow.

Requests wait in the scheduler, not in the downloader, so a throttled scope
never occupies a slot of :setting:`CONCURRENT_REQUESTS` (no head-of-line
blocking), and the engine is woken by a timer when a time gate opens.

Cost per request does not grow with the number of scopes: each scope set
(the set of scopes of a request) has its own queue, and a queue is in
exactly one of three places: a heap of queues that may be sendable
(ordered by priority, then round-robin), a heap of queues waiting for a
time gate (ordered by when it opens), or the waiting list of the scope
whose concurrency blocks it, from which one queue is woken per freed slot.
A dequeue looks at a queue only when something that could unblock it
happened, never scans every scope.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import logging
import pickle
from collections import deque
from contextlib import suppress
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from scrapy.pqueues import ScrapyPriorityQueue, _path_safe
from scrapy.utils.asyncio import call_later

from ._containment import (
    component_of,
    fail_request,
    host_scope,
    report,
)
from ._crawler_throttler import get_throttler
from ._meta_keys import DELAY_DEADLINE_META_KEY, DELAYED_META_KEY
from ._queue_gate import queue_gate
from ._types import RESOLVED_SCOPES_META_KEY, RequestScopes, ScopeID, iter_scope_values

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.utils.asyncio import CallLaterResult
    from typing_extensions import Self

    from ._queue_gate import QueueGate, ScopeValues

logger = logging.getLogger(__name__)

_READY, _TIMED, _BLOCKED = 0, 1, 2
_SEPARATOR = "\n"


#: Quota shares are told apart in steps of 1/_SHARE_STEPS of the quota.
_SHARE_STEPS = 20
#: Queue directory names longer than this (in bytes) are shortened, keeping a
#: hash of the whole name: most file systems allow 255 bytes.
_MAX_DIR_NAME_BYTES = 200
#: The most buckets looked at for a request that fits in what is left of a
#: quota when the head of its queue does not.
_BACKFILL_BUCKETS = 32


class _ScopeSetQueue(ScrapyPriorityQueue):
    """The requests of one scope set, by priority, then larger quota share
    first, then FIFO.

    Each request priority spans ``_SHARE_STEPS + 1`` internal priorities: the
    larger the share of a scope's quota a request consumes, the earlier it
    comes among requests of its priority (the chapter's "everything else
    being equal" preference), so that a large request gets the start of a
    quota window instead of waiting for a window that no small one has
    touched yet. Requests without a quota amount come last.
    """

    #: Quota of each quota scope of the set.
    quotas: Mapping[ScopeID, float] = MappingProxyType({})

    def priority(self, request: Request) -> int:
        rank = _SHARE_STEPS
        if self.quotas:
            share = _quota_share(request, self.quotas)
            rank -= round(min(share, 1.0) * _SHARE_STEPS)
        return -request.priority * (_SHARE_STEPS + 1) + rank

    def iter_heads(self) -> Iterator[tuple[int, bool, Request]]:
        """``(priority, is_start, head)`` of each internal queue, in pop order."""
        for priority in sorted({*self.queues, *self._start_queues})[:_BACKFILL_BUCKETS]:
            for is_start, queues in ((False, self.queues), (True, self._start_queues)):
                queue = queues.get(priority)
                if queue:
                    yield priority, is_start, queue.peek()  # type: ignore[attr-defined]

    def pop_from(self, priority: int, is_start: bool) -> Request | None:
        """Pop the head of one internal queue (see :meth:`iter_heads`)."""
        queues = self._start_queues if is_start else self.queues
        queue = queues[priority]
        request: Request | None = queue.pop()
        if not queue:
            del queues[priority]
            queue.close()
            self._update_curprio()
        return request

    def peek(self) -> Request | None:
        # Same preference as pop() (regular queue first at equal priority);
        # ScrapyPriorityQueue.peek prefers the start queue and can disagree.
        if self.curprio is None:
            return None
        queue = self.queues.get(self.curprio) or self._start_queues.get(self.curprio)
        return queue.peek() if queue is not None else None  # type: ignore[attr-defined]


class _Entry:
    __slots__ = ("key", "needs_head", "queue", "scopes", "seq", "state")

    def __init__(
        self, key: str, scopes: list[ScopeID], queue: _ScopeSetQueue, needs_head: bool
    ):
        self.key = key
        self.scopes = scopes
        self.queue = queue
        self.needs_head = needs_head
        self.state = _READY
        self.seq = 0


def _quota_share(request: Request, quotas: Mapping[ScopeID, float]) -> float:
    """The largest share of a quota that *request* consumes (0.0 for none)."""
    share = 0.0
    for scope, amount in iter_scope_values(request.meta.get(RESOLVED_SCOPES_META_KEY)):
        quota = quotas.get(scope)
        if quota and isinstance(amount, int | float) and amount > 0:
            share = max(share, amount / quota)
    return share


def _scope_list(scopes: RequestScopes) -> list[ScopeID]:
    if scopes is None:
        return []
    if isinstance(scopes, str):
        return [scopes]
    return sorted(set(scopes.keys() if isinstance(scopes, dict) else scopes))


class ThrottlingAwarePriorityQueue:
    """The default :setting:`SCHEDULER_PRIORITY_QUEUE` with the add-on.

    Works with Scrapy's stock scheduler: scopes are resolved when a request
    is pushed (asynchronously only if :meth:`get_scopes` really awaits), and
    :meth:`pop` returns only a request that every one of its scopes allows
    now, reserving it; ``None`` means nothing is sendable yet, and a timer
    wakes the engine when the earliest time gate opens.
    """

    @classmethod
    def from_crawler(
        cls,
        crawler: Crawler,
        downstream_queue_cls: type[Any],
        key: str,
        startprios: dict[str, Iterable[int]] | None = None,
        *,
        start_queue_cls: type[Any] | None = None,
    ) -> Self:
        return cls(
            crawler,
            downstream_queue_cls,
            key,
            startprios,
            start_queue_cls=start_queue_cls,
        )

    def __init__(
        self,
        crawler: Crawler,
        downstream_queue_cls: type[Any],
        key: str,
        startprios: dict[str, Iterable[int]] | None = None,
        *,
        start_queue_cls: type[Any] | None = None,
    ) -> None:
        if startprios and not isinstance(startprios, dict):
            raise ValueError(
                f"{type(self).__name__} accepts startprios as a dict; got "
                f"{type(startprios).__name__}. The job directory was most likely "
                "written with another SCHEDULER_PRIORITY_QUEUE; only a crawl "
                "started with the same priority queue class can be resumed."
            )
        self.crawler = crawler
        self.throttler = get_throttler(crawler)
        self.downstream_queue_cls = downstream_queue_cls
        self.key = key
        self._start_queue_cls = start_queue_cls
        self._entries: dict[str, _Entry] = {}
        # Queues that may be sendable: a FIFO per priority (appending with an
        # increasing sequence number keeps each FIFO in round-robin order), and
        # a heap of the few distinct priorities, so a dequeue is O(1).
        self._ready: dict[int, deque[tuple[int, str]]] = {}
        self._ready_priorities: list[int] = []
        self._timed: list[tuple[float, int, str]] = []
        self._blocked: dict[ScopeID, deque[str]] = {}
        self._delayed: list[tuple[float, int, Request]] = []
        self._seq = 0
        self._size = 0
        self._resolving = 0
        self._wakeup: CallLaterResult | None = None
        #: The request being reserved, for _fail_head if reserving it fails.
        self._reserving: Request | None = None
        self._wakeup_at = float("inf")
        # The manager itself when it is the plugin's (its bound methods: no
        # adapter on the hot path), else an adapter built from the protocol.
        self.gate: QueueGate = queue_gate(crawler, self.throttler)
        # The manager's clocks: its scopes and this queue agree on "now".
        self._clock = self.gate.clock
        self._wall_clock = self.gate.wall_clock
        self._check = self.gate.check_scopes
        self._reserve = self.gate.reserve_scopes
        self._resolve_now = self.gate.resolve_scopes_now
        self._needs_head = self.gate.needs_head
        self._quotas = dict(self.gate.quotas)
        self.gate.add_release_listener(self._on_release)
        # Scope sets waiting for a time gate, by scope: a cache hit that gives
        # its send back opens that scope's gate early (_on_timer_opened).
        self._timed_by_scope: dict[ScopeID, set[str]] = {}
        self.gate.add_timer_listener(self._on_timer_opened)
        for json_key, prios in (startprios or {}).items():
            scopes = json.loads(json_key)
            entry = self._entry(scopes, prios)
            self._size += len(entry.queue)
            if len(entry.queue):
                self._make_ready(entry)

    # -- queue bookkeeping ------------------------------------------------------

    def _entry(self, scopes: list[ScopeID], startprios: Iterable[int] = ()) -> _Entry:
        key = _SEPARATOR.join(scopes)
        entry = self._entries.get(key)
        if entry is None:
            queue = _ScopeSetQueue(
                self.crawler,
                self.downstream_queue_cls,
                self._subdir(scopes),
                startprios,
                start_queue_cls=self._start_queue_cls,
            )
            queue.quotas = {s: self._quotas[s] for s in scopes if s in self._quotas}
            needs_head = self._needs_head or bool(queue.quotas)
            entry = _Entry(key, scopes, queue, needs_head)
            entry.state = _BLOCKED  # not anywhere yet; _make_ready puts it in the heap
            self._entries[key] = entry
        return entry

    def _subdir(self, scopes: list[ScopeID]) -> str:
        if not self.key:
            return ""
        return self.key + "/" + _dir_name(json.dumps(scopes))

    def _make_ready(self, entry: _Entry) -> None:
        if entry.state == _TIMED:
            self._unindex_timed(entry)
        self._seq += 1
        entry.seq = self._seq
        entry.state = _READY
        priority = entry.queue.curprio or 0
        fifo = self._ready.get(priority)
        if fifo is None:
            fifo = self._ready[priority] = deque()
            heapq.heappush(self._ready_priorities, priority)
        fifo.append((entry.seq, entry.key))

    def _unindex_timed(self, entry: _Entry) -> None:
        index = self._timed_by_scope
        for scope in entry.scopes:
            keys = index.get(scope)
            if keys is not None:
                keys.discard(entry.key)
                if not keys:
                    del index[scope]

    def _on_timer_opened(self, scope_id: ScopeID) -> None:
        keys = self._timed_by_scope.get(scope_id)
        if not keys:
            return
        entries = self._entries
        for key in list(keys):
            entry = entries.get(key)
            if entry is not None and entry.state == _TIMED:
                # Looked at again by the next pop; its old timer goes stale.
                self._make_ready(entry)
            else:
                keys.discard(key)
        if not keys:
            self._timed_by_scope.pop(scope_id, None)

    def _remove(self, entry: _Entry) -> None:
        if entry.state == _TIMED:
            self._unindex_timed(entry)
        del self._entries[entry.key]
        entry.queue.close()
        if self.key:
            with suppress(OSError):
                Path(self._subdir(entry.scopes)).rmdir()

    # -- push -----------------------------------------------------------------

    def push(self, request: Request) -> None:
        """Queue *request* under its scope set (resolving its scopes now)."""
        if self._hold_if_delayed(request):
            return
        try:
            resolved = self._resolve(request)
        except Exception as exc:
            resolved = self._host_scope(request, exc)
        if not hasattr(resolved, "addCallback"):
            self._push_resolved(request, resolved)
            return
        if self.key:
            # The scheduler falls back to the memory queue on ValueError, which
            # it can only do now, not once the scopes are known.
            self._check_serializable(request)
        self._resolving += 1
        self._size += 1
        resolved.addCallbacks(
            lambda scopes: self._on_resolved(request, scopes),
            lambda failure: self._on_resolved(request, None, failure),
        )

    def _hold_if_delayed(self, request: Request) -> bool:
        """Hold *request* aside while its ``throttling_delay`` runs."""
        delay = self.gate.get_request_delay(request)
        if delay <= 0:
            return False
        # Held in memory; at close it goes to its queue with its wall-clock
        # deadline, which pop() honours after a resume.
        self._seq += 1
        heapq.heappush(self._delayed, (self._wall_clock() + delay, self._seq, request))
        self._size += 1
        self._arm_wakeup(self._clock() + delay)
        return True

    def _resolve(self, request: Request) -> Any:
        """The scopes of *request*, or a Deferred firing with them."""
        return self._resolve_now(request)

    def _host_scope(self, request: Request, error: BaseException) -> RequestScopes:
        """Queue *request* with the scope of its host after *error*."""
        report(
            request,
            component_of(error, f"{_name(self.throttler)}.get_scopes()"),
            error,
            "it is throttled with the scope of its host",
            self.crawler.stats,
        )
        scopes = host_scope(request)
        request.meta[RESOLVED_SCOPES_META_KEY] = scopes
        return scopes

    def _on_resolved(
        self, request: Request, scopes: RequestScopes, failure: Any = None
    ) -> None:
        self._resolving -= 1
        self._size -= 1
        if failure is not None:
            scopes = self._host_scope(request, failure.value)
        try:
            self._push_resolved(request, scopes)
        except ValueError:
            logger.error(
                "Could not queue %s after resolving its scopes", request, exc_info=True
            )
            if self.crawler.stats is not None:
                self.crawler.stats.inc_value("throttling/scheduler/dropped_count")
            return
        self._wake_engine()

    def _push_resolved(self, request: Request, scopes: RequestScopes) -> None:
        entry = self._entry(_scope_list(scopes))
        queue = entry.queue
        was_empty = not len(queue)
        old_prio = queue.curprio
        try:
            queue.push(request)  # ValueError if it cannot be serialised
        except ValueError:
            if was_empty:
                self._remove(entry)
            raise
        self._size += 1
        if was_empty:
            self._make_ready(entry)
        elif entry.state == _READY and queue.curprio != old_prio:
            self._make_ready(entry)  # re-key: the old heap item becomes stale

    def _check_serializable(self, request: Request) -> None:
        try:
            pickle.dumps(request.to_dict(spider=self.crawler.spider), protocol=4)
        except Exception as exc:
            raise ValueError(f"Unable to serialize request {request}: {exc}") from exc

    # -- pop ------------------------------------------------------------------

    def pop(self) -> Request | None:
        """Return a request every scope of which allows it now, reserved."""
        now = self._clock()
        if self._delayed:
            self._promote_delayed()
        if self._timed and self._timed[0][0] <= now:
            self._promote_timed(now)
        ready = self._ready
        priorities = self._ready_priorities
        entries = self._entries
        while priorities:
            priority = priorities[0]
            fifo = ready[priority]
            if not fifo:
                heapq.heappop(priorities)
                del ready[priority]
                continue
            seq, key = fifo.popleft()
            entry = entries.get(key)
            if entry is None or entry.seq != seq or entry.state != _READY:
                continue  # stale item: the queue was re-keyed or moved since
            try:
                request = self._try_entry(entry, now)
            except Exception as exc:
                request = self._fail_head(entry, exc)
            if request is None:
                continue
            if DELAY_DEADLINE_META_KEY in request.meta and self._still_delayed(request):
                continue
            return request
        self._arm_next_wakeup()
        return None

    def _fail_head(self, entry: _Entry, error: Exception) -> Request | None:
        """A throttling component failed while *entry* was looked at: its head
        request goes to its errback (no reservation is kept), the rest of the
        queue stays sendable."""
        request = self._reserving
        self._reserving = None
        if request is None:
            request = entry.queue.pop()
            if request is None:  # pragma: no cover - a ready queue is not empty
                self._remove(entry)
                return None
            self._size -= 1
        if self._entries.get(entry.key) is entry:
            if len(entry.queue):
                self._make_ready(entry)
            else:
                self._remove(entry)
        component = component_of(error, f"{_name(self.throttler)}")
        report(request, component, error, "it is not sent", self.crawler.stats)
        fail_request(request, component, error)
        return request

    def _still_delayed(self, request: Request) -> bool:
        """Release and hold aside a request whose ``throttling_delay`` has not
        run out (restored from a job directory before its deadline)."""
        if self.gate.get_request_delay(request) <= 0:
            return False
        self.gate.release(request)
        self._hold_if_delayed(request)
        return True

    def _try_entry(self, entry: _Entry, now: float) -> Request | None:
        head: Request | None = None
        if entry.needs_head:
            head = entry.queue.peek()
            values = (
                list(iter_scope_values(head.meta.get(RESOLVED_SCOPES_META_KEY)))
                if head is not None
                else []
            )
        else:
            values = [(scope, None) for scope in entry.scopes]
        wait, blocked = self._check(values, now, head)
        request: Request | None
        backfill: tuple[Request, ScopeValues] | None = None
        held = wait > 0 or blocked is not None
        if held and head is not None and entry.queue.quotas:
            found = self._backfill(entry, head, values, now)
            if isinstance(found, str):
                # Only quota and a full slot hold the head back: wait for the
                # slot, after which a smaller request may fit.
                wait, blocked = 0.0, found
            else:
                backfill = found
        if backfill is not None:
            request, values = backfill
        elif wait > 0:
            entry.state = _TIMED
            self._seq += 1
            entry.seq = self._seq
            heapq.heappush(self._timed, (now + wait, entry.seq, entry.key))
            index = self._timed_by_scope
            for scope in entry.scopes:
                keys = index.get(scope)
                if keys is None:
                    index[scope] = {entry.key}
                else:
                    keys.add(entry.key)
            self._pass_on(entry)
            return None
        elif blocked is not None:
            entry.state = _BLOCKED
            self._blocked.setdefault(blocked, deque()).append(entry.key)
            self._pass_on(entry, skip=blocked)
            return None
        else:
            request = entry.queue.pop()
        assert request is not None
        self._size -= 1
        self._reserving = request
        self._reserve(request, values, now)
        self._reserving = None
        if len(entry.queue):
            self._make_ready(entry)
        else:
            self._remove(entry)
        self._pass_on(entry)
        return request

    def _backfill(
        self, entry: _Entry, head: Request, head_values: ScopeValues, now: float
    ) -> tuple[Request, ScopeValues] | ScopeID | None:
        """Pop a request of *entry* that fits in what is left of its quotas,
        when only quota holds its head back (no request waits behind a large
        one); the head keeps its place for the next window.

        Returns the popped request and its scope values, or the scope whose
        concurrency also holds the head back (look again when it frees a
        slot), or ``None``.
        """
        wait, blocked = self._check(
            [(scope, None) for scope, _ in head_values], now, head
        )
        if wait > 0:
            return None
        if blocked is not None:
            return str(blocked)
        queue = entry.queue
        for priority, is_start, request in queue.iter_heads():
            if request is head:
                continue
            values = list(iter_scope_values(request.meta.get(RESOLVED_SCOPES_META_KEY)))
            wait, blocked = self._check(values, now, request)
            if wait <= 0 and blocked is None:
                popped = queue.pop_from(priority, is_start)
                assert popped is request
                return request, values
        return None

    def _pass_on(self, entry: _Entry, skip: ScopeID | None = None) -> None:
        # A queue woken for a freed slot may not use it (another scope blocks
        # it, or it was just filled): wake the next waiter of each scope that
        # still has room, so that a free slot is never left unclaimed.
        blocked = self._blocked
        if not blocked:
            return
        for scope in entry.scopes:
            if scope != skip and scope in blocked and self.gate.has_free_slot(scope):
                self._on_release(scope)

    def _on_release(self, scope_id: ScopeID) -> None:
        waiting = self._blocked.get(scope_id)
        if not waiting:
            return
        entries = self._entries
        while waiting:
            entry = entries.get(waiting.popleft())
            if entry is not None and entry.state == _BLOCKED and len(entry.queue):
                self._make_ready(entry)
                break
        if not waiting:
            del self._blocked[scope_id]

    def _promote_timed(self, now: float) -> None:
        timed = self._timed
        entries = self._entries
        while timed and timed[0][0] <= now:
            _, seq, key = heapq.heappop(timed)
            entry = entries.get(key)
            if entry is not None and entry.seq == seq and entry.state == _TIMED:
                self._make_ready(entry)

    def _promote_delayed(self) -> None:
        wall = self._wall_clock()
        delayed = self._delayed
        while delayed and delayed[0][0] <= wall:
            _, _, request = heapq.heappop(delayed)
            self._size -= 1
            request.meta[DELAYED_META_KEY] = True
            self.push(request)

    # -- waking the engine ----------------------------------------------------

    def _arm_next_wakeup(self) -> None:
        at = float("inf")
        if self._timed:
            at = self._timed[0][0]
        if self._delayed:
            at = min(
                at, self._clock() + max(0.0, self._delayed[0][0] - self._wall_clock())
            )
        if at != float("inf"):
            self._arm_wakeup(at)

    def _arm_wakeup(self, at: float) -> None:
        if self._wakeup is not None and self._wakeup_at <= at:
            return
        if self._wakeup is not None:
            self._wakeup.cancel()
        self._wakeup_at = at
        self._wakeup = call_later(max(0.0, at - self._clock()), self._on_wakeup)

    def _on_wakeup(self) -> None:
        self._wakeup = None
        self._wakeup_at = float("inf")
        self._wake_engine()

    def _wake_engine(self) -> None:
        try:
            engine = self.crawler.engine
        except RuntimeError:  # the crawl has not started (or already ended)
            return
        slot = getattr(engine, "_slot", None)
        if slot is not None:
            slot.nextcall.schedule()

    # -- the rest of the priority-queue contract ------------------------------

    def peek(self) -> Request | None:
        """The request :meth:`pop` would try first (not reserved)."""
        for priority in sorted(self._ready):
            for seq, key in self._ready[priority]:
                entry = self._entries.get(key)
                if entry is not None and entry.seq == seq and entry.state == _READY:
                    return entry.queue.peek()
        return None

    def close(self) -> dict[str, list[int]]:
        """Close every queue and return the state needed to resume."""
        if self._wakeup is not None:
            self._wakeup.cancel()
            self._wakeup = None
        self.gate.remove_release_listener(self._on_release)
        self.gate.remove_timer_listener(self._on_timer_opened)
        while self._delayed:
            # Queued with their wall-clock deadline (not marked as delayed):
            # a resumed crawl holds them again until then (see pop()).
            _, _, request = heapq.heappop(self._delayed)
            self._size -= 1
            try:
                resolved = self._resolve(request)
                if hasattr(resolved, "addCallback"):
                    resolved.cancel()
                    resolved = host_scope(request)
                    request.meta[RESOLVED_SCOPES_META_KEY] = resolved
            except Exception as exc:
                resolved = self._host_scope(request, exc)
            try:
                self._push_resolved(request, resolved)
            except ValueError:
                logger.error(
                    "Could not persist delayed request %s", request, exc_info=True
                )
        state = {
            json.dumps(entry.scopes): entry.queue.close()
            for entry in self._entries.values()
        }
        self._entries.clear()
        return state

    def __len__(self) -> int:
        return self._size

    def __contains__(self, scope_set: Iterable[ScopeID]) -> bool:
        return _SEPARATOR.join(sorted(set(scope_set))) in self._entries


def _dir_name(text: str) -> str:
    """A directory name for *text*, safe on any file system whatever its
    length or characters (long ones keep a prefix and a hash of the whole)."""
    name = _path_safe(text)
    if len(name.encode()) <= _MAX_DIR_NAME_BYTES:
        return name  # as before, so that older job directories still resume
    digest = hashlib.sha1(text.encode()).hexdigest()
    prefix = name.encode()[: _MAX_DIR_NAME_BYTES - len(digest) - 1]
    return f"{prefix.decode(errors='ignore')}-{digest}"


def _name(component: object) -> str:
    cls = type(component)
    return f"{cls.__module__}.{cls.__qualname__}"
