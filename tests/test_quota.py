"""Quotas with a fake clock: windows, reconciliation, and the order in which
the throttling-aware queue hands out requests of a quota scope.

The components are built from a crawler (``get_crawler``) and driven with an
explicit ``now`` or a fake clock; no engine, no network.
"""

from __future__ import annotations

from typing import Any

import pytest
from scrapy import Request
from scrapy.squeues import FifoMemoryQueue
from scrapy.utils.test import get_crawler

from scrapy_adaptive_throttle import ThrottlingAwarePriorityQueue, update_scope_backoff
from scrapy_adaptive_throttle._crawler_throttler import get_throttler
from tests.fake_clock import FakeClock

QUOTA_SCOPES = {"api": {"quota": 10.0, "window": 60.0}}


def make_throttler(**settings: Any) -> Any:
    crawler = get_crawler(
        settings_dict={
            "DOWNLOAD_DELAY_JITTER": 0,
            "THROTTLING_SCOPES": QUOTA_SCOPES,
            **settings,
        }
    )
    throttler = get_throttler(crawler)
    throttler.clock = FakeClock(1000.0)
    return throttler


def make_queue(**settings: Any) -> tuple[ThrottlingAwarePriorityQueue, Any, FakeClock]:
    throttler = make_throttler(**settings)
    queue = ThrottlingAwarePriorityQueue.from_crawler(
        throttler.crawler, FifoMemoryQueue, ""
    )
    queue._clock = throttler.clock
    return queue, throttler, throttler.clock


def req(name: str, amount: float | None, **kwargs: Any) -> Request:
    scopes: Any = {"api": amount} if amount is not None else "api"
    return Request(
        f"http://api.example/{name}",
        meta={"throttling_scopes": scopes},
        dont_filter=True,
        **kwargs,
    )


def names(requests: list[Request]) -> list[str]:
    return [request.url.rsplit("/", 1)[1] for request in requests]


def drain(queue: ThrottlingAwarePriorityQueue, throttler: Any) -> list[Request]:
    """Pop everything sendable now, releasing each request at once."""
    popped = []
    while (request := queue.pop()) is not None:
        popped.append(request)
        throttler.release(request)
    return popped


# -- the scope manager's windows ----------------------------------------------


def test_quota_window_limits_consumption() -> None:
    manager = make_throttler().get_scope_manager("api")
    assert manager.can_send(0.0, 4.0) == 0.0
    manager.record_sent(0.0, 4.0)
    manager.record_sent(1.0, 4.0)
    assert manager.can_send(2.0, 2.0) == 0.0
    assert manager.can_send(2.0, 4.0) == pytest.approx(58.0)  # until 60
    assert manager.can_send(60.0, 4.0) == 0.0  # a new window


def test_request_larger_than_the_quota_is_allowed_alone() -> None:
    manager = make_throttler().get_scope_manager("api")
    assert manager.can_send(0.0, 50.0) == 0.0
    manager.record_sent(0.0, 50.0)
    assert manager.can_send(1.0, 1.0) == pytest.approx(59.0)


def test_window_defaults_to_throttling_window() -> None:
    throttler = make_throttler(
        THROTTLING_WINDOW=5.0, THROTTLING_SCOPES={"api": {"quota": 1.0}}
    )
    manager = throttler.get_scope_manager("api")
    manager.record_sent(0.0, 1.0)
    assert manager.can_send(1.0, 1.0) == pytest.approx(4.0)


def test_reconcile_by_consumed_is_a_delta_and_not_a_backoff() -> None:
    throttler = make_throttler()
    manager = throttler.get_scope_manager("api")
    manager.record_sent(0.0, 8.0)
    assert manager.can_send(1.0, 4.0) > 0
    # The server says the request actually cost 3 less than estimated.
    throttler.apply_backoff(update_scope_backoff(None, "api", consumed=-3.0), now=1.0)
    assert manager.can_send(1.0, 4.0) == 0.0
    state = manager.get_state(1.0)
    assert state["quota_consumed"] == 5.0
    assert state["backoff_count"] == 0
    throttler.apply_backoff(update_scope_backoff(None, "api", consumed=4.0), now=2.0)
    assert manager.get_state(2.0)["quota_consumed"] == 9.0


def test_reconcile_by_remaining_sets_the_consumption() -> None:
    throttler = make_throttler()
    manager = throttler.get_scope_manager("api")
    manager.record_sent(0.0, 1.0)
    throttler.apply_backoff({"api": {"remaining": 0.0}}, now=1.0)
    assert manager.can_send(1.0, 1.0) == pytest.approx(59.0)
    throttler.apply_backoff({"api": {"remaining": 7.5}}, now=2.0)
    assert manager.get_state(2.0)["quota_consumed"] == pytest.approx(2.5)
    assert manager.get_state(2.0)["backoff_count"] == 0


def test_reported_exhaustion_before_any_request_expires_with_the_window() -> None:
    throttler = make_throttler()
    manager = throttler.get_scope_manager("api")
    throttler.apply_backoff({"api": {"remaining": 0.0}}, now=10.0)
    assert manager.can_send(11.0, 1.0) == pytest.approx(59.0)
    assert manager.can_send(70.0, 1.0) == 0.0


def test_quota_update_with_a_delay_is_also_a_backoff() -> None:
    throttler = make_throttler()
    manager = throttler.get_scope_manager("api")
    throttler.apply_backoff(
        update_scope_backoff(None, "api", delay=5.0, consumed=1.0), now=0.0
    )
    state = manager.get_state(0.0)
    assert state["quota_consumed"] == 1.0
    assert state["backoff_count"] == 1
    assert manager.can_send(1.0, None) == pytest.approx(4.0)


def test_scopes_without_a_quota_ignore_amounts() -> None:
    throttler = make_throttler()
    manager = throttler.get_scope_manager("other")
    manager.record_sent(0.0, 1e9)
    throttler.apply_backoff({"other": {"remaining": 0.0}}, now=0.0)
    assert manager.can_send(0.0, 1e9) == 0.0


# -- the queue's order -----------------------------------------------------------


def test_larger_share_of_the_quota_goes_first_at_equal_priority() -> None:
    queue, throttler, _ = make_queue()
    for name, amount in [("small", 1.0), ("none", None), ("large", 6.0), ("mid", 3.0)]:
        queue.push(req(name, amount))
    assert names(drain(queue, throttler)) == ["large", "mid", "small", "none"]


def test_priority_still_comes_first() -> None:
    queue, throttler, _ = make_queue()
    queue.push(req("large", 6.0))
    queue.push(req("urgent-small", 1.0, priority=1))
    queue.push(req("retry-large", 6.0, priority=-1))
    assert names(drain(queue, throttler)) == ["urgent-small", "large"]


def test_equal_shares_keep_fifo_order() -> None:
    queue, throttler, _ = make_queue()
    for index in range(4):
        queue.push(req(f"r{index}", 2.0))
    assert names(drain(queue, throttler)) == ["r0", "r1", "r2", "r3"]


def test_small_requests_are_not_stuck_behind_a_large_head() -> None:
    """The large head does not fit in what is left of the window; smaller
    requests that fit go ahead, and the large one opens the next window."""
    queue, throttler, clock = make_queue()
    queue.push(req("first", 6.0))
    assert names(drain(queue, throttler)) == ["first"]  # 6 of 10 used
    for name, amount in [("large", 6.0), ("s1", 2.0), ("s2", 2.0), ("s3", 2.0)]:
        queue.push(req(name, amount))
    assert names(drain(queue, throttler)) == ["s1", "s2"]  # 10 of 10
    assert len(queue) == 2
    clock.now += 60.0
    assert names(drain(queue, throttler)) == ["large", "s3"]


def test_large_request_is_not_starved_by_a_stream_of_small_ones() -> None:
    queue, throttler, clock = make_queue()
    queue.push(req("large", 9.0))
    queue.push(req("s0", 1.0))
    popped = names(drain(queue, throttler))
    assert popped == ["large", "s0"]
    for window in range(1, 4):
        # A stream of small requests, and a large one arriving after them.
        for index in range(12):
            queue.push(req(f"w{window}-s{index}", 1.0))
        queue.push(req(f"w{window}-large", 9.0))
        clock.now += 60.0
        popped = names(drain(queue, throttler))
        assert popped[0] == f"w{window}-large"
        assert len(popped) == 2  # 9 + 1 of 10
    assert len(queue) == 3 * 11


def test_queues_without_quota_are_plain_fifo_by_priority() -> None:
    queue, throttler, _ = make_queue()
    for index in range(3):
        queue.push(
            Request(f"http://a.example/{index}", dont_filter=True, meta={"x": index})
        )
    queue.push(Request("http://a.example/high", dont_filter=True, priority=5))
    popped = [r.url for r in drain(queue, throttler)]
    assert popped[0] == "http://a.example/high"
