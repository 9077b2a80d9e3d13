"""The throttling-aware priority queue with a fake clock, without an engine."""

from __future__ import annotations

from typing import Any

from scrapy import Request
from scrapy.pqueues import ScrapyPriorityQueue
from scrapy.squeues import FifoMemoryQueue
from scrapy.utils.test import get_crawler

from scrapy_adaptive_throttle import ThrottlingAwarePriorityQueue
from scrapy_adaptive_throttle._crawler_throttler import get_throttler
from scrapy_adaptive_throttle._queue_schedule import pending_scopes
from tests.fake_clock import FakeClock


def make_queue(**settings: Any) -> tuple[ThrottlingAwarePriorityQueue, Any, FakeClock]:
    crawler = get_crawler(settings_dict={"DOWNLOAD_DELAY_JITTER": 0, **settings})
    throttler = get_throttler(crawler)
    clock = FakeClock(1000.0)
    throttler.clock = clock
    queue = ThrottlingAwarePriorityQueue.from_crawler(crawler, FifoMemoryQueue, "")
    queue._clock = clock
    return queue, throttler, clock


def req(url: str, **kwargs: Any) -> Request:
    return Request(url, dont_filter=True, **kwargs)


def drain(queue: ThrottlingAwarePriorityQueue) -> list[Request]:
    popped = []
    while (request := queue.pop()) is not None:
        popped.append(request)
    return popped


def test_pop_respects_concurrency_and_release_wakes_the_scope() -> None:
    queue, throttler, _ = make_queue(
        THROTTLING_SCOPES={"a.example": {"concurrency": 2}}
    )
    for index in range(5):
        queue.push(req(f"http://a.example/{index}"))
    assert len(queue) == 5
    first = drain(queue)
    assert [r.url for r in first] == ["http://a.example/0", "http://a.example/1"]
    assert len(queue) == 3
    throttler.release(first[0])
    assert [r.url for r in drain(queue)] == ["http://a.example/2"]
    assert len(queue) == 2


def test_a_time_blocked_scope_does_not_block_others() -> None:
    queue, _, clock = make_queue(THROTTLING_SCOPES={"slow.example": {"delay": 10}})
    for index in range(3):
        queue.push(req(f"http://slow.example/{index}"))
    for index in range(3):
        queue.push(req(f"http://fast.example/{index}"))
    popped = [r.url for r in drain(queue)]
    assert popped.count("http://slow.example/0") == 1
    assert sum(url.startswith("http://fast.example/") for url in popped) == 3
    assert len(queue) == 2
    clock.now += 10
    assert [r.url for r in drain(queue)] == ["http://slow.example/1"]


def test_priority_first_then_round_robin_across_scopes() -> None:
    queue, _, _ = make_queue(CONCURRENT_REQUESTS_PER_DOMAIN=100)
    for index in range(2):
        queue.push(req(f"http://a.example/{index}"))
        queue.push(req(f"http://b.example/{index}"))
    queue.push(req("http://c.example/urgent", priority=10))
    order = [r.url for r in drain(queue)]
    assert order[0] == "http://c.example/urgent"
    hosts = [url.split("/")[2] for url in order[1:]]
    assert hosts == ["a.example", "b.example", "a.example", "b.example"]


def test_freed_slot_is_passed_on_when_the_woken_queue_cannot_use_it() -> None:
    # Queue 1 needs scopes x and y, queue 2 only x. Both wait for x; then x
    # frees one slot while y is still full: queue 1 is woken first but
    # cannot go, so the slot must reach queue 2.
    queue, throttler, _ = make_queue(
        THROTTLING_SCOPES={"x": {"concurrency": 1}, "y": {"concurrency": 1}}
    )
    holder_x = req("http://h.example/x", meta={"throttling_scopes": "x"})
    holder_y = req("http://h.example/y", meta={"throttling_scopes": "y"})
    queue.push(holder_x)
    queue.push(holder_y)
    assert len(drain(queue)) == 2
    queue.push(req("http://h.example/xy", meta={"throttling_scopes": ["x", "y"]}))
    queue.push(req("http://h.example/x2", meta={"throttling_scopes": "x"}))
    assert drain(queue) == []
    throttler.release(holder_x)
    assert [r.url for r in drain(queue)] == ["http://h.example/x2"]


def test_throttling_delay_holds_only_that_request() -> None:
    queue, _, _ = make_queue()
    held = req("http://a.example/held", meta={"throttling_delay": 0.05})
    queue.push(held)
    queue.push(req("http://a.example/other"))
    assert len(queue) == 2
    assert [r.url for r in drain(queue)] == ["http://a.example/other"]
    import time

    time.sleep(0.06)  # throttling_delay deadlines are wall-clock (survive restarts)
    assert [r.url for r in drain(queue)] == ["http://a.example/held"]
    assert len(queue) == 0


def test_queues_are_keyed_by_scope_set() -> None:
    queue, _, _ = make_queue()
    queue.push(req("http://a.example/1", meta={"throttling_scopes": "custom"}))
    queue.push(req("http://a.example/2", meta={"throttling_scopes": ["y", "x"]}))
    assert ["custom"] in queue
    assert ["x", "y"] in queue
    assert ["a.example"] not in queue
    state = queue.close()
    assert set(state) == {'["custom"]', '["x", "y"]'}


def test_pending_scopes_are_the_scopes_of_queued_requests() -> None:
    queue, throttler, _ = make_queue(
        THROTTLING_SCOPES={"a.example": {"concurrency": 1}}
    )
    assert pending_scopes(queue) == set()
    queue.push(req("http://a.example/1"))
    queue.push(req("http://a.example/2"))
    queue.push(req("http://b.example/1", meta={"throttling_scopes": ["x", "y"]}))
    assert pending_scopes(queue) == {"a.example", "x", "y"}
    # a.example/2 waits for the slot of a.example/1; the x+y queue is empty.
    popped = drain(queue)
    assert [r.url for r in popped] == ["http://a.example/1", "http://b.example/1"]
    assert pending_scopes(queue) == {"a.example"}
    throttler.release(popped[0])
    drain(queue)
    assert pending_scopes(queue) == set()


def test_another_queue_does_not_say_which_scopes_are_pending() -> None:
    crawler = get_crawler(settings_dict={})
    scrapy_queue = ScrapyPriorityQueue.from_crawler(crawler, FifoMemoryQueue, "")
    scrapy_queue.push(req("http://a.example/1"))
    assert pending_scopes(scrapy_queue) is None
    assert pending_scopes(None) is None
