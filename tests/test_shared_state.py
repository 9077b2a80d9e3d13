"""The Redis backend of THROTTLING_STATE_URL, against a real redis-server.

Two :class:`SharedState` objects on one server stand for two crawler
processes; requests are plain objects (the backend only keys on them).
Times that matter (lease expiry, spacing, holds) are the Redis server's, so
these tests sleep briefly where a real crawl would wait; the reconnection
backoff runs on an injected fake clock.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import pytest
from scrapy.settings import Settings

from scrapy_adaptive_throttle._redis_client import (
    RECONNECT_MAX_DELAY,
    SAMPLE_BATCH_DELAY,
)
from scrapy_adaptive_throttle._shared_state import (
    HANDOVER_FOR,
    RECHECK_INTERVAL,
    RECONNECT_MIN_DELAY,
    SharedState,
    SharedStateSettings,
    SharedStateUnavailableError,
    redact_url,
)
from tests.fake_clock import FakeClock
from tests.redis_server import RedisServer


def make_state(
    server: RedisServer,
    prefix: str,
    *,
    lease_ttl: float = 30.0,
    processes: int = 1,
    clock: Any = time.monotonic,
) -> SharedState:
    config = SharedStateSettings(
        url=server.url, prefix=prefix, processes=processes, lease_ttl=lease_ttl
    )
    return SharedState(config, clock=clock)


@pytest.fixture
def prefix() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def send(state: SharedState, scope: str, limit: int | None, spacing: float = 0.0):
    """Check a one-scope send; reserve it (claim) if allowed. Returns
    ``(wait, blocked, request)`` (request None when not sent)."""
    wait, blocked = state.check([(scope, limit, 0, spacing)])
    if wait > 0 or blocked is not None:
        return wait, blocked, None
    request = object()
    state.claim(request, [scope])  # type: ignore[arg-type]
    return wait, blocked, request


def test_leases_are_counted_across_processes(redis_server, prefix):
    first = make_state(redis_server, prefix)
    second = make_state(redis_server, prefix)
    sent = [send(first, "host", 3)[2], send(second, "host", 3)[2]]
    sent.append(send(first, "host", 3)[2])
    assert all(request is not None for request in sent)
    # The limit is reached across both: neither may send now.
    assert send(second, "host", 3)[:2] == (RECHECK_INTERVAL, None)
    assert send(first, "host", 3)[:2] == (RECHECK_INTERVAL, None)
    # With a request of its own in flight, a process is told which scope
    # blocks it (its own release wakes it).
    assert second.check([("host", 3, 1, 0.0)]) == (0.0, "host")
    second.release(sent[1])  # type: ignore[arg-type]
    assert send(first, "host", 3)[2] is not None
    assert redis_server.client().zcard(first.lease_key("host")) == 3


def test_other_scopes_are_independent(redis_server, prefix):
    state = make_state(redis_server, prefix)
    assert send(state, "a", 1)[2] is not None
    assert send(state, "a", 1)[2] is None
    assert send(state, "b", 1)[2] is not None
    assert send(state, "c", None)[2] is not None  # no limit


def test_a_request_of_several_scopes_takes_all_or_nothing(redis_server, prefix):
    state = make_state(redis_server, prefix)
    assert send(state, "b", 1)[2] is not None
    wait, blocked = state.check([("a", 1, 0, 0.0), ("b", 1, 1, 0.0)])
    assert (wait, blocked) == (0.0, "b")
    # Nothing was leased on "a" by the refused send.
    assert redis_server.client().zcard(state.lease_key("a")) == 0


def test_the_leases_of_a_killed_process_expire(redis_server, prefix):
    killed = make_state(redis_server, prefix, lease_ttl=0.3)
    survivor = make_state(redis_server, prefix, lease_ttl=0.3)
    assert send(killed, "host", 2)[2] is not None
    assert send(killed, "host", 2)[2] is not None
    assert send(survivor, "host", 2)[2] is None
    time.sleep(0.4)  # the killed process never releases
    assert send(survivor, "host", 2)[2] is not None
    assert send(survivor, "host", 2)[2] is not None


def test_spacing_is_a_shared_next_send_time(redis_server, prefix):
    first = make_state(redis_server, prefix)
    second = make_state(redis_server, prefix)
    assert send(first, "host", None, spacing=0.3)[2] is not None
    wait, blocked, request = send(second, "host", None)
    assert request is None
    assert blocked is None
    assert 0.2 < wait <= 0.3
    time.sleep(wait + 0.01)
    assert send(second, "host", None)[2] is not None


def test_processes_waiting_for_a_spaced_scope_take_turns(redis_server, prefix):
    # Three processes wait for the next send of a scope spaced 0.2 s: each
    # gets its own turn, one spacing after the one before, instead of all
    # asking again when it opens (where one gets the send and the others
    # ask again, once per waiting process and send).
    spacing = 0.2
    first, *waiting = (make_state(redis_server, prefix) for _ in range(4))
    assert send(first, "host", None, spacing)[2] is not None
    waits = [send(state, "host", None, spacing)[0] for state in waiting]
    start = time.monotonic()
    assert 0.15 < waits[0] <= spacing
    assert waits[1] == pytest.approx(waits[0] + spacing, abs=0.03)
    assert waits[2] == pytest.approx(waits[0] + 2 * spacing, abs=0.03)
    # Asking again before its turn is answered without a round trip, and
    # Redis keeps the turn too (asked with the local memory of it gone);
    # a process without a turn (the first, whose own gate opened) takes
    # the next one: no send jumps the queue.
    commands = waiting[2].commands
    assert send(waiting[2], "host", None, spacing)[0] == pytest.approx(
        waits[2], abs=0.03
    )
    assert waiting[2].commands == commands
    waiting[2]._opens.clear()
    assert send(waiting[2], "host", None, spacing)[0] == pytest.approx(
        waits[2], abs=0.03
    )
    assert waiting[2].commands == commands + 1
    assert send(first, "host", None, spacing)[0] == pytest.approx(
        waits[0] + 3 * spacing, abs=0.03
    )
    # Each sends at its turn: at its first try, or (a spacing counts from
    # the previous send, which came a few ms after its turn) at the second,
    # a few ms later.
    checks = 0
    for state, wait in zip(waiting, waits, strict=True):
        time.sleep(max(0.0, start + wait - time.monotonic()))
        while True:
            checks += 1
            retry, blocked, request = send(state, "host", None, spacing)
            assert blocked is None
            if request is not None:
                break
            assert retry < 0.05
            time.sleep(retry)
        # Others still hold turns (the first process at least): the send
        # took this process's next turn at once, so its next check waits
        # for it without a round trip.
        commands = state.commands
        assert send(state, "host", None, spacing)[0] > 2 * spacing
        assert state.commands == commands
    assert checks <= 2 * len(waiting)
    keys = redis_server.client().keys(f"{prefix}:turns:*")
    assert keys
    assert 0 < redis_server.client().pttl(keys[0]) <= 3_000


def test_turns_catch_up_with_a_pace_a_late_send_restarted(redis_server, prefix):
    # Four processes take turns at a scope paced 0.1 s. One sends 0.08 s
    # after its turn (more than half an interval late): the pace's
    # schedule restarts from that send, later than the turns the others
    # hold. The next turn to come finds the scope still closed; every turn
    # then moves on with the schedule, so that only that round asks too
    # early, not every send for the rest of the crawl.
    interval = 0.1
    states = [make_state(redis_server, prefix) for _ in range(4)]
    for state in states:
        state.paces.check_args = lambda scope_id: (round(interval * 1e6), "")  # type: ignore[method-assign]
    due = dict.fromkeys(range(len(states)), time.monotonic())
    sends = checks = 0
    early = []
    while sends < 24:
        index = min(due, key=due.__getitem__)
        state = states[index]
        time.sleep(max(0.0, due[index] - time.monotonic()))
        if sends == 8:
            time.sleep(0.08)  # late
        before = state.commands
        wait, blocked, request = send(state, "host", None)
        assert blocked is None
        checks += state.commands - before
        if request is None:
            assert wait > 0
            if sends > 8 and state.commands > before:
                early.append(sends)
        else:
            sends += 1
            # Its next turn, taken with the send (no round trip).
            wait = send(state, "host", None)[0]
            assert wait > 0
        due[index] = time.monotonic() + wait
    # After the late send: one round of the four asks early, then none.
    assert len(early) <= 4, early
    assert all(at <= 14 for at in early), early


def test_a_process_alone_waits_for_the_next_send_only(redis_server, prefix):
    # Turns order processes that wait together. Alone, a process waits for
    # the scope's next send, whatever spacing a refused check of it drew
    # (jitter: 0.5 s here), not for the turn after its own.
    state = make_state(redis_server, prefix)
    assert send(state, "host", None, 0.05)[2] is not None
    wait = send(state, "host", None, 0.5)[0]
    assert 0 < wait <= 0.05
    time.sleep(wait)
    assert send(state, "host", None, 0.05)[2] is not None
    assert 0 < send(state, "host", None, 0.05)[0] <= 0.05


def test_a_hold_in_one_process_holds_every_process(redis_server, prefix):
    first = make_state(redis_server, prefix)
    second = make_state(redis_server, prefix)
    first.hold("host", 0.5)
    wait, _, request = send(second, "host", 4)
    assert request is None
    assert 0.4 < wait <= 0.5
    # A shorter hold does not shorten it.
    second.hold("host", 0.1)
    assert send(first, "host", 4)[0] > 0.3


def test_unclaimed_lease_is_freed_by_the_next_check(redis_server, prefix):
    state = make_state(redis_server, prefix)
    assert state.check([("host", 1, 0, 0.0)]) == (0.0, None)  # leased, unclaimed
    # The next check (e.g. of another request) frees it first.
    assert state.check([("host", 1, 0, 0.0)]) == (0.0, None)
    state.drop_pending()
    assert redis_server.client().zcard(state.lease_key("host")) == 0


def test_every_key_expires(redis_server, prefix):
    state = make_state(redis_server, prefix, lease_ttl=20.0)
    send(state, "host", 2, spacing=1.0)
    state.hold("host", 2.0)
    client = redis_server.client()
    keys = sorted(key.decode() for key in client.keys(f"{prefix}:*"))
    assert keys == sorted(
        [
            *(f"{prefix}:{kind}:host" for kind in ("hold", "lease", "next", "sends")),
            state._marker,
        ]
    )
    ttls = {key: client.pttl(key) for key in keys}
    assert 0 < ttls[f"{prefix}:lease:host"] <= 20_000
    assert 0 < ttls[state._marker] <= 20_000
    assert 0 < ttls[f"{prefix}:sends:host"] <= 2_000
    assert 0 < ttls[f"{prefix}:next:host"] <= 2_000
    assert 0 < ttls[f"{prefix}:hold:host"] <= 3_000


def test_fallback_when_redis_is_lost_and_recovery(own_redis_server, prefix, caplog):
    clock = FakeClock(1000.0)
    state = make_state(own_redis_server, prefix, processes=2, clock=clock)
    first = send(state, "host", 4)[2]
    assert first is not None
    own_redis_server.stop()
    with caplog.at_level(logging.INFO, "scrapy_adaptive_throttle._shared_state"):
        # Fallback: limit 4 / 2 processes = 2 in flight in this process.
        assert state.check([("host", 4, 1, 0.0)]) == (0.0, None)
        fallback_sent = object()
        state.claim(fallback_sent, ["host"])  # type: ignore[arg-type]
        assert state.check([("host", 4, 2, 0.0)]) == (0.0, "host")
        assert not state.sharing
        state.release(first)  # type: ignore[arg-type]  # no error, no wait
        own_redis_server.start()  # restarted empty
        # Not retried before the backoff delay...
        assert state.check([("host", 4, 1, 0.0)]) == (0.0, None)
        assert not state.sharing
        clock.now += RECONNECT_MIN_DELAY
        # ...then shared again, with the request sent meanwhile leased again.
        assert state.check([("host", 4, 1, 0.0)]) == (0.0, None)
    assert state.sharing
    state.drop_pending()
    assert own_redis_server.client().zcard(state.lease_key("host")) == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "THROTTLING_STATE_URL" in warnings[0].getMessage()
    assert "divided by THROTTLING_STATE_PROCESSES = 2" in warnings[0].getMessage()
    assert any("Reconnected" in r.getMessage() for r in caplog.records)


def test_a_process_back_first_keeps_its_share_while_others_may_be_in_fallback(
    own_redis_server, prefix
):
    """Two processes lose Redis and each keeps to its share (4 / 2). The
    first one back (Redis restarted empty) must not take the whole limit
    while the other, still in fallback, holds its share unleased: the host
    would get 2 + 4. It keeps its share until the other has had its own
    chance to reconnect, then the shared leases count for both."""
    clock_a, clock_b = FakeClock(1000.0), FakeClock(1000.0)
    a = make_state(own_redis_server, prefix, processes=2, clock=clock_a)
    b = make_state(own_redis_server, prefix, processes=2, clock=clock_b)
    own_redis_server.stop()
    for state in (a, b):
        for in_flight in (0, 1):
            assert state.check([("host", 4, in_flight, 0.0)]) == (0.0, None)
            state.claim(object(), ["host"])  # type: ignore[arg-type]
        assert state.check([("host", 4, 2, 0.0)]) == (0.0, "host")
        assert not state.sharing
    own_redis_server.start()  # restarted empty
    clock_a.now += RECONNECT_MIN_DELAY
    # a is back (its 2 leased again); b has not retried yet.
    assert a.check([("host", 4, 2, 0.0)]) == (0.0, "host")
    assert a.sharing
    assert not b.sharing
    assert own_redis_server.client().zcard(a.lease_key("host")) == 2
    # b retries on its own schedule and is back too, its 2 leased again:
    clock_b.now += RECONNECT_MIN_DELAY
    assert b.check([("host", 4, 2, 0.0)]) == (0.0, "host")
    assert b.sharing
    assert own_redis_server.client().zcard(a.lease_key("host")) == 4
    # Once nobody can still be in fallback, the shared leases are the limit.
    clock_a.now += RECONNECT_MAX_DELAY
    clock_b.now += RECONNECT_MAX_DELAY
    assert a.check([("host", 4, 2, 0.0)]) == (0.0, "host")
    b.release(next(iter(b._leases)))
    b.flush_releases()
    assert a.check([("host", 4, 2, 0.0)]) == (0.0, None)


def test_reconnection_backs_off(own_redis_server, prefix):
    clock = FakeClock(1000.0)
    state = make_state(own_redis_server, prefix, clock=clock)
    own_redis_server.stop()
    state.hold("host", 1.0)  # lost here
    assert not state.sharing
    commands = state.commands
    state.check([("host", 1, 0, 0.0)])
    assert state.commands == commands  # too early to retry
    delays = []
    for _ in range(5):
        before = clock.now
        while state.commands == commands:
            clock.now += 0.05
            state.check([("host", 1, 0, 0.0)])
        commands = state.commands
        delays.append(round(clock.now - before, 2))
    # Each failed retry doubles the wait before the next one.
    assert delays == sorted(delays)
    assert delays[-1] >= 4 * delays[0]


def settings(**values: Any) -> Settings:
    return Settings(values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"THROTTLING_STATE_URL": "http://localhost:6379"},
            "Invalid THROTTLING_STATE_URL value 'http://localhost:6379'",
        ),
        ({"THROTTLING_STATE_URL": 6379}, "Invalid THROTTLING_STATE_URL value 6379"),
        (
            {"THROTTLING_STATE_URL": "redis://:secret@localhost/0x"},
            None,
        ),
        ({"THROTTLING_STATE_PREFIX": ""}, "Invalid THROTTLING_STATE_PREFIX value ''"),
        (
            {"THROTTLING_STATE_PROCESSES": 0},
            "Invalid THROTTLING_STATE_PROCESSES value 0",
        ),
        (
            {"THROTTLING_STATE_PROCESSES": "two"},
            "Invalid THROTTLING_STATE_PROCESSES value 'two'",
        ),
    ],
)
def test_invalid_settings(values, message):
    if message is None:
        SharedStateSettings.from_settings(settings(**values))
        return
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        SharedStateSettings.from_settings(settings(**values))


def test_defaults_and_lease_ttl():
    config = SharedStateSettings.from_settings(settings(DOWNLOAD_TIMEOUT=30))
    assert config.url is None
    assert config.prefix == "throttling"
    assert config.processes == 1
    assert config.lease_ttl == 35.0


def test_password_is_not_shown():
    assert (
        redact_url("redis://user:secret@host:6380/1") == "redis://user:***@host:6380/1"
    )
    with pytest.raises(ValueError, match="THROTTLING_STATE_URL") as info:
        SharedStateSettings.from_settings(
            settings(THROTTLING_STATE_URL="http://user:secret@host")
        )
    assert "secret" not in str(info.value)


def test_unreachable_redis_at_start_is_one_clear_error():
    port = __import__("tests.redis_server", fromlist=["free_port"]).free_port()
    config = SharedStateSettings(
        url=f"redis://127.0.0.1:{port}/0", prefix="p", processes=1, lease_ttl=1.0
    )
    with pytest.raises(SharedStateUnavailableError) as info:
        SharedState(config).ping()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        f"THROTTLING_STATE_URL 'redis://127.0.0.1:{port}/0': cannot reach Redis"
    )


def test_a_release_goes_out_with_the_next_check(redis_server, prefix):
    timers: list[Any] = []
    clock = FakeClock(100.0)
    config = SharedStateSettings(
        url=redis_server.url, prefix=prefix, processes=1, lease_ttl=30.0
    )
    state = SharedState(
        config,
        clock=clock,
        schedule=lambda delay, function: timers.append(function),
    )
    client = redis_server.client()
    first = send(state, "host", 1)[2]
    state.release(first)  # type: ignore[arg-type]
    assert len(timers) == 1  # a flush is scheduled...
    assert client.zcard(state.lease_key("host")) == 1  # ...not sent yet
    commands = state.commands
    # Too long after the last check by Redis to hand the lease on: the next
    # send frees the slot and takes it in one round trip.
    clock.advance(HANDOVER_FOR * 2)
    assert send(state, "host", 1)[2] is not None
    assert state.commands == commands + 1
    assert client.zcard(state.lease_key("host")) == 1
    timers.pop()()  # the timer finds nothing left to send
    assert state.commands == commands + 1
    # Without a send after it, the timer sends the release.
    state.release(next(iter(state._leases)))
    timers.pop()()
    assert state.commands == commands + 2
    assert client.zcard(state.lease_key("host")) == 0


class Timers:
    """Scrapy's ``call_later`` by hand: the timers armed, fired by the test."""

    def __init__(self) -> None:
        self.armed: list[tuple[float, Any]] = []

    def __call__(self, delay: float, function: Any) -> Any:
        entry = (delay, function)
        self.armed.append(entry)
        timers = self

        class Call:
            def cancel(self) -> None:
                timers.armed.remove(entry)

        return Call()

    def fire(self) -> None:
        """Fire the batch timers armed now (not the leader's)."""
        for entry in list(self.armed):
            if entry[0] <= SAMPLE_BATCH_DELAY + 1e-9:
                self.armed.remove(entry)
                entry[1]()


def batched_state(
    redis_server: RedisServer, prefix: str, clock: FakeClock, *, alone: bool = True
):
    """A process whose releases wait for a timer (as in a crawl), leading
    the adaptive scope "host" alone (its last drain held only its own
    samples) unless *alone* is false. Returns ``(state, timers, limit)``."""
    from scrapy_adaptive_throttle._algorithms import LatencyLimit
    from scrapy_adaptive_throttle._shared_limit import SharedAdaptiveLimit

    config = SharedStateSettings(
        url=redis_server.url, prefix=prefix, processes=1, lease_ttl=30.0
    )
    timers = Timers()
    state = SharedState(config, clock=clock, schedule=timers)
    limit = SharedAdaptiveLimit(
        LatencyLimit(initial=2, minimum=1, maximum=16),
        ceiling=16,
        no_ceiling=16,
        scope_id="host",
        scopes=state.adaptive,
    )
    if alone:
        state.adaptive.lead()
        request = send(state, "host", 2)[2]
        limit.on_response(clock(), 0.05, 1, error=False)
        state.release(request)  # type: ignore[arg-type]
        state.flush_releases()
        state.adaptive.lead()
        assert state.adaptive.alone == {"host"}
        redis_server.client().delete(f"{prefix}:sends:host")
    return state, timers, limit


def test_a_freed_lease_is_handed_on_to_the_next_send_without_a_round_trip(
    redis_server, prefix
):
    clock = FakeClock(100.0)
    state, timers, _ = batched_state(redis_server, prefix, clock)
    other = make_state(redis_server, prefix)
    client = redis_server.client()
    lease_key = state.lease_key("host")
    first = send(state, "host", 2)[2]
    old = state._leases[first][0]  # type: ignore[index]
    state.release(first)  # type: ignore[arg-type]
    commands = state.commands
    clock.advance(0.01)
    second = send(state, "host", 2)[2]
    assert second is not None
    assert state.commands == commands  # no round trip
    new = state._leases[second][0]
    assert new != old
    # Redis counts the lease all along, under the old token until sent.
    assert client.zrange(lease_key, 0, -1) == [old.encode()]
    # Another process sees it: of a limit of 2, one is left.
    assert send(other, "host", 2)[2] is not None
    assert send(other, "host", 2)[2] is None
    # The hand-over waits for a round trip longer than a release does (from
    # the release it took the place of).
    assert [delay for delay, _ in timers.armed if delay <= SAMPLE_BATCH_DELAY] == [
        pytest.approx(SAMPLE_BATCH_DELAY - 0.01)
    ]
    timers.fire()
    assert state.commands == commands + 1
    assert client.zscore(lease_key, new) is not None
    assert client.zscore(lease_key, old) is None
    assert client.zcard(lease_key) == 2
    # The send joined the scope's sends (the count a 429 learns a pace from).
    assert client.zscore(f"{prefix}:sends:host", new) is not None
    assert client.zcard(f"{prefix}:sends:host") == 3
    # Its release frees the lease as any other.
    state.release(second)  # type: ignore[arg-type]
    timers.fire()
    assert client.zrange(lease_key, 0, -1) != []
    assert client.zscore(lease_key, new) is None


def test_a_lease_handed_on_twice_before_a_round_trip_ends_released(
    redis_server, prefix
):
    clock = FakeClock(100.0)
    state, timers, _ = batched_state(redis_server, prefix, clock)
    client = redis_server.client()
    request = send(state, "host", 1)[2]
    for _ in range(3):
        state.release(request)  # type: ignore[arg-type]
        request = send(state, "host", 1)[2]
        assert request is not None
    state.release(request)  # type: ignore[arg-type]
    timers.fire()
    assert client.zcard(state.lease_key("host")) == 0
    assert client.zcard(f"{prefix}:sends:host") == 4


@pytest.mark.parametrize(
    "case", ["stale", "spacing", "other scopes", "quota", "not alone", "unclaimed"]
)
def test_a_lease_is_not_handed_on_when_redis_must_see_the_send(
    redis_server, prefix, case
):
    clock = FakeClock(100.0)
    state, timers, _ = batched_state(
        redis_server, prefix, clock, alone=case != "not alone"
    )
    client = redis_server.client()
    first = send(state, "host", 2)[2]
    state.release(first)  # type: ignore[arg-type]
    commands = state.commands
    if case == "not alone":
        # Another process's sample was in the last drain (or none led it).
        assert send(state, "host", 2)[2] is not None
    elif case == "stale":
        clock.advance(HANDOVER_FOR * 1.5)
        assert send(state, "host", 2)[2] is not None
    elif case == "spacing":
        assert send(state, "host", 2, spacing=0.2)[2] is not None
    elif case == "other scopes":
        assert state.check([("host", 2, 0, 0.0), ("site", 2, 0, 0.0)]) == (0.0, None)
    elif case == "quota":
        assert state.check([("host", 2, 0, 0.0)], [(10.0, 60.0, None)]) == (0.0, None)
    else:
        # Handed on, but no request claimed it: the next check frees it.
        assert state.check([("host", 2, 0, 0.0)]) == (0.0, None)
        assert state.commands == commands
        assert state.check([("host", 2, 0, 0.0)]) == (0.0, None)
        state.drop_pending()
        timers.fire()
        assert client.zcard(state.lease_key("host")) == 0
        return
    # A check by Redis, which sent the release first.
    assert state.commands == commands + 1
    assert client.zcard(state.lease_key("host")) == 1


def manager(redis_server: RedisServer | None, prefix: str, **settings: Any) -> Any:
    from scrapy.utils.test import get_crawler

    from scrapy_adaptive_throttle import ThrottlingManager

    if redis_server is not None:
        settings["THROTTLING_STATE_URL"] = redis_server.url
    crawler = get_crawler(
        settings_dict={
            "DOWNLOAD_DELAY_JITTER": 0,
            "THROTTLING_STATE_PREFIX": prefix,
            **settings,
        }
    )
    return ThrottlingManager(crawler)


def test_without_the_setting_there_is_no_shared_state(prefix):
    assert manager(None, prefix).shared is None


def test_two_managers_share_a_scope(redis_server, prefix):
    """The manager's own path (check_scopes, reserve_scopes, release,
    delay_scope) through the shared state, as two processes would use it."""
    from scrapy import Request

    first = manager(redis_server, prefix, CONCURRENT_REQUESTS_PER_DOMAIN=1)
    second = manager(redis_server, prefix, CONCURRENT_REQUESTS_PER_DOMAIN=1)
    values = [("example.com", None)]
    request = Request("https://example.com/1")
    assert first.check_scopes(values, first.clock()) == (0.0, None)
    first.reserve_scopes(request, values, first.clock())
    # The other process has nothing in flight: it is told to look again.
    assert second.check_scopes(values, second.clock()) == (RECHECK_INTERVAL, None)
    first.release(request)
    first.shared.flush_releases()
    assert second.check_scopes(values, second.clock()) == (0.0, None)
    second.reserve_scopes(request, values, second.clock())
    second.release(request)
    # delay_scope in one process holds the scope in the other.
    first.delay_scope("example.com", 0.5)
    wait, blocked = second.check_scopes(values, second.clock())
    assert blocked is None
    assert 0.3 < wait <= 0.5


def test_a_script_that_keeps_failing_warns_once_a_minute(redis_server, prefix, caplog):
    """A Redis that answers PING but fails every script (here: a key of
    another type under the prefix) falls back each time, without a warning
    flood; the crawl goes on with the fallback limits."""
    clock = FakeClock(1000.0)
    state = make_state(redis_server, prefix, clock=clock)
    redis_server.client().set(state.lease_key("host"), "not a sorted set")
    with caplog.at_level(logging.INFO, "scrapy_adaptive_throttle._shared_state"):
        for _ in range(5):
            assert state.check([("host", 2, 0, 0.0)]) == (0.0, None)  # fallback
            clock.now += 10.0  # past the retry delay, within the minute
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "WRONGTYPE" in warnings[0].getMessage()


@pytest.mark.parametrize("emptied", ["restarted", "flushed"])
def test_leases_lost_without_a_failed_call_are_taken_again(
    own_redis_server, prefix, caplog, emptied
):
    """redis-py reconnects by itself: a Redis restarted while a process's
    connection was closed (an idle timeout, a proxy in between), flushed or
    failed over answers the next check as if nothing happened, empty. The
    process's marker is gone with the rest, so its check leases its
    requests in flight again before it admits anything."""
    first = make_state(own_redis_server, prefix)
    second = make_state(own_redis_server, prefix)
    in_flight = [send(first, "host", 3)[2] for _ in range(2)]
    assert all(request is not None for request in in_flight)
    if emptied == "restarted":
        for state in (first, second):
            state._client.connection.disconnect()  # reopened by the next call
        own_redis_server.stop()
        own_redis_server.start()
    else:
        own_redis_server.client().flushall()
    client = own_redis_server.client()
    assert client.zcard(first.lease_key("host")) == 0
    with caplog.at_level(logging.WARNING, "scrapy_adaptive_throttle._shared_state"):
        assert send(first, "host", 3)[2] is not None
    assert first.sharing
    assert client.zcard(first.lease_key("host")) == 3
    # The other process sees the whole limit taken (without the marker it
    # would send 2 more: 5 in flight for a limit of 3).
    assert send(second, "host", 3)[:2] == (RECHECK_INTERVAL, None)
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 1, messages
    assert "2 request(s) in flight leased again" in messages[0]
    assert "THROTTLING_STATE_URL" in messages[0]
    # Once leased again, the next checks are plain ones.
    assert send(first, "host", 4)[2] is not None
    assert client.zcard(first.lease_key("host")) == 4
