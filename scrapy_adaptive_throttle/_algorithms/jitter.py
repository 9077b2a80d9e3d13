"""Multiplicative jitter for delays.

Rule: a delay ``d`` becomes ``max(0, d * (1 + u))`` with ``u`` drawn uniformly
from the offsets ``(low, high)``; a delay of zero (or less) and the range
``(0, 0)`` leave it untouched. This is the list form of ``_apply_jitter`` in
Scrapy's throttling pull request #6931 (``BACKOFF_JITTER`` as ``[low, high]``),
with a floor at zero added so that a wide negative offset cannot produce a
negative delay.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TypeAlias

__all__ = ["NO_JITTER", "JitterRange", "apply_jitter"]

JitterRange: TypeAlias = tuple[float, float]
"""Offsets ``(low, high)``: a delay is multiplied by ``1 + uniform(low, high)``."""

NO_JITTER: JitterRange = (0.0, 0.0)
"""The range that leaves every delay unchanged."""


def apply_jitter(
    value: float,
    jitter: JitterRange,
    uniform: Callable[[float, float], float] = random.uniform,
) -> float:
    """Return *value* scaled by a random factor drawn from *jitter*.

    :param value: a delay in seconds.
    :param jitter: offsets ``(low, high)``; the factor is ``1 + uniform(low, high)``.
    :param uniform: the random source, injected so that tests are deterministic.
    :return: *value* itself (and *uniform* is not called) when *value* <= 0 or
        *jitter* is ``(0, 0)``; otherwise the jittered value, never below 0.
    """
    low, high = jitter
    # Skipping the draw keeps the common no-jitter path free of a random call
    # and keeps a zero delay exactly zero.
    if value <= 0 or (low == 0 and high == 0):
        return value
    return max(0.0, value * (1.0 + uniform(low, high)))
