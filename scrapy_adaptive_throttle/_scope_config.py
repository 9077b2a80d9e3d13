"""The value types of :setting:`THROTTLING_SCOPES` entries, for type checkers.

The settings themselves are read and validated in :mod:`._settings`.
"""

from __future__ import annotations

from typing import TypedDict


class BackoffConfig(TypedDict, total=False):
    """Per-scope override of the ``BACKOFF_*`` settings."""

    http_codes: list[int]
    exceptions: list[str]
    delay_factor: float
    max_delay: float
    min_delay: float
    jitter: float | list[float]


class RampupConfig(TypedDict, total=False):
    """Value of the ``"rampup"`` key of a scope when given as a dict."""

    backoff_target: float | list[float]
    delay_factor: float
    min_delay: float


class ThrottlingScopeConfig(TypedDict, total=False):
    """Value type of :setting:`THROTTLING_SCOPES` entries."""

    concurrency: int
    min_concurrency: int
    delay: float
    jitter: float | list[float]
    quota: float
    window: float
    rampup: bool | RampupConfig
    manager: str | type
    backoff: BackoffConfig
    ignore_robots_txt: bool
    latency_tolerance: float
    latency_window: float
    initial_concurrency: int
