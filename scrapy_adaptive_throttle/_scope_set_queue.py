"""The requests of one scope set, and its place in the scheduler queue.

A *scope set* is the sorted set of scopes of a request; the throttling-aware
priority queue keeps one :class:`ScopeSetQueue` per scope set, so that a
dequeue looks at queues, never at every request. The on-disk layout of a
job directory (one sub-directory per scope set, named after the JSON list of
its scopes) is fixed here: a resumed crawl must find its queues again.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import suppress
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from scrapy.pqueues import ScrapyPriorityQueue, _path_safe

from ._types import RESOLVED_SCOPES_META_KEY, RequestScopes, ScopeID, iter_scope_values

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping

    from scrapy import Request
    from scrapy.crawler import Crawler

    from ._queue_gate import ScopeValues
    from ._queue_schedule import QueueSchedule

    #: The gate's check (see ``QueueGate.check_scopes``).
    ScopeCheck = Callable[
        [ScopeValues, float, Request | None], tuple[float, ScopeID | None]
    ]

__all__ = [
    "BLOCKED",
    "READY",
    "SEPARATOR",
    "TIMED",
    "ScopeSetEntry",
    "ScopeSetQueue",
    "ScopeSetQueues",
    "queue_dir_name",
    "scope_list",
]

#: Where a scope set's queue is: may be sendable, waiting for a time gate,
#: or waiting for a slot of the scope whose concurrency blocks it.
READY, TIMED, BLOCKED = 0, 1, 2
#: Joins the scopes of a scope set into its key.
SEPARATOR = "\n"

#: Quota shares are told apart in steps of 1/_SHARE_STEPS of the quota.
_SHARE_STEPS = 20
#: Queue directory names longer than this (in bytes) are shortened, keeping a
#: hash of the whole name: most file systems allow 255 bytes.
_MAX_DIR_NAME_BYTES = 200
#: The most buckets looked at for a request that fits in what is left of a
#: quota when the head of its queue does not.
_BACKFILL_BUCKETS = 32


class ScopeSetQueue(ScrapyPriorityQueue):
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

    def pop_fitting(
        self, head: Request, head_values: ScopeValues, now: float, check: ScopeCheck
    ) -> tuple[Request, ScopeValues] | ScopeID | None:
        """Pop a request that fits in what is left of the set's quotas, when
        only quota holds *head* back (no request waits behind a large one);
        the head keeps its place for the next window.

        Returns the popped request and its scope values, or the scope whose
        concurrency also holds the head back (look again when it frees a
        slot), or ``None``.
        """
        wait, blocked = check([(scope, None) for scope, _ in head_values], now, head)
        if wait > 0:
            return None
        if blocked is not None:
            return str(blocked)
        for priority, is_start, request in self.iter_heads():
            if request is head:
                continue
            values = list(iter_scope_values(request.meta.get(RESOLVED_SCOPES_META_KEY)))
            wait, blocked = check(values, now, request)
            if wait <= 0 and blocked is None:
                popped = self.pop_from(priority, is_start)
                assert popped is request
                return request, values
        return None

    def peek(self) -> Request | None:
        # Same preference as pop() (regular queue first at equal priority);
        # ScrapyPriorityQueue.peek prefers the start queue and can disagree.
        if self.curprio is None:
            return None
        queue = self.queues.get(self.curprio) or self._start_queues.get(self.curprio)
        return queue.peek() if queue is not None else None  # type: ignore[attr-defined]


class ScopeSetEntry:
    """A scope set's queue and where it is (:data:`READY`, :data:`TIMED`,
    :data:`BLOCKED`); *seq* tells its current heap item from stale ones."""

    __slots__ = ("key", "needs_head", "queue", "scopes", "seq", "state")

    def __init__(
        self, key: str, scopes: list[ScopeID], queue: ScopeSetQueue, needs_head: bool
    ):
        self.key = key
        self.scopes = scopes
        self.queue = queue
        #: Whether the gate is asked with the head request's scope values
        #: (quota amounts, or a protocol-only manager's per-request checks).
        self.needs_head = needs_head
        self.state = READY
        self.seq = 0


class ScopeSetQueues:
    """The queue of each scope set: made on its first request, in its own
    job-directory sub-directory, and removed when it empties."""

    def __init__(
        self,
        crawler: Crawler,
        downstream_queue_cls: type[Any],
        key: str,
        schedule: QueueSchedule,
        *,
        start_queue_cls: type[Any] | None,
        quotas: Mapping[ScopeID, float],
        needs_head: bool,
    ) -> None:
        self.crawler = crawler
        self.downstream_queue_cls = downstream_queue_cls
        self.key = key
        self.schedule = schedule
        self._start_queue_cls = start_queue_cls
        self._quotas = quotas
        self._needs_head = needs_head

    def restore(self, startprios: dict[str, Iterable[int]]) -> int:
        """Open the queues of a resumed crawl; return how many requests
        they hold."""
        size = 0
        for json_key, prios in startprios.items():
            entry = self.entry(json.loads(json_key), prios)
            size += len(entry.queue)
            if len(entry.queue):
                self.schedule.make_ready(entry)
        return size

    def entry(
        self, scopes: list[ScopeID], startprios: Iterable[int] = ()
    ) -> ScopeSetEntry:
        """The entry of the scope set *scopes*, made if needed."""
        key = SEPARATOR.join(scopes)
        entries = self.schedule.entries
        entry = entries.get(key)
        if entry is None:
            queue = ScopeSetQueue(
                self.crawler,
                self.downstream_queue_cls,
                self._subdir(scopes),
                startprios,
                start_queue_cls=self._start_queue_cls,
            )
            queue.quotas = {s: self._quotas[s] for s in scopes if s in self._quotas}
            needs_head = self._needs_head or bool(queue.quotas)
            entry = ScopeSetEntry(key, scopes, queue, needs_head)
            entry.state = BLOCKED  # not anywhere yet; make_ready puts it in the heap
            entries[key] = entry
        return entry

    def _subdir(self, scopes: list[ScopeID]) -> str:
        if not self.key:
            return ""
        return self.key + "/" + queue_dir_name(json.dumps(scopes))

    def remove(self, entry: ScopeSetEntry) -> None:
        """Forget the (empty) queue of *entry* and its sub-directory."""
        self.schedule.forget(entry)
        entry.queue.close()
        if self.key:
            with suppress(OSError):
                Path(self._subdir(entry.scopes)).rmdir()

    def push(self, request: Request, scopes: RequestScopes) -> None:
        """Queue *request* under the scope set of *scopes*.

        :raises ValueError: if *request* cannot be serialised (job directory).
        """
        entry = self.entry(scope_list(scopes))
        queue = entry.queue
        was_empty = not len(queue)
        old_prio = queue.curprio
        try:
            queue.push(request)  # ValueError if it cannot be serialised
        except ValueError:
            if was_empty:
                self.remove(entry)
            raise
        if was_empty:
            self.schedule.make_ready(entry)
        elif entry.state == READY and queue.curprio != old_prio:
            self.schedule.make_ready(entry)  # re-key: the old heap item is stale

    def close(self) -> dict[str, list[int]]:
        """Close every queue; the state to resume them (``startprios``)."""
        entries = self.schedule.entries
        state = {
            json.dumps(entry.scopes): entry.queue.close() for entry in entries.values()
        }
        entries.clear()
        return state


def _quota_share(request: Request, quotas: Mapping[ScopeID, float]) -> float:
    """The largest share of a quota that *request* consumes (0.0 for none)."""
    share = 0.0
    for scope, amount in iter_scope_values(request.meta.get(RESOLVED_SCOPES_META_KEY)):
        quota = quotas.get(scope)
        if quota and isinstance(amount, int | float) and amount > 0:
            share = max(share, amount / quota)
    return share


def scope_list(scopes: RequestScopes) -> list[ScopeID]:
    """The scope set of *scopes*: its scope ids, sorted, once each."""
    if scopes is None:
        return []
    if isinstance(scopes, str):
        return [scopes]
    return sorted(set(scopes.keys() if isinstance(scopes, dict) else scopes))


def queue_dir_name(text: str) -> str:
    """A directory name for *text*, safe on any file system whatever its
    length or characters (long ones keep a prefix and a hash of the whole)."""
    name = _path_safe(text)
    if len(name.encode()) <= _MAX_DIR_NAME_BYTES:
        return name  # as before, so that older job directories still resume
    digest = hashlib.sha1(text.encode()).hexdigest()
    prefix = name.encode()[: _MAX_DIR_NAME_BYTES - len(digest) - 1]
    return f"{prefix.decode(errors='ignore')}-{digest}"
