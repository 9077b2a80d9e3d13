"""Where each scope set's queue waits, so that a dequeue never scans.

A queue is in exactly one of three places: the queues that may be sendable
(a FIFO per priority, round-robin within it, and a heap of the few distinct
priorities, so a dequeue is O(1)), a heap of queues waiting for a time gate
(by when it opens), or the waiting list of the scope whose concurrency
blocks it, from which one queue is woken per freed slot. Items left behind
in a FIFO or heap when a queue moves are told apart by the entry's
sequence number and skipped.

Requests with a :reqmeta:`throttling_delay` wait apart, before they join a
queue (:class:`DelayedRequests`).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from scrapy.utils.asyncio import call_later

from ._scope_set_queue import BLOCKED, READY, TIMED, ScopeSetEntry

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.utils.asyncio import CallLaterResult

    from ._types import ScopeID

__all__ = [
    "DelayedRequests",
    "EngineWakeup",
    "QueueSchedule",
    "engine_slot",
    "pending_scopes",
]


class QueueSchedule:
    """The scope-set queues of a scheduler queue, by key, and where each is."""

    def __init__(self) -> None:
        self.entries: dict[str, ScopeSetEntry] = {}
        self._ready: dict[int, deque[tuple[int, str]]] = {}
        self._ready_priorities: list[int] = []
        self._timed: list[tuple[float, int, str]] = []
        self._blocked: dict[ScopeID, deque[str]] = {}
        # Scope sets waiting for a time gate, by scope: a cache hit that gives
        # its send back opens that scope's gate early (on_timer_opened).
        self._timed_by_scope: dict[ScopeID, set[str]] = {}
        self._seq = 0

    def pending_scopes(self) -> set[ScopeID]:
        """The scopes of every scope set with a queue here."""
        return {scope for entry in self.entries.values() for scope in entry.scopes}

    def make_ready(self, entry: ScopeSetEntry) -> None:
        """Put *entry* with the queues that may be sendable (re-keyed by its
        current priority if it already was)."""
        if entry.state == TIMED:
            self._unindex_timed(entry)
        self._seq += 1
        entry.seq = self._seq
        entry.state = READY
        priority = entry.queue.curprio or 0
        fifo = self._ready.get(priority)
        if fifo is None:
            fifo = self._ready[priority] = deque()
            heapq.heappush(self._ready_priorities, priority)
        fifo.append((entry.seq, entry.key))

    def mark_timed(self, entry: ScopeSetEntry, at: float) -> None:
        """*entry* waits for a time gate that opens at *at*."""
        entry.state = TIMED
        self._seq += 1
        entry.seq = self._seq
        heapq.heappush(self._timed, (at, entry.seq, entry.key))
        index = self._timed_by_scope
        for scope in entry.scopes:
            keys = index.get(scope)
            if keys is None:
                index[scope] = {entry.key}
            else:
                keys.add(entry.key)

    def mark_blocked(self, entry: ScopeSetEntry, scope_id: ScopeID) -> None:
        """*entry* waits for a slot of *scope_id*."""
        entry.state = BLOCKED
        self._blocked.setdefault(scope_id, deque()).append(entry.key)

    def forget(self, entry: ScopeSetEntry) -> None:
        """Drop *entry* (its queue is empty)."""
        if entry.state == TIMED:
            self._unindex_timed(entry)
        del self.entries[entry.key]

    def _unindex_timed(self, entry: ScopeSetEntry) -> None:
        index = self._timed_by_scope
        for scope in entry.scopes:
            keys = index.get(scope)
            if keys is not None:
                keys.discard(entry.key)
                if not keys:
                    del index[scope]

    def next_ready(self) -> ScopeSetEntry | None:
        """Take the next queue that may be sendable (highest priority, then
        round-robin), or ``None``."""
        ready = self._ready
        priorities = self._ready_priorities
        entries = self.entries
        while priorities:
            priority = priorities[0]
            fifo = ready[priority]
            if not fifo:
                heapq.heappop(priorities)
                del ready[priority]
                continue
            seq, key = fifo.popleft()
            entry = entries.get(key)
            if entry is None or entry.seq != seq or entry.state != READY:
                continue  # stale item: the queue was re-keyed or moved since
            return entry
        return None

    def peek_ready(self) -> ScopeSetEntry | None:
        """The queue :meth:`next_ready` would take, left in place."""
        for priority in sorted(self._ready):
            for seq, key in self._ready[priority]:
                entry = self.entries.get(key)
                if entry is not None and entry.seq == seq and entry.state == READY:
                    return entry
        return None

    def next_timed_at(self) -> float | None:
        """When the earliest time gate a queue waits for opens, or ``None``."""
        return self._timed[0][0] if self._timed else None

    def promote_timed(self, now: float) -> None:
        """Make the queues whose time gate has opened by *now* ready."""
        timed = self._timed
        entries = self.entries
        while timed and timed[0][0] <= now:
            _, seq, key = heapq.heappop(timed)
            entry = entries.get(key)
            if entry is not None and entry.seq == seq and entry.state == TIMED:
                self.make_ready(entry)

    def on_timer_opened(self, scope_id: ScopeID) -> None:
        """A time gate of *scope_id* opened early: its timed queues are
        looked at again by the next dequeue (their old timers go stale)."""
        keys = self._timed_by_scope.get(scope_id)
        if not keys:
            return
        entries = self.entries
        for key in list(keys):
            entry = entries.get(key)
            if entry is not None and entry.state == TIMED:
                self.make_ready(entry)
            else:
                keys.discard(key)
        if not keys:
            self._timed_by_scope.pop(scope_id, None)

    def is_waited_on(self, scope_id: ScopeID) -> bool:
        """Whether a queue waits for a slot of *scope_id*."""
        return scope_id in self._blocked

    def has_blocked(self) -> bool:
        """Whether any queue waits for a slot."""
        return bool(self._blocked)

    def wake_one(self, scope_id: ScopeID) -> None:
        """A slot of *scope_id* was freed: make the first queue waiting for
        it ready."""
        waiting = self._blocked.get(scope_id)
        if not waiting:
            return
        entries = self.entries
        while waiting:
            entry = entries.get(waiting.popleft())
            if entry is not None and entry.state == BLOCKED and len(entry.queue):
                self.make_ready(entry)
                break
        if not waiting:
            del self._blocked[scope_id]

    def pass_on(
        self,
        entry: ScopeSetEntry,
        has_free_slot: Callable[[ScopeID], bool],
        skip: ScopeID | None = None,
    ) -> None:
        """Wake the next waiter of each scope of *entry* (but *skip*) that
        still has room: *entry* was woken for a freed slot it may not use."""
        # A queue woken for a freed slot may not use it (another scope blocks
        # it, or it was just filled): without this, a free slot could be left
        # unclaimed.
        if not self.has_blocked():
            return
        for scope in entry.scopes:
            if scope != skip and self.is_waited_on(scope) and has_free_slot(scope):
                self.wake_one(scope)


def engine_slot(engine: object) -> Any:
    """The engine's slot (its scheduler, ``nextcall``, ``closing``), ``None``
    while no spider is open.

    Scrapy's engine, not user code: the slot is private and has no public
    accessor up to Scrapy 2.19 (``engine.scheduler`` is new in 2.19; the
    add-on supports 2.18), so this is the one place that reads it.
    """
    return getattr(engine, "_slot", None)


def pending_scopes(queue: object) -> set[ScopeID] | None:
    """The scopes with requests in *queue*, if it is a
    :class:`~scrapy_adaptive_throttle.ThrottlingAwarePriorityQueue`
    (``None`` for any other queue, which does not say)."""
    from ._pqueue import ThrottlingAwarePriorityQueue

    if not isinstance(queue, ThrottlingAwarePriorityQueue):
        return None
    # The queue's own schedule: _pqueue.py has no public accessor for it yet.
    return queue._schedule.pending_scopes()


class DelayedRequests:
    """Requests held aside, in memory, while their :reqmeta:`throttling_delay`
    runs, by wall-clock deadline (so that a deadline survives a paused and
    resumed crawl)."""

    def __init__(self, wall_clock: Callable[[], float]) -> None:
        self.wall_clock = wall_clock
        self._heap: list[tuple[float, int, Request]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def hold(self, request: Request, delay: float) -> None:
        """Hold *request* for *delay* seconds from now."""
        self._seq += 1
        heapq.heappush(self._heap, (self.wall_clock() + delay, self._seq, request))

    def pop_due(self) -> list[Request]:
        """The requests whose deadline has passed, earliest first."""
        wall = self.wall_clock()
        heap = self._heap
        due = []
        while heap and heap[0][0] <= wall:
            due.append(heapq.heappop(heap)[2])
        return due

    def seconds_to_next(self) -> float | None:
        """Seconds until the earliest deadline (0.0 if past), or ``None``."""
        if not self._heap:
            return None
        return max(0.0, self._heap[0][0] - self.wall_clock())

    def pop_all(self) -> Iterator[Request]:
        """Take every held request, earliest deadline first."""
        heap = self._heap
        while heap:
            yield heapq.heappop(heap)[2]


class EngineWakeup:
    """One timer that wakes the engine when the earliest gate opens: the
    queue's ``pop`` returned ``None`` and nothing else would call it again."""

    def __init__(self, crawler: Crawler, clock: Callable[[], float]) -> None:
        self.crawler = crawler
        self._clock = clock
        self._timer: CallLaterResult | None = None
        self._at = float("inf")

    def arm(self, at: float) -> None:
        """Wake the engine at *at* (on the clock), unless it is woken sooner."""
        if self._timer is not None and self._at <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._at = at
        self._timer = call_later(max(0.0, at - self._clock()), self._fire)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        self._at = float("inf")
        self.wake_engine()

    def wake_engine(self) -> None:
        """Have the engine ask the scheduler for a request soon."""
        try:
            engine = self.crawler.engine
        except RuntimeError:  # the crawl has not started (or already ended)
            return
        slot = engine_slot(engine)
        if slot is not None:
            slot.nextcall.schedule()
