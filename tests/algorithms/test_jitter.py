from __future__ import annotations

import pytest

from scrapy_adaptive_throttle._algorithms import NO_JITTER, apply_jitter


def never_called(low: float, high: float) -> float:
    raise AssertionError("uniform must not be called")


def test_no_jitter_constant() -> None:
    assert NO_JITTER == (0.0, 0.0)


@pytest.mark.parametrize("value", [0.0, -1.0, 2.5])
def test_no_jitter_returns_value_without_drawing(value: float) -> None:
    assert apply_jitter(value, NO_JITTER, never_called) == value


@pytest.mark.parametrize("value", [0.0, -0.5])
def test_non_positive_value_is_not_jittered(value: float) -> None:
    assert apply_jitter(value, (-0.5, 0.5), never_called) == value


@pytest.mark.parametrize(
    ("draw", "expected"),
    [(-0.5, 1.0), (0.0, 2.0), (0.25, 2.5)],
)
def test_value_is_multiplied_by_one_plus_draw(draw: float, expected: float) -> None:
    calls: list[tuple[float, float]] = []

    def uniform(low: float, high: float) -> float:
        calls.append((low, high))
        return draw

    assert apply_jitter(2.0, (-0.5, 0.25), uniform) == pytest.approx(expected)
    assert calls == [(-0.5, 0.25)]


def test_result_is_never_negative() -> None:
    assert apply_jitter(2.0, (-3.0, -2.0), lambda low, high: low) == 0.0


def test_default_uniform_stays_in_range() -> None:
    for _ in range(200):
        assert 0.9 <= apply_jitter(1.0, (-0.1, 0.1)) <= 1.1
