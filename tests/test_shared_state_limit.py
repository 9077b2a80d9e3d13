"""One latency-adaptive limit per scope across processes (issue 13).

Two :class:`SharedState` objects on one real ``redis-server`` stand for two
processes; each has a :class:`SharedAdaptiveLimit` for the same scope. The
leader (whoever calls :meth:`AdaptiveScopes.lead` first) is fed the samples
of both, with the scope's leases as the in-flight count, and publishes the
limit the check script then enforces on both.
"""

from __future__ import annotations

import time
import uuid

import pytest

from scrapy_adaptive_throttle._algorithms import LatencyLimit
from scrapy_adaptive_throttle._algorithms.concurrency import AdaptiveLimit
from scrapy_adaptive_throttle._shared_limit import (
    ACTIVE_FOR,
    FOLLOW_INTERVAL,
    LEADER_INTERVAL,
    LEADER_TTL,
    SharedAdaptiveLimit,
    share_limit,
)
from scrapy_adaptive_throttle._shared_state import RECHECK_INTERVAL, SharedState
from scrapy_adaptive_throttle._shared_state_settings import SharedStateSettings
from tests.fake_clock import FakeClock
from tests.test_shared_state import Timers, make_state

SCOPE = "host"


@pytest.fixture
def prefix() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


class RecordingLimit(SharedAdaptiveLimit):
    """Records the samples the leader feeds it: ``(kind, in flight)``."""

    __slots__ = ("fed",)

    def feed(self, kind: str, now: float, latency: float, in_flight: int) -> None:
        self.fed.append((kind, in_flight))
        super().feed(kind, now, latency, in_flight)


def adaptive(
    state: SharedState, initial: float = 2.0, scope_id: str = SCOPE
) -> RecordingLimit:
    algorithm = LatencyLimit(
        initial=initial, minimum=1, maximum=16, tolerance=1.5, window=30.0
    )
    limit = RecordingLimit(
        algorithm, ceiling=16, no_ceiling=16, scope_id=scope_id, scopes=state.adaptive
    )
    limit.fed = []
    return limit


def send(state: SharedState, limit: SharedAdaptiveLimit, in_flight: int) -> object:
    wait, blocked = state.check([(SCOPE, limit.limit, in_flight, 0.0)])
    if wait > 0 or blocked is not None:
        return None
    request = object()
    state.claim(request, [SCOPE])  # type: ignore[arg-type]
    return request


def test_the_leader_is_fed_every_process_samples_with_the_global_in_flight(
    redis_server, prefix
):
    first, second = make_state(redis_server, prefix), make_state(redis_server, prefix)
    one, two = adaptive(first), adaptive(second)
    first.adaptive.lead()
    second.adaptive.lead()
    assert first.adaptive.leading == {SCOPE}
    assert second.adaptive.leading == set()
    # Each process sends one request: the leases count 1 then 2.
    sent = [send(first, one, 0), send(second, two, 0)]
    assert all(request is not None for request in sent)
    # The second process's answer: sent with its release.
    two.on_response(time.monotonic(), 0.05, 1, error=False)
    second.release(sent[1])  # type: ignore[arg-type]
    first.adaptive.lead()
    # Both sends (leases 1 and 2, across processes) and the answer (2 leases
    # when it went out: before the release that follows it).
    assert one.fed == [("s", 1), ("s", 2), ("r", 2)]
    assert two.fed == []
    # The non-leader's own rule is not fed while sharing.
    assert two.algorithm.best is None
    assert one.algorithm.best == pytest.approx(0.05)


def test_the_published_limit_holds_every_process(redis_server, prefix):
    first, second = make_state(redis_server, prefix), make_state(redis_server, prefix)
    one, two = adaptive(first, initial=3), adaptive(second, initial=16)
    first.adaptive.lead()  # leader: its limit (3) is published
    first.adaptive.lead()
    assert redis_server.client().get(f"{prefix}:limit:{SCOPE}") == b"3"
    # The second process's own limit is 16, but the scope's is 3, across both.
    sent = [send(second, two, 0), send(second, two, 1), send(first, one, 0)]
    assert all(request is not None for request in sent)
    assert two.limit == 3
    assert second.check([(SCOPE, two.limit, 2, 0.0)]) == (0.0, SCOPE)
    assert first.check([(SCOPE, one.limit, 1, 0.0)]) == (0.0, SCOPE)
    # A process with nothing in flight there looks again soon.
    third = make_state(redis_server, prefix)
    own = adaptive(third, initial=16)
    assert third.check([(SCOPE, own.limit, 0, 0.0)]) == (RECHECK_INTERVAL, None)
    assert own.limit == 3


def test_the_lead_is_taken_over_when_the_leader_stops(redis_server, prefix):
    first, second = make_state(redis_server, prefix), make_state(redis_server, prefix)
    kept = [adaptive(first), adaptive(second)]  # (weakly registered)
    first.adaptive.lead()
    second.adaptive.lead()
    assert second.adaptive.leading == set()
    # The leader stops renewing (killed): its lead expires.
    time.sleep(LEADER_TTL + 0.1)
    second.adaptive.lead()
    assert second.adaptive.leading == {SCOPE}
    first.adaptive.lead()
    assert first.adaptive.leading == set()
    assert kept


def test_a_new_leader_goes_on_from_the_published_limit_and_baseline(
    redis_server, prefix
):
    first, second = make_state(redis_server, prefix), make_state(redis_server, prefix)
    one, two = adaptive(first, initial=3), adaptive(second, initial=16)
    first.adaptive.lead()
    request = send(first, one, 0)
    one.on_response(time.monotonic(), 0.05, 1, error=False)
    first.release(request)  # type: ignore[arg-type]
    first.adaptive.lead()  # fed: baseline 0.05
    first.adaptive.lead()  # published with the limit
    client = redis_server.client()
    assert client.get(f"{prefix}:limit:{SCOPE}") == b"3"
    assert client.get(f"{prefix}:baseline:{SCOPE}") == b"0.050000"
    # The leader stops (killed: no resignation); its lead expires.
    time.sleep(LEADER_TTL + 0.1)
    second.adaptive.lead()
    assert second.adaptive.leading == {SCOPE}
    # Its own limit was never fed while the first led (16, in slow start):
    # it goes on from the published one instead.
    assert (two.own_limit, two.limit) == (3, 3)
    assert two.algorithm.best == pytest.approx(0.05)
    assert not two.algorithm.in_slow_start


def test_a_leader_that_closes_hands_the_lead_over_at_once(redis_server, prefix):
    first, second = make_state(redis_server, prefix), make_state(redis_server, prefix)
    kept = [adaptive(first, initial=5), adaptive(second, initial=16)]
    first.adaptive.lead()
    second.adaptive.lead()
    assert second.adaptive.leading == set()
    first.close()  # the crawl ends: it gives the lead up
    second.adaptive.lead()  # no LEADER_TTL to wait
    assert second.adaptive.leading == {SCOPE}
    assert kept[1].own_limit == 5


def test_a_limit_changed_by_a_drain_is_published_by_it(redis_server, prefix):
    state = make_state(redis_server, prefix)
    limit = adaptive(state, initial=8)
    state.adaptive.lead()
    client = redis_server.client()
    assert client.get(f"{prefix}:limit:{SCOPE}") == b"8"
    request = send(state, limit, 0)
    limit.on_overload(time.monotonic())  # goes out with the release
    state.release(request)  # type: ignore[arg-type]
    state.adaptive.lead()
    # Halved on that drain, and enforced at once, not a drain (0.1 s) later.
    assert limit.own_limit == 4
    assert client.get(f"{prefix}:limit:{SCOPE}") == b"4"
    assert not limit.algorithm.held


def test_a_scope_idle_in_a_process_is_not_led_by_it(redis_server, prefix):
    first, second = make_state(redis_server, prefix), make_state(redis_server, prefix)
    one, two = adaptive(first), adaptive(second)
    first.adaptive.lead()
    assert first.adaptive.leading == {SCOPE}
    # The leader stops using the scope: it leaves the lead, which the
    # process that still uses it takes once it expires.
    one.active_at = time.monotonic() - ACTIVE_FOR - 1
    first.adaptive.lead()
    assert first.adaptive.leading == set()
    time.sleep(LEADER_TTL + 0.1)
    two.on_sent(time.monotonic(), 1)
    second.adaptive.lead()
    assert second.adaptive.leading == {SCOPE}


def test_every_key_of_the_shared_limit_expires(redis_server, prefix):
    state = make_state(redis_server, prefix)
    limit = adaptive(state)
    state.adaptive.lead()
    request = send(state, limit, 0)
    limit.on_response(time.monotonic(), 0.05, 1, error=False)
    state.release(request)  # type: ignore[arg-type]
    state.adaptive.lead()
    client = redis_server.client()
    keys = client.keys(f"{prefix}:*")
    kinds = {key.decode().split(":")[1] for key in keys}
    assert kinds >= {"leader", "limit", "baseline"}
    assert all(client.pttl(key) > 0 for key in keys)


def test_without_redis_the_process_adapts_on_its_own(own_redis_server, prefix):
    state = make_state(own_redis_server, prefix, processes=2)
    limit = adaptive(state, initial=4)
    state.adaptive.lead()
    own_redis_server.stop()
    assert send(state, limit, 0) is not None  # the fallback admits it
    assert not state.sharing
    # Its own rule is fed again, and its own limit is divided by 2.
    limit.on_sent(time.monotonic(), 1)
    limit.on_response(time.monotonic(), 0.05, 1, error=False)
    assert limit.algorithm.best == pytest.approx(0.05)
    assert limit.limit == limit.own_limit
    assert state.check([(SCOPE, limit.limit, limit.limit // 2, 0.0)]) == (0.0, SCOPE)


def test_only_adaptive_limits_of_a_shared_crawl_are_wrapped(redis_server):
    from scrapy.utils.test import get_crawler

    from scrapy_adaptive_throttle._algorithms.concurrency import FixedLimit

    algorithm = LatencyLimit(initial=2, minimum=1, maximum=8)
    plain = AdaptiveLimit(algorithm, ceiling=8, no_ceiling=16)
    without = get_crawler()
    assert share_limit(without, SCOPE, plain, 16) is plain
    crawler = get_crawler(settings_dict={"THROTTLING_STATE_URL": redis_server.url})
    state = SharedState.from_crawler(crawler)
    assert state is not None
    shared = share_limit(crawler, SCOPE, plain, 16)
    assert isinstance(shared, SharedAdaptiveLimit)
    assert shared.ceiling == 8
    assert shared.algorithm is algorithm
    fixed = FixedLimit(4)
    assert share_limit(crawler, SCOPE, fixed, 16) is fixed
    state.close()


def lead_alone(state: SharedState, limit: SharedAdaptiveLimit) -> None:
    """Make *state* lead SCOPE alone: a drain that holds only its samples."""
    state.adaptive.lead()
    request = send(state, limit, 0)
    limit.on_response(time.monotonic(), 0.05, 1, error=False)
    state.release(request)  # type: ignore[arg-type]
    state.adaptive.lead()
    assert state.adaptive.alone == {SCOPE}


def test_a_leader_alone_adapts_at_once_as_one_process_would(redis_server, prefix):
    state = make_state(redis_server, prefix)
    limit = adaptive(state, initial=2)
    client = redis_server.client()
    state.adaptive.lead()
    # An empty drain is no sign of being alone: nothing was sent yet.
    assert state.adaptive.alone == set()
    lead_alone(state, limit)
    # Its answers feed its limit as they come, not a drain later, and the
    # limit is enforced here at once (slow start: one more per fast answer).
    before = limit.own_limit
    sent = [send(state, limit, in_flight) for in_flight in range(before)]
    assert all(request is not None for request in sent)
    now = time.monotonic()
    for request in sent:
        limit.on_response(now, 0.05, before, error=False)
        state.release(request)  # type: ignore[arg-type]
    assert limit.own_limit > before
    assert limit.limit == limit.own_limit
    # Nothing goes to Redis for the leader's own sends and answers...
    assert state.adaptive.samples == []
    assert client.llen(f"{prefix}:samples:{SCOPE}") == 0
    # ...but every drain publishes its limit for a process that joins.
    state.adaptive.lead()
    assert client.get(f"{prefix}:limit:{SCOPE}") == str(limit.own_limit).encode()


def test_another_process_sample_ends_leading_alone(redis_server, prefix):
    first, second = make_state(redis_server, prefix), make_state(redis_server, prefix)
    one, two = adaptive(first, initial=4), adaptive(second, initial=16)
    lead_alone(first, one)
    one.fed.clear()
    # The leader's limit counts every process's leases: its check passes
    # its own limit, and the second process's checks the published one.
    first.adaptive.lead()  # publishes 4
    assert send(second, two, 0) is not None
    assert two.limit == one.own_limit
    first.adaptive.lead()  # drains the second's send
    assert first.adaptive.alone == set()
    assert one.fed == [("s", 1)]
    # From now on the leader's own answers go to Redis with the others'.
    one.on_response(time.monotonic(), 0.05, 1, error=False)
    samples = redis_server.client().lrange(f"{prefix}:samples:{SCOPE}", 0, -1)
    assert [sample.split()[0] for sample in samples] == [b"r"]


def test_a_process_kept_out_by_the_leases_ends_leading_alone(redis_server, prefix):
    first, second = make_state(redis_server, prefix), make_state(redis_server, prefix)
    one, two = adaptive(first, initial=2), adaptive(second, initial=16)
    lead_alone(first, one)
    one.fed.clear()
    first.adaptive.lead()  # publishes its limit
    held = [send(first, one, in_flight) for in_flight in range(one.own_limit)]
    assert all(request is not None for request in held)
    # Every lease is the leader's: the second process may not send, and has
    # no sample of a send or an answer to show; its waiting is one.
    assert second.check([(SCOPE, two.limit, 0, 0.0)]) == (RECHECK_INTERVAL, None)
    limit_before = one.own_limit
    first.adaptive.lead()
    assert first.adaptive.alone == set()
    # The waiting send was drained, and changes nothing in the rule.
    assert [kind for kind, _ in one.fed] == ["w"]
    assert one.own_limit == limit_before


def test_a_process_that_only_follows_tries_to_lead_less_often(redis_server, prefix):
    clock = FakeClock(100.0)
    timers = Timers()
    leader = make_state(redis_server, prefix)
    led = adaptive(leader)  # (kept: the process's limits are weak references)
    led.active_at = time.monotonic()
    leader.adaptive.lead()
    assert leader.adaptive.leading == {SCOPE}
    config = SharedStateSettings(
        url=redis_server.url, prefix=prefix, processes=1, lease_ttl=30.0
    )
    follower = SharedState(config, clock=clock, schedule=timers)
    limit = adaptive(follower)
    limit.active_at = clock()
    # A new scope: its first try comes soon (the lead may be free).
    assert [delay for delay, _ in timers.armed] == [LEADER_INTERVAL]
    timers.armed.pop()[1]()
    assert follower.adaptive.leading == set()
    # Led by another process: the next try waits longer.
    assert [delay for delay, _ in timers.armed] == [FOLLOW_INTERVAL]
    # A scope new to this process brings the next try forward.
    other = adaptive(follower, scope_id="other")
    other.active_at = clock()
    assert [delay for delay, _ in timers.armed] == [LEADER_INTERVAL]
    timers.armed.pop()[1]()
    assert follower.adaptive.leading == {"other"}
    assert [delay for delay, _ in timers.armed] == [LEADER_INTERVAL]
    # The leader gives the first scope up: the follower takes it over at
    # its next try, and leads at the leader's pace from then on.
    leader.close()
    timers.armed.pop()[1]()
    assert follower.adaptive.leading == {SCOPE, "other"}
    follower.close()
