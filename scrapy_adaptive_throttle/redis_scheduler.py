"""scrapy-redis's scheduler, throttling-aware: ``SCHEDULER`` for a crawl over a
shared Redis queue.

scrapy-redis's :class:`scrapy_redis.scheduler.Scheduler` pops requests from
Redis in the queue's order, whether their scopes allow them or not: a
request of a host at its limit (or backing off) then waits at the downloader
middleware gate and holds one of :setting:`CONCURRENT_REQUESTS` slots, so a
slow host holds back every other host (``bench/scrapy_redis.py`` measures
it). :class:`ThrottlingRedisScheduler` pops from the same Redis queue into a
small local buffer, a :class:`~scrapy_adaptive_throttle.ThrottlingAwarePriorityQueue`
in memory, and hands the engine only what that buffer says is ready: the same
check, reservation and engine wake-ups as with Scrapy's own scheduler. A
request that is not ready waits in the buffer; when the buffer holds
:setting:`THROTTLING_REDIS_BUFFER_SIZE` requests the scheduler stops popping
from Redis (it never drops one), and at close it pushes what is left back to
the Redis queue, so a process that stops loses nothing.

Importing this module needs scrapy-redis (``pip install scrapy-redis``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy.utils.misc import load_object
from scrapy_redis.scheduler import Scheduler

from ._pqueue import ThrottlingAwarePriorityQueue
from ._settings import DEFAULTS, ThrottlingSettings

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from typing_extensions import Self

__all__ = [
    "BUFFER_SIZE_SETTING",
    "DEFAULT_BUFFER_SIZE",
    "SCRAPY_REDIS_SCHEDULER",
    "ThrottlingRedisScheduler",
]

logger = logging.getLogger(__name__)

#: The setting that bounds the local buffer of each process.
BUFFER_SIZE_SETTING = "THROTTLING_REDIS_BUFFER_SIZE"
#: Enough to look past a long run of requests to one throttled host in the
#: shared queue; requests are small (a few KB each in memory), and a graceful
#: stop pushes them all back to Redis.
DEFAULT_BUFFER_SIZE: int = DEFAULTS[BUFFER_SIZE_SETTING]
#: The scheduler the add-on replaces with :class:`ThrottlingRedisScheduler`.
SCRAPY_REDIS_SCHEDULER = "scrapy_redis.scheduler.Scheduler"
#: Within a scope set, the buffer keeps the order the Redis queue gave.
_BUFFER_QUEUE = "scrapy.squeues.FifoMemoryQueue"


class ThrottlingRedisScheduler(Scheduler):  # type: ignore[misc]
    """scrapy-redis's :class:`~scrapy_redis.scheduler.Scheduler` that hands
    the engine only requests whose scopes allow them now.

    With the add-on, it replaces ``scrapy_redis.scheduler.Scheduler`` as
    :setting:`SCHEDULER` by itself; set it by hand if you derive your own
    scheduler from scrapy-redis's (derive it from this class instead).
    Every scrapy-redis setting keeps its meaning (``SCHEDULER_PERSIST``,
    ``SCHEDULER_QUEUE_CLASS``, ``SCHEDULER_IDLE_BEFORE_CLOSE``, the
    duplicate filter...): requests are enqueued to Redis as before,
    including the ones yielded from callbacks, retries and redirects.

    :meth:`next_request` first takes a ready request from the local buffer;
    otherwise it pops requests from Redis into the buffer until one of them
    is ready, the Redis queue is empty or the buffer is full. A request kept
    in the buffer is counted by ``len()`` and :meth:`has_pending_requests`,
    and :meth:`close` pushes the buffer back to the Redis queue (then
    scrapy-redis flushes the queue unless ``SCHEDULER_PERSIST`` is set, as
    it always did).
    """

    crawler: Crawler
    spider: Spider
    #: scrapy-redis's queue and duplicate filter (untyped there).
    queue: Any
    df: Any
    #: The most requests kept in the local buffer (see
    #: :setting:`THROTTLING_REDIS_BUFFER_SIZE`).
    buffer_size: int = DEFAULT_BUFFER_SIZE
    _buffer: ThrottlingAwarePriorityQueue | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        instance: Self = super().from_crawler(crawler)
        instance.crawler = crawler
        # Validated with every other setting when the throttler is built
        # (the downloader does it first, so a bad value stops the crawl
        # before the spider opens).
        instance.buffer_size = ThrottlingSettings.from_crawler(
            crawler
        ).redis_buffer_size
        return instance

    def open(self, spider: Spider) -> None:
        """Open the Redis queue and the duplicate filter as scrapy-redis does
        (logging through this module: Scrapy 2.19 deprecates the
        ``spider.log()`` scrapy-redis 0.9.1 calls), and the local buffer."""
        self.spider = spider
        try:
            self.queue = load_object(self.queue_cls)(
                server=self.server,
                spider=spider,
                key=self.queue_key % {"spider": spider.name},
                serializer=self.serializer,
            )
        except TypeError as exc:
            raise ValueError(
                f"Failed to instantiate queue class '{self.queue_cls}': {exc}"
            ) from exc
        if not self.df:
            self.df = load_object(self.dupefilter_cls).from_spider(spider)
        if self.flush_on_start:
            self.flush()
        if len(self.queue):
            logger.info("Resuming crawl (%d requests scheduled)", len(self.queue))
        self._buffer = ThrottlingAwarePriorityQueue.from_crawler(
            self.crawler, load_object(_BUFFER_QUEUE), ""
        )

    def next_request(self) -> Request | None:
        """A request every scope of which allows it now (reserved), or ``None``."""
        buffer = self._buffer
        assert buffer is not None, "next_request() before open()"
        request = buffer.pop()
        if request is not None:
            return request
        while len(buffer) < self.buffer_size:
            request = self._pop_from_redis(wait=not len(buffer))
            if request is None:
                return None
            buffer.push(request)
            request = buffer.pop()
            if request is not None:
                return request
        return None

    def enqueue_request(self, request: Request) -> bool:
        """Push *request* to the Redis queue, unless the duplicate filter has
        seen it (scrapy-redis's own, without the ``spider`` argument that
        Scrapy 2.19's stats deprecate)."""
        if not request.dont_filter and self.df.request_seen(request):
            self.df.log(request, self.spider)
            return False
        if self.stats:
            self.stats.inc_value("scheduler/enqueued/redis")
        self.queue.push(request)
        return True

    def _pop_from_redis(self, *, wait: bool) -> Request | None:
        # Block for SCHEDULER_IDLE_BEFORE_CLOSE only when nothing else waits:
        # with requests in the buffer, the engine must come back to them.
        request: Request | None = self.queue.pop(self.idle_before_close if wait else 0)
        if request is not None and self.stats:
            self.stats.inc_value("scheduler/dequeued/redis")
        return request

    def close(self, reason: str) -> Any:
        """Push the requests left in the buffer back to the Redis queue, then
        close as scrapy-redis does."""
        buffer = self._buffer
        if buffer is not None:
            self._buffer = None
            requests = buffer.drain()
            for request in requests:
                self.queue.push(request)
            if requests:
                logger.info(
                    "Pushed %d throttled request(s) back to the Redis queue %s",
                    len(requests),
                    self.queue.key,
                )
        return super().close(reason)

    def __len__(self) -> int:
        buffered = len(self._buffer) if self._buffer is not None else 0
        return len(self.queue) + buffered

    def has_pending_requests(self) -> bool:
        return len(self) > 0
