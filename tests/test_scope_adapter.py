"""ScopeAdapter: the defaults a scope manager with only the required methods
gets, and the keyword arguments an older one is not passed."""

from __future__ import annotations

import pytest
from scrapy.utils.test import get_crawler

from scrapy_adaptive_throttle import ThrottlingScopeManager
from scrapy_adaptive_throttle._scope_adapter import ScopeAdapter


class RequiredOnly:
    """The three required methods, and nothing else."""

    def __init__(self) -> None:
        self.active = 0

    def can_send(self, now=None, amount=None):
        return 0.0

    def record_sent(self, now=None, amount=None):
        self.active += 1

    def record_done(self, now=None):
        self.active -= 1


class OlderSignatures(RequiredOnly):
    """Optional methods from before the ``cap`` and ``only_increase``
    arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple, dict]] = []

    def record_backoff(self, delay=None, now=None):
        self.calls.append(("record_backoff", (), {"delay": delay, "now": now}))

    def set_base_delay(self, delay):
        self.calls.append(("set_base_delay", (delay,), {}))

    def record_rate_limited(self, now=None, sent_at=None):
        self.calls.append(("record_rate_limited", (now, sent_at), {}))


def test_a_scope_manager_with_the_required_methods_only_gets_defaults():
    manager = RequiredOnly()
    adapter = ScopeAdapter("a.example", manager)
    assert adapter.concurrency_blocked() is False
    assert adapter.get_load() == 0.0
    assert adapter.get_base_delay() == 0.0
    assert adapter.slot_event() is None
    assert adapter.backs_off() is False
    assert adapter.record_backoff(3.0, 1.0) is False
    assert adapter.refund_send(0.0, 1.0, None) is False
    assert adapter.backoff_wait(1.0) == 0.0  # its time gates: can_send
    assert adapter.get_state(1.0) == {"scope": "a.example", "manager": "RequiredOnly"}
    assert adapter.shared_check() == ("a.example", None, 0, 0.0)
    # Idle means nothing in flight.
    assert adapter.is_idle(1.0, 10.0) is True
    adapter.record_sent(1.0, None)
    assert adapter.is_idle(1.0, 10.0) is False
    # Optional outcomes are dropped, not raised.
    adapter.record_response(0.1, 200, 1.0)
    adapter.record_rate_limited(1.0, 0.5)
    adapter.reconcile_quota(1.0, None, 1.0)
    adapter.apply_crawl_delay(2.0, 1)
    adapter.wake_waiter()
    with pytest.raises(
        TypeError, match=r"'a\.example' \(RequiredOnly\).*set_base_delay"
    ):
        adapter.set_base_delay(1.0, only_increase=False)


def test_keywords_an_older_scope_manager_lacks_are_not_passed():
    manager = OlderSignatures()
    adapter = ScopeAdapter("a.example", manager)
    assert adapter.record_backoff(3.0, 1.0, cap=False) is True
    adapter.set_base_delay(2.0, only_increase=False)
    # A retry refused again is reported as any refusal (the manager decides).
    adapter.record_rate_limited(4.0, 3.5, again=True)
    assert manager.calls == [
        ("record_backoff", (), {"delay": 3.0, "now": 1.0}),
        ("set_base_delay", (2.0,), {}),
        ("record_rate_limited", (4.0, 3.5), {}),
    ]


def test_the_built_in_scope_manager_is_called_with_every_keyword():
    crawler = get_crawler(settings_dict={})
    manager = ThrottlingScopeManager.from_crawler(crawler, {"id": "a.example"})
    adapter = ScopeAdapter("a.example", manager)
    assert adapter.refunds is True
    adapter.set_base_delay(5.0)
    adapter.set_base_delay(1.0, only_increase=False)
    assert adapter.get_base_delay() == 1.0
    # Uncapped: a trusted hold longer than BACKOFF_MAX_DELAY is kept whole.
    crawler = get_crawler(settings_dict={"BACKOFF_MAX_DELAY": 10.0})
    manager = ThrottlingScopeManager.from_crawler(crawler, {"id": "a.example"})
    adapter = ScopeAdapter("a.example", manager)
    assert adapter.record_backoff(20.0, 0.0, cap=False) is True
    assert adapter.backoff_wait(0.0) == pytest.approx(20.0)
    # Capped, as a server-given delay is.
    assert adapter.record_backoff(40.0, 0.0) is True
    assert adapter.backoff_wait(0.0) == pytest.approx(20.0)


# -- the read-only accessors diagnostics and explain use ------------------------


def test_a_custom_scope_manager_reads_as_its_protocol_says():
    manager = RequiredOnly()
    adapter = ScopeAdapter("a.example", manager)
    assert adapter.scope is None
    assert adapter.scope_state(1.0) is None
    assert adapter.reports_state is False
    assert adapter.limit is None
    assert adapter.in_flight == 0
    adapter.record_sent(1.0, None)
    adapter.record_sent(1.0, None)
    assert adapter.in_flight == 2
    manager.concurrency = 3
    assert adapter.limit == 3


def test_a_custom_scope_with_a_state_of_its_own_reports_it():
    class WithState(RequiredOnly):
        def get_state(self, now=None):
            return {"scope": "a.example", "in_flight": self.active, "now": now}

    adapter = ScopeAdapter("a.example", WithState())
    assert adapter.reports_state is True
    assert adapter.scope_state(2.0) is None  # not built on a scope object
    assert adapter.get_state(2.0) == {"scope": "a.example", "in_flight": 0, "now": 2.0}


def test_the_built_in_scope_manager_reads_as_its_typed_state():
    crawler = get_crawler(settings_dict={"DOWNLOAD_DELAY_JITTER": 0})
    config = {"id": "a.example", "concurrency": 2, "delay": 1.5}
    manager = ThrottlingScopeManager.from_crawler(crawler, config)
    adapter = ScopeAdapter("a.example", manager)
    assert adapter.scope is manager.scope
    assert adapter.reports_state is True
    adapter.record_sent(10.0, None)
    state = adapter.scope_state(10.0)
    assert state is not None
    assert (state.in_flight, state.limit, state.delay) == (1, 2, 1.5)
    assert (adapter.in_flight, adapter.limit) == (1, 2)
    assert adapter.get_state(10.0) == state.as_dict()
    adapter.record_sent(10.0, None)
    assert adapter.concurrency_blocked() is True
    adapter.record_done(11.0)
    assert adapter.in_flight == 1
