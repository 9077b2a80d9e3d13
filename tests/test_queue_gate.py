"""The queue's gate: the plugin's manager as is, an adapter for the others."""

from __future__ import annotations

import pytest
from scrapy import Request
from scrapy.utils.test import get_crawler

from scrapy_adaptive_throttle import ThrottlingManager
from scrapy_adaptive_throttle._crawler_throttler import get_throttler
from scrapy_adaptive_throttle._queue_gate import (
    ANY_SCOPE,
    PROTOCOL_RECHECK_INTERVAL,
    ProtocolManagerGate,
    missing_manager_methods,
    queue_gate,
)
from scrapy_adaptive_throttle._types import RESOLVED_SCOPES_META_KEY
from tests.fake_clock import FakeClock
from tests.protocol_manager import ProtocolOnlyManager


class ScriptedManager:
    """Answers what the test says, and records what it is asked."""

    def __init__(self):
        self.ready = True
        self.time_until_ready = None
        self.loads = {}
        self.reserved = []
        self.released = []

    async def get_scopes(self, request):
        return ["a", "b"]

    def is_ready(self, request):
        return self.ready

    def get_time_until_ready(self, request):
        return self.time_until_ready

    def reserve(self, request):
        self.reserved.append(request)

    def release(self, request):
        self.released.append(request)

    def get_request_delay(self, request, now=None):
        return 0.0

    def get_scope_load(self, scope_id):
        return self.loads.get(scope_id, 0.0)


def _request(scopes=("a", "b")):
    request = Request("http://example.com/")
    request.meta[RESOLVED_SCOPES_META_KEY] = list(scopes)
    return request


VALUES = [("a", None), ("b", None)]


def test_the_plugins_manager_exposes_its_gate_once():
    crawler = get_crawler(settings_dict={})
    throttler = get_throttler(crawler)
    gate = queue_gate(crawler, throttler)
    assert gate is throttler.queue_gate
    assert queue_gate(crawler, throttler, releasing=True) is gate
    assert gate.needs_head is False


def test_a_protocol_only_manager_gets_the_adapter_once_per_crawler():
    crawler = get_crawler(settings_dict={})
    manager = ProtocolOnlyManager(crawler)
    gate = queue_gate(crawler, manager)
    assert isinstance(gate, ProtocolManagerGate)
    assert gate.needs_head is True
    assert queue_gate(crawler, manager) is gate


def _gate(manager):
    gate = ProtocolManagerGate(manager)
    gate.releases_seen = True  # as with the plugin's downloader
    return gate


def test_without_the_plugins_downloader_a_blocked_head_is_polled():
    manager = ScriptedManager()
    gate = ProtocolManagerGate(manager)
    gate.reserve_scopes(_request(), VALUES, 0.0)
    manager.ready = False
    # No release will come through the gate: never wait for one.
    assert gate.check_scopes(VALUES, 0.0, _request()) == (
        PROTOCOL_RECHECK_INTERVAL,
        None,
    )


def test_ready_time_gated_and_blocked_heads():
    manager = ScriptedManager()
    gate = _gate(manager)
    head = _request()
    assert gate.check_scopes(VALUES, 0.0, head) == (0.0, None)
    manager.ready, manager.time_until_ready = False, 1.5
    assert gate.check_scopes(VALUES, 0.0, head) == (1.5, None)
    # Blocked with nothing in flight that could free a slot: look again soon.
    manager.time_until_ready = None
    assert gate.check_scopes(VALUES, 0.0, head) == (PROTOCOL_RECHECK_INTERVAL, None)
    # With requests in flight, wait for a slot of the busiest scope.
    gate.reserve_scopes(_request(), VALUES, 0.0)
    manager.loads = {"a": 0.5, "b": 1.0}
    assert gate.check_scopes(VALUES, 0.0, head) == (0.0, "b")


def test_release_frees_the_reservation_and_wakes_each_scope():
    manager = ScriptedManager()
    gate = _gate(manager)
    woken = []
    gate.add_release_listener(woken.append)
    request = _request()
    gate.reserve_scopes(request, VALUES, 0.0)
    assert manager.reserved == [request]
    gate.release(request)
    assert manager.released == [request]
    assert woken == ["a", "b", ANY_SCOPE]
    # Nothing left in flight: a blocked head is looked at again later.
    manager.ready = False
    assert gate.check_scopes(VALUES, 0.0, _request())[0] == PROTOCOL_RECHECK_INTERVAL
    gate.remove_release_listener(woken.append)
    gate.release(request)
    assert woken == ["a", "b", ANY_SCOPE]


def test_a_request_sent_through_acquire_still_wakes_its_scopes():
    manager = ScriptedManager()
    gate = _gate(manager)
    woken = []
    gate.add_release_listener(woken.append)
    gate.release(_request(("c",)))
    assert woken == ["c", ANY_SCOPE]


def test_has_free_slot_reads_the_scope_load():
    manager = ScriptedManager()
    gate = ProtocolManagerGate(manager)
    manager.loads = {"a": 1.0, "b": 0.5}
    assert not gate.has_free_slot("a")
    assert gate.has_free_slot("b")


def test_scopes_resolve_without_a_coroutine_when_get_scopes_does_not_wait():
    gate = ProtocolManagerGate(ScriptedManager())
    request = Request("http://example.com/")
    assert gate.resolve_scopes_now(request) == ["a", "b"]
    assert request.meta[RESOLVED_SCOPES_META_KEY] == ["a", "b"]


@pytest.mark.parametrize(
    ("cls", "missing"),
    [
        (ProtocolOnlyManager, []),
        (ScriptedManager, ["acquire", "process_response", "process_exception"]),
    ],
)
def test_missing_manager_methods(cls, missing):
    assert missing_manager_methods(cls) == missing


def test_without_queue_checks_the_queue_hands_out_and_acquire_holds(caplog):
    from tests.protocol_manager import MinimalManager

    manager = MinimalManager(get_crawler(settings_dict={}))
    with caplog.at_level("WARNING"):
        gate = ProtocolManagerGate(manager)
    assert "head-of-line blocking" in caplog.text
    assert gate.check_scopes(VALUES, 0.0, _request()) == (0.0, None)
    request = _request()
    gate.reserve_scopes(request, VALUES, 0.0)
    assert manager.reserved == {}  # acquire() will reserve it
    # Slot key from the resolved scopes when the manager has none.
    assert gate.get_slot_key(_request(("b", "a"))) == "a+b"
    assert gate.get_request_delay(_request()) == 0.0


class RecordingManager(ThrottlingManager):
    """The plugin's manager with ``release`` and ``get_slot_key`` overridden,
    as a subclass may."""

    def __init__(self, crawler):
        super().__init__(crawler)
        self.released = []

    def release(self, request):
        self.released.append(request)
        super().release(request)

    def get_slot_key(self, request):
        return "custom"


def _managers_gate(**settings):
    crawler = get_crawler(settings_dict={"DOWNLOAD_DELAY_JITTER": 0, **settings})
    manager = RecordingManager(crawler)
    clock = FakeClock(1000.0)
    manager.clock = clock
    return manager, manager.queue_gate, clock


def test_the_managers_gate_checks_reserves_and_releases_by_scope_set():
    manager, gate, clock = _managers_gate(
        THROTTLING_SCOPES={
            "a": {"concurrency": 1, "quota": 10},
            "b": {"delay": 5.0, "concurrency": 2},
        }
    )
    assert gate.clock() == clock.now  # the manager's (fake) clock
    assert gate.quotas == {"a": 10}
    woken = []
    gate.add_release_listener(woken.append)
    values = [("a", None), ("b", None)]
    request = _request(("a", "b"))
    assert gate.check_scopes(values, clock.now) == (0.0, None)
    assert gate.has_free_slot("a")
    gate.reserve_scopes(request, values, clock.now)
    assert not gate.has_free_slot("a")
    assert gate.has_free_slot("b")
    wait, blocked = gate.check_scopes(values, clock.now)
    assert wait == pytest.approx(5.0)
    assert blocked == "a"
    # The downloader's release goes through the subclass's release.
    gate.release(request)
    assert manager.released == [request]
    assert woken == ["a", "b"]
    assert gate.has_free_slot("a")
    gate.remove_release_listener(woken.append)
    gate.reserve_scopes(request, values, clock.now)
    gate.release(request)
    assert woken == ["a", "b"]
    assert gate.get_slot_key(request) == "custom"


def test_the_managers_gate_tells_timer_listeners_of_a_refunded_send():
    manager, gate, clock = _managers_gate(
        THROTTLING_SCOPES={"a": {"delay": 5.0, "concurrency": 2}}
    )
    opened = []
    gate.add_timer_listener(opened.append)
    request = _request(("a",))
    gate.reserve_scopes(request, [("a", None)], clock.now)
    assert gate.check_scopes([("a", None)], clock.now)[0] == pytest.approx(5.0)
    manager.refund_cached(request)  # a cache hit: its send never spaced "a"
    assert opened == ["a"]
    assert gate.check_scopes([("a", None)], clock.now) == (0.0, None)
    gate.release(request)
    gate.remove_timer_listener(opened.append)
    gate.reserve_scopes(request, [("a", None)], clock.now)
    manager.refund_cached(request)
    assert opened == ["a"]


def test_a_raised_limit_wakes_the_queue_once_per_added_slot():
    # The registry hands each scope manager it builds the manager's
    # notify_slots_changed: no scope manager looks up crawler.throttler.
    manager, gate, _ = _managers_gate(THROTTLING_SCOPES={"a": {"concurrency": 1}})
    woken = []
    gate.add_release_listener(woken.append)
    manager.get_scope_manager("a").set_concurrency(3)
    assert woken == ["a", "a"]
    manager.get_scope_manager("a").set_concurrency(2)  # lowered: nobody to wake
    assert woken == ["a", "a"]
