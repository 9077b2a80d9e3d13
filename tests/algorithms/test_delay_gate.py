"""The delay gate: spacing from each send, jitter, floor, refunds, restamps."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapy_adaptive_throttle._algorithms.delay_gate import DelayGate


def low(a: float, b: float) -> float:
    return a


@given(
    delay=st.floats(min_value=0.0, max_value=100.0),
    floor=st.floats(min_value=0.0, max_value=100.0),
)
def test_no_jitter_spaces_two_sends_closer_than_the_floor(
    delay: float, floor: float
) -> None:
    gate = DelayGate((-0.9, 0.9), uniform=low)
    gate.floor = floor
    assert gate.spacing(delay, backed_off=False) >= floor
    assert gate.spacing(delay, backed_off=True) >= floor


def test_a_backed_off_delay_is_not_jittered_again() -> None:
    gate = DelayGate((-0.5, 0.5), uniform=low)
    assert gate.spacing(2.0, backed_off=False) == 1.0
    assert gate.spacing(2.0, backed_off=True) == 2.0


def test_the_drawn_spacing_is_the_one_the_send_uses() -> None:
    draws = iter([0.5, -0.5])
    gate = DelayGate((-0.5, 0.5), uniform=lambda a, b: next(draws))
    assert gate.draw(2.0, backed_off=False) == 3.0
    assert gate.draw(2.0, backed_off=False) == 3.0  # kept, not redrawn
    gate.record_send(10.0, 2.0, backed_off=False, paced_until=None)
    assert gate.next_send_at == 13.0
    assert gate.wait(12.0) == 1.0


def test_a_forgotten_draw_is_redrawn() -> None:
    draws = iter([0.5, -0.5])
    gate = DelayGate((-0.5, 0.5), uniform=lambda a, b: next(draws))
    gate.draw(2.0, backed_off=False)
    gate.forget_draw()
    gate.record_send(10.0, 2.0, backed_off=False, paced_until=None)
    assert gate.next_send_at == 11.0


def test_a_pace_keeps_the_gate_closed_longer() -> None:
    gate = DelayGate((0.0, 0.0))
    gate.record_send(10.0, 1.0, backed_off=False, paced_until=15.0)
    assert gate.next_send_at == 15.0


def test_only_the_last_untouched_send_is_refunded() -> None:
    gate = DelayGate((0.0, 0.0))
    gate.record_send(10.0, 1.0, backed_off=False, paced_until=None)
    gate.record_send(11.0, 1.0, backed_off=False, paced_until=None)
    assert not gate.refund(10.0, paced=False)  # not the last send
    assert gate.refund(11.0, paced=False)
    assert gate.next_send_at == 11.0
    assert not gate.refund(11.0, paced=False)  # once


@pytest.mark.parametrize("moved", ["push_back", "paced"])
def test_a_moved_gate_is_not_refunded(moved: str) -> None:
    gate = DelayGate((0.0, 0.0))
    gate.record_send(10.0, 1.0, backed_off=False, paced_until=None)
    if moved == "push_back":
        gate.push_back(20.0)
    assert not gate.refund(10.0, paced=moved == "paced")
    assert gate.next_send_at == (20.0 if moved == "push_back" else 11.0)


def test_a_restamped_send_spaces_the_next_from_its_arrival() -> None:
    draws = iter([0.5])
    gate = DelayGate((-0.5, 0.5), uniform=lambda a, b: next(draws))
    gate.record_send(10.0, 2.0, backed_off=False, paced_until=None)
    assert gate.next_send_at == 13.0
    # Reached the downloader 0.4 s later: the same drawn spacing, from then.
    assert gate.restamp(10.0, 10.4)
    assert gate.next_send_at == 13.4
    assert not gate.restamp(10.0, 10.4)  # nothing more to move


def test_only_the_last_untouched_send_is_restamped() -> None:
    gate = DelayGate((0.0, 0.0))
    gate.record_send(10.0, 1.0, backed_off=False, paced_until=None)
    gate.record_send(11.0, 1.0, backed_off=False, paced_until=None)
    assert not gate.restamp(10.0, 11.5)  # a later send started its own spacing
    assert gate.next_send_at == 12.0
    gate.push_back(20.0)  # a backoff hold: it decides, not the arrival
    assert not gate.restamp(11.0, 11.5)
    assert gate.next_send_at == 20.0


def test_a_restamp_keeps_a_pace_that_ends_later() -> None:
    gate = DelayGate((0.0, 0.0))
    gate.record_send(10.0, 1.0, backed_off=False, paced_until=15.0)
    assert not gate.restamp(10.0, 10.5)  # 11.5 is inside the pace
    assert gate.next_send_at == 15.0
    assert gate.restamp(10.0, 14.5)
    assert gate.next_send_at == 15.5


def test_a_restamped_send_is_still_refunded() -> None:
    gate = DelayGate((0.0, 0.0))
    gate.record_send(10.0, 1.0, backed_off=False, paced_until=None)
    assert gate.restamp(10.0, 10.3)
    assert gate.refund(10.0, paced=False)
    assert gate.next_send_at == 0.0
