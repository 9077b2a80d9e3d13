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
    assert manager.calls == [
        ("record_backoff", (), {"delay": 3.0, "now": 1.0}),
        ("set_base_delay", (2.0,), {}),
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
