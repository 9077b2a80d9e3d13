"""A cache hit gives its send back to the shared state (THROTTLING_STATE_URL).

Two :class:`SharedState` objects on one real ``redis-server`` stand for two
crawler processes, as in ``tests/test_shared_state.py``: a request answered
from Scrapy's HTTP cache never reached the host, so the spacing its send set
on the shared next-send time and the amount it spent from the shared quota
window are given back, unless something moved them since. The crawl test
(a warm HTTP cache, a delay, through Redis) is in
``tests/test_other_plugins.py``.
"""

from __future__ import annotations

import time
import uuid

import pytest

from tests.test_shared_state import make_state, send


@pytest.fixture
def prefix() -> str:
    return f"refund-{uuid.uuid4().hex[:8]}"


def test_a_cache_hit_gives_its_spacing_back_to_every_process(redis_server, prefix):
    first = make_state(redis_server, prefix)
    second = make_state(redis_server, prefix)
    request = send(first, "host", None, spacing=0.5)[2]
    assert request is not None
    assert send(second, "host", None)[0] > 0.4  # the delay holds everyone
    assert first.refund(request, [("host", None, None)]) == ["host"]
    assert send(second, "host", None)[2] is not None
    # The send left the scope's sends too (a 429's pace counts the sends
    # that reached the host): only the second process's send is there.
    client = redis_server.client()
    assert client.zcard(f"{prefix}:sends:host") == 1


def test_a_refund_does_not_open_a_gate_a_later_send_set(redis_server, prefix):
    first = make_state(redis_server, prefix)
    second = make_state(redis_server, prefix)
    request = send(first, "host", None, spacing=0.05)[2]
    assert request is not None
    time.sleep(0.06)
    assert send(second, "host", None, spacing=0.5)[2] is not None
    # The later send of the second process spaces the next one: the first
    # process's cache hit gives nothing back.
    assert first.refund(request, [("host", None, None)]) == []
    assert send(first, "host", None)[0] > 0.4


def test_a_refund_is_given_once_and_only_for_a_leased_send(redis_server, prefix):
    state = make_state(redis_server, prefix)
    request = send(state, "host", None, spacing=0.5)[2]
    assert state.refund(object(), [("host", None, None)]) == []  # type: ignore[arg-type]
    assert send(state, "host", None)[0] > 0.4
    assert state.refund(request, [("host", None, None)]) == ["host"]
    assert state.refund(request, [("host", None, None)]) == []
    state.release(request)


def spend(state, amount, quota=5.0, window=1.0):
    """Check a send of scope ``api`` consuming *amount*; claim it if
    allowed. Returns ``(wait, request)`` (request None when not sent)."""
    wait, blocked = state.check([("api", None, 0, 0.0)], [(quota, window, amount)])
    assert blocked is None
    if wait > 0:
        return wait, None
    request = object()
    state.claim(request, ["api"])
    return wait, request


def test_a_cache_hit_gives_its_amount_back_to_the_shared_window(redis_server, prefix):
    first = make_state(redis_server, prefix)
    second = make_state(redis_server, prefix)
    wait, request = spend(first, 3.0)
    assert wait == 0.0
    assert spend(second, 2.0)[0] == 0.0  # 5 of 5
    assert spend(second, 2.0)[0] > 0.9
    # The 3 units of the cached answer come back, in every process; its
    # send had no spacing, so no next-send time opened.
    assert first.refund(request, [("api", 3.0, 1.0)]) == []
    client = redis_server.client()
    assert float(client.hget(f"{prefix}:quota:api", "consumed")) == 2.0
    assert spend(second, 2.0)[0] == 0.0
    assert spend(second, 2.0)[0] > 0.9  # 4 + 2 > 5


def test_a_refund_leaves_a_later_window_alone(redis_server, prefix):
    state = make_state(redis_server, prefix)
    wait, request = spend(state, 3.0, window=0.2)
    assert wait == 0.0
    time.sleep(0.25)
    # A new window, spent in full: the old send's amount is not taken from it.
    assert spend(state, 5.0, window=0.2)[0] == 0.0
    assert state.refund(request, [("api", 3.0, 0.2)]) == []
    assert spend(state, 1.0, window=0.2)[0] > 0
