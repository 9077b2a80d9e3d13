"""The pure parts of the shared state's Redis client, without a server: the
reconnection backoff, the release batch and the fallback limits."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from scrapy_adaptive_throttle._redis_client import (
    HANDOVER_RELEASE_DELAY,
    RECONNECT_MAX_DELAY,
    RECONNECT_MIN_DELAY,
    RELEASE_BATCH_DELAY,
    Reconnection,
    ReleaseBatch,
)
from scrapy_adaptive_throttle._shared_state import fallback_check
from tests.fake_clock import FakeClock


def test_a_loss_warns_once_a_minute(fake_clock: FakeClock) -> None:
    reconnection = Reconnection(fake_clock)
    assert reconnection.lost() == logging.WARNING
    fake_clock.advance(59.0)
    assert reconnection.lost() == logging.INFO
    fake_clock.advance(1.0)
    assert reconnection.lost() == logging.WARNING


def test_retries_back_off_from_the_shortest_delay_to_the_longest(
    fake_clock: FakeClock,
) -> None:
    reconnection = Reconnection(fake_clock)
    assert reconnection.due()
    reconnection.lost()
    waits = []
    for _ in range(8):
        reconnection.failed()
        start = fake_clock.now
        while not reconnection.due():
            fake_clock.advance(0.125)
        waits.append(fake_clock.now - start)
    assert waits[0] == RECONNECT_MIN_DELAY
    assert waits[:4] == [RECONNECT_MIN_DELAY * 2**i for i in range(4)]
    assert waits[-1] == RECONNECT_MAX_DELAY
    reconnection.lost()  # a new outage starts from the shortest delay again
    reconnection.failed()
    fake_clock.advance(RECONNECT_MIN_DELAY)
    assert reconnection.due()


def test_releases_are_flushed_at_once_without_a_scheduler() -> None:
    flushed: list[list[tuple[str, str]]] = []
    batch = ReleaseBatch(lambda: flushed.append(batch.take()), None)
    batch.add([("lease:a", "t1")])
    batch.add([("lease:b", "t2")])
    assert flushed == [[("lease:a", "t1")], [("lease:b", "t2")]]
    assert batch.pending == []


class FakeCall:
    def __init__(self, delay: float, function: Any) -> None:
        self.delay = delay
        self.function = function
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def test_releases_wait_for_one_timer_or_the_next_check() -> None:
    calls: list[FakeCall] = []

    def schedule(delay: float, function: Any) -> FakeCall:
        calls.append(FakeCall(delay, function))
        return calls[-1]

    flushed: list[list[tuple[str, str]]] = []
    batch = ReleaseBatch(
        lambda: flushed.append(batch.take()), schedule, clock=lambda: 0.0
    )
    batch.add([("lease:a", "t1")])
    batch.add([("lease:b", "t2")])
    assert flushed == []
    assert [call.delay for call in calls] == [RELEASE_BATCH_DELAY]
    calls[0].function()
    assert flushed == [[("lease:a", "t1"), ("lease:b", "t2")]]
    batch.add([("lease:c", "t3")])  # a new timer, taken by a check first
    assert len(calls) == 2
    assert batch.take() == [("lease:c", "t3")]
    batch.cancel()
    assert calls[1].cancelled


def test_a_release_the_next_send_may_take_over_waits_longer() -> None:
    calls: list[FakeCall] = []

    def schedule(delay: float, function: Any) -> FakeCall:
        calls.append(FakeCall(delay, function))
        return calls[-1]

    now = [0.0]
    flushed: list[list[tuple[str, str]]] = []
    batch = ReleaseBatch(
        lambda: flushed.append(batch.take()), schedule, clock=lambda: now[0]
    )
    batch.add([("lease:a", "t1")], HANDOVER_RELEASE_DELAY)
    assert [call.delay for call in calls] == [HANDOVER_RELEASE_DELAY]
    # Anything that frees no lease keeps that timer.
    now[0] = 0.002
    batch.later()
    assert len(calls) == 1
    # A release another process may wait for shortens it, from the oldest.
    batch.add([("lease:b", "t2")])
    assert calls[0].cancelled
    assert calls[1].delay == pytest.approx(RELEASE_BATCH_DELAY - 0.002)
    now[0] = 0.003
    batch.later()
    assert len(calls) == 2
    calls[1].function()
    assert flushed == [[("lease:a", "t1"), ("lease:b", "t2")]]
    # Once everything went out, the next release waits as long as it may.
    now[0] = 0.01
    batch.add([("lease:a", "t3")], HANDOVER_RELEASE_DELAY)
    assert calls[2].delay == HANDOVER_RELEASE_DELAY
    batch.cancel()


def test_the_fallback_keeps_each_process_to_its_share_of_a_limit() -> None:
    # Limit 4 over 2 processes: 2 in flight here; a limit below the number
    # of processes still lets each send one; no limit never blocks.
    assert fallback_check([("a", 4, 1, 0.0)], 2) == (0.0, None)
    assert fallback_check([("a", 4, 2, 0.0)], 2) == (0.0, "a")
    assert fallback_check([("a", 1, 0, 0.0)], 3) == (0.0, None)
    assert fallback_check([("a", 1, 1, 0.0)], 3) == (0.0, "a")
    assert fallback_check([("a", None, 99, 0.0), ("b", 8, 8, 0.0)], 1) == (0.0, "b")
