"""A scheduler priority queue that only hands out requests their scopes allow.

Requests wait in the scheduler, not in the downloader, so a throttled scope
never occupies a slot of :setting:`CONCURRENT_REQUESTS` (no head-of-line
blocking), and the engine is woken by a timer when a time gate opens.

Cost per request does not grow with the number of scopes: each scope set
(the set of scopes of a request) has its own queue (``_scope_set_queue.py``),
which is ready, waiting for a time gate or waiting for a slot
(``_queue_schedule.py``); a dequeue looks at a queue only when something that
could unblock it happened, never scans every scope.
"""

from __future__ import annotations

import logging
import pickle
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred

from ._containment import (
    component_of,
    fail_request,
    host_scope,
    report,
)
from ._crawler_throttler import get_throttler
from ._meta_keys import DELAY_DEADLINE_META_KEY, DELAYED_META_KEY
from ._queue_gate import queue_gate
from ._queue_schedule import DelayedRequests, EngineWakeup, QueueSchedule
from ._scope_set_queue import SEPARATOR, ScopeSetEntry, ScopeSetQueues
from ._types import RESOLVED_SCOPES_META_KEY, RequestScopes, ScopeID, iter_scope_values

if TYPE_CHECKING:
    from collections.abc import Iterable

    from scrapy import Request
    from scrapy.crawler import Crawler
    from typing_extensions import Self

    from ._queue_gate import QueueGate, ScopeValues

logger = logging.getLogger(__name__)


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
        self._schedule = QueueSchedule()
        self._size = 0
        self._resolving = 0
        #: The request being reserved, for _fail_head if reserving it fails.
        self._reserving: Request | None = None
        # The plugin's manager's queue_gate (straight to its scope gate), else
        # an adapter built from the protocol.
        self.gate: QueueGate = queue_gate(crawler, self.throttler)
        # The manager's clock: its scopes and this queue agree on "now".
        self._clock = self.gate.clock
        # Through a lambda: a test may replace _clock after construction.
        self._wakeup = EngineWakeup(crawler, lambda: self._clock())  # noqa: PLW0108
        self._delayed = DelayedRequests(self.gate.wall_clock)
        self._check = self.gate.check_scopes
        self._reserve = self.gate.reserve_scopes
        self._has_free_slot = self.gate.has_free_slot
        self._resolve_now = self.gate.resolve_scopes_now
        self._needs_head = self.gate.needs_head
        self._quotas = dict(self.gate.quotas)
        self.gate.add_release_listener(self._schedule.wake_one)
        self.gate.add_timer_listener(self._schedule.on_timer_opened)
        self._queues = ScopeSetQueues(
            crawler,
            downstream_queue_cls,
            key,
            self._schedule,
            start_queue_cls=start_queue_cls,
            quotas=self._quotas,
            needs_head=self._needs_head,
        )
        self._size += self._queues.restore(startprios or {})

    # -- push -----------------------------------------------------------------

    def push(self, request: Request) -> None:
        """Queue *request* under its scope set (resolving its scopes now)."""
        if self._hold_if_delayed(request):
            return
        try:
            resolved: Any = self._resolve_now(request)
        except Exception as exc:
            resolved = self._host_scope(request, exc)
        if not isinstance(resolved, Deferred):
            self._push_resolved(request, resolved)
            return
        if self.key:
            # The scheduler falls back to the memory queue on ValueError, which
            # it can only do now, not once the scopes are known.
            _check_serializable(request, self.crawler)
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
        self._delayed.hold(request, delay)
        self._size += 1
        self._wakeup.arm(self._clock() + delay)
        return True

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
        self._wakeup.wake_engine()

    def _push_resolved(self, request: Request, scopes: RequestScopes) -> None:
        self._queues.push(request, scopes)  # ValueError if it cannot be serialised
        self._size += 1

    # -- pop ------------------------------------------------------------------

    def pop(self) -> Request | None:
        """Return a request every scope of which allows it now, reserved."""
        now = self._clock()
        if self._delayed:
            self._promote_delayed()
        schedule = self._schedule
        schedule.promote_timed(now)
        while (entry := schedule.next_ready()) is not None:
            try:
                request = self._try_entry(entry, now)
            except Exception as exc:
                request = self._fail_head(entry, exc)
            if request is None:
                continue
            if DELAY_DEADLINE_META_KEY in request.meta and self._still_delayed(request):
                continue
            return request
        at = self._schedule.next_timed_at()
        delayed = self._delayed.seconds_to_next()
        if delayed is not None:
            delayed_at = self._clock() + delayed
            at = delayed_at if at is None else min(at, delayed_at)
        if at is not None:
            self._wakeup.arm(at)
        return None

    def _fail_head(self, entry: ScopeSetEntry, error: Exception) -> Request | None:
        """A throttling component failed while *entry* was looked at: its head
        request goes to its errback (no reservation is kept), the rest of the
        queue stays sendable."""
        request = self._reserving
        self._reserving = None
        if request is None:
            request = entry.queue.pop()
            if request is None:  # pragma: no cover - a ready queue is not empty
                self._queues.remove(entry)
                return None
            self._size -= 1
        if self._schedule.entries.get(entry.key) is entry:
            if len(entry.queue):
                self._schedule.make_ready(entry)
            else:
                self._queues.remove(entry)
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

    def _try_entry(self, entry: ScopeSetEntry, now: float) -> Request | None:
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
            found = entry.queue.pop_fitting(head, values, now, self._check)
            if isinstance(found, str):
                # Only quota and a full slot hold the head back: wait for the
                # slot, after which a smaller request may fit.
                wait, blocked = 0.0, found
            else:
                backfill = found
        if backfill is not None:
            request, values = backfill
        elif wait > 0:
            self._schedule.mark_timed(entry, now + wait)
            self._schedule.pass_on(entry, self._has_free_slot)
            return None
        elif blocked is not None:
            self._schedule.mark_blocked(entry, blocked)
            self._schedule.pass_on(entry, self._has_free_slot, skip=blocked)
            return None
        else:
            request = entry.queue.pop()
        assert request is not None
        self._size -= 1
        self._reserving = request
        self._reserve(request, values, now)
        self._reserving = None
        if len(entry.queue):
            self._schedule.make_ready(entry)
        else:
            self._queues.remove(entry)
        self._schedule.pass_on(entry, self._has_free_slot)
        return request

    def _promote_delayed(self) -> None:
        for request in self._delayed.pop_due():
            self._size -= 1
            request.meta[DELAYED_META_KEY] = True
            self.push(request)

    # -- the rest of the priority-queue contract ------------------------------

    def peek(self) -> Request | None:
        """The request :meth:`pop` would try first (not reserved)."""
        entry = self._schedule.peek_ready()
        return entry.queue.peek() if entry is not None else None

    def close(self) -> dict[str, list[int]]:
        """Close every queue and return the state needed to resume."""
        self._wakeup.cancel()
        self.gate.remove_release_listener(self._schedule.wake_one)
        self.gate.remove_timer_listener(self._schedule.on_timer_opened)
        for request in self._delayed.pop_all():
            # Queued with their wall-clock deadline (not marked as delayed):
            # a resumed crawl holds them again until then (see pop()).
            self._size -= 1
            try:
                resolved: Any = self._resolve_now(request)
                if isinstance(resolved, Deferred):
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
        return self._queues.close()

    def drain(self) -> list[Request]:
        """Close the queue and return every request it holds, none of them
        reserved: for a scheduler that keeps its requests elsewhere
        (``ThrottlingRedisScheduler`` pushes them back to its Redis queue).

        Requests held for their :reqmeta:`throttling_delay` come first; a
        request whose scopes an asynchronous ``get_scopes`` is still
        resolving is not among them.
        """
        self._wakeup.cancel()
        self.gate.remove_release_listener(self._schedule.wake_one)
        self.gate.remove_timer_listener(self._schedule.on_timer_opened)
        requests = list(self._delayed.pop_all())
        for entry in list(self._schedule.entries.values()):
            while (request := entry.queue.pop()) is not None:
                requests.append(request)
        self._queues.close()
        self._size -= len(requests)
        return requests

    def __len__(self) -> int:
        return self._size

    def __contains__(self, scope_set: Iterable[ScopeID]) -> bool:
        return SEPARATOR.join(sorted(set(scope_set))) in self._schedule.entries


def _name(component: object) -> str:
    cls = type(component)
    return f"{cls.__module__}.{cls.__qualname__}"


def _check_serializable(request: Request, crawler: Crawler) -> None:
    try:
        pickle.dumps(request.to_dict(spider=crawler.spider), protocol=4)
    except Exception as exc:
        raise ValueError(f"Unable to serialize request {request}: {exc}") from exc
