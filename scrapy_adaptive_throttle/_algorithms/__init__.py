"""Pure throttling algorithms: no Scrapy, no Twisted, no settings, no logging.

Every function and class here takes the current time (``now``, in seconds) and
its samples as arguments and draws randomness from an injected ``uniform``, so
that it can be tested with a fake clock.
"""

from __future__ import annotations

from .backoff import BackoffPolicy, BackoffState
from .headers import (
    parse_ratelimit,
    parse_ratelimit_remaining,
    parse_ratelimit_reset,
    parse_retry_after,
)
from .jitter import NO_JITTER, JitterRange, apply_jitter
from .latency import LatencyLimit
from .quota import QuotaWindow
from .rampup import RampupPolicy, RampupState
from .ratelimit import LearnedRate

__all__ = [
    "NO_JITTER",
    "BackoffPolicy",
    "BackoffState",
    "JitterRange",
    "LatencyLimit",
    "LearnedRate",
    "QuotaWindow",
    "RampupPolicy",
    "RampupState",
    "apply_jitter",
    "parse_ratelimit",
    "parse_ratelimit_remaining",
    "parse_ratelimit_reset",
    "parse_retry_after",
]
