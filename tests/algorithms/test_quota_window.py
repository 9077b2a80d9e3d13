from __future__ import annotations

import math

import pytest

from scrapy_adaptive_throttle._algorithms import QuotaWindow


def test_initial_state() -> None:
    quota = QuotaWindow(10.0, 60.0)
    assert (quota.quota, quota.window, quota.consumed) == (10.0, 60.0, 0.0)
    assert quota.window_start is None
    assert quota.wait(0.0, 5.0) == 0.0


def test_oversized_request_allowed_when_nothing_consumed() -> None:
    quota = QuotaWindow(10.0, 60.0)
    assert quota.wait(0.0, 50.0) == 0.0
    quota.consume(0.0, 50.0)
    assert quota.wait(1.0, 1.0) == 59.0


def test_wait_until_the_window_ends() -> None:
    quota = QuotaWindow(10.0, 60.0)
    quota.consume(5.0, 8.0)
    assert quota.wait(20.0, 2.0) == 0.0
    assert quota.wait(20.0, None) == 0.0
    assert quota.wait(20.0, 3.0) == 45.0
    quota.consume(20.0, 2.0)
    assert quota.wait(30.0, None) == 0.0
    assert quota.wait(30.0, 0.5) == 35.0


def test_window_starts_at_first_use_and_rolls_forward() -> None:
    quota = QuotaWindow(10.0, 60.0)
    quota.consume(5.0, 10.0)
    assert quota.window_start == 5.0
    assert quota.wait(64.9, 1.0) == pytest.approx(0.1)
    assert quota.wait(65.0, 1.0) == 0.0
    assert quota.consumed == 0.0
    assert quota.window_start == 65.0
    # A long idle period keeps the boundaries where the first use put them.
    quota.consume(400.0, 10.0)
    assert quota.window_start == 365.0
    assert quota.wait(400.0, 1.0) == 25.0


def test_float_window_boundaries_never_wait_a_whole_window() -> None:
    quota = QuotaWindow(1.0, 0.1)
    quota.consume(0.0, 1.0)
    assert quota.wait(0.3, 1.0) == 0.0
    quota.consume(0.3, 1.0)
    assert 0.0 < quota.wait(0.3, 1.0) <= 0.1


def test_consume_none_or_zero_starts_the_window() -> None:
    quota = QuotaWindow(10.0, 60.0)
    quota.consume(3.0, None)
    assert (quota.window_start, quota.consumed) == (3.0, 0.0)
    quota.consume(4.0, 0.0)
    assert (quota.window_start, quota.consumed) == (3.0, 0.0)


@pytest.mark.parametrize("amount", [-5.0, math.nan])
def test_unusable_amount_consumes_nothing(amount: float) -> None:
    quota = QuotaWindow(10.0, 60.0)
    quota.consume(0.0, amount)
    assert quota.consumed == 0.0


@pytest.mark.parametrize("window", [0.0, -1.0])
def test_window_zero_never_waits(window: float) -> None:
    quota = QuotaWindow(1.0, window)
    quota.consume(0.0, 5.0)
    assert quota.wait(0.0, 5.0) == 0.0
    assert quota.consumed == 0.0


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"remaining": 3.0}, 7.0),
        ({"remaining": 0.0}, 10.0),
        ({"remaining": 15.0}, 0.0),
        ({"remaining": 3.0, "consumed": 100.0}, 7.0),
        ({"consumed": 2.0}, 6.0),
        ({"consumed": -1.5}, 2.5),
        ({"consumed": -100.0}, 0.0),
        ({}, 4.0),
        ({"remaining": math.nan}, 4.0),
        ({"consumed": math.inf}, 4.0),
    ],
)
def test_reconcile(kwargs: dict[str, float], expected: float) -> None:
    quota = QuotaWindow(10.0, 60.0)
    quota.consume(0.0, 4.0)
    quota.reconcile(1.0, **kwargs)
    assert quota.consumed == expected


def test_reconcile_rolls_the_window_first() -> None:
    quota = QuotaWindow(10.0, 60.0)
    quota.consume(0.0, 9.0)
    quota.reconcile(61.0, consumed=1.0)
    assert quota.consumed == 1.0
    assert quota.window_start == 60.0


def test_reconcile_before_first_use_starts_the_window() -> None:
    quota = QuotaWindow(10.0, 60.0)
    quota.reconcile(7.0, remaining=0.0)
    assert quota.window_start == 7.0
    assert quota.wait(10.0, 1.0) == 57.0
    assert quota.wait(67.0, 1.0) == 0.0


@pytest.mark.parametrize(
    ("quota", "amount", "expected"),
    [
        (10.0, None, 0.0),
        (10.0, 0.0, 0.0),
        (10.0, 2.5, 0.25),
        (10.0, 20.0, 2.0),
        (0.0, 1.0, math.inf),
        (10.0, math.nan, 0.0),
    ],
)
def test_share(quota: float, amount: float | None, expected: float) -> None:
    assert QuotaWindow(quota, 60.0).share(amount) == expected
