"""Which responses back off, for how long, and how a Crawl-delay merges.

Rules (the wiring applies them; these functions only decide):

* A response backs off the scopes whose backoff codes include its status;
  a delay the server gives (``Retry-After``, ``RateLimit-Reset``, an
  exhausted ``RateLimit`` policy) holds them that long, otherwise each takes
  one exponential step. Scopes that back off on 429 are also held by a
  *successful* response that says the quota is used up, since the next answer
  would be a 429 (draft-ietf-httpapi-ratelimit-headers, section 5).
* A hold must be a positive, finite number of seconds: a zero hold would
  count a trigger without slowing anything down.
* A robots.txt Crawl-delay (RFC 9309 leaves it to crawlers; Scrapy's
  throttling chapter applies it as a delay and a concurrency of 1) gives way
  to what a scope's configured entry sets more aggressively, and to
  ``ignore_robots_txt``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .headers import (
    parse_ratelimit,
    parse_ratelimit_remaining,
    parse_ratelimit_reset,
    parse_retry_after,
)

#: The status of a refusal for rate: scopes that back off on it are also held
#: by a successful response saying that the quota is used up.
RATE_LIMITED_STATUS = 429

#: The longest ``throttling_delay`` honoured (one day): a longer one is taken
#: for a mistake (milliseconds, or a timestamp) rather than held for ever.
MAX_REQUEST_DELAY = 86400.0


class HeaderLookup(Protocol):
    """The two reads these rules make of response headers (Scrapy's
    ``Headers`` has them)."""

    def get(self, key: bytes) -> bytes | None: ...

    def getlist(self, key: bytes) -> list[bytes]: ...


def exhausted_ratelimit_delay(headers: HeaderLookup) -> float | None:
    """Seconds until the reset of an exhausted IETF ``RateLimit`` policy."""
    ratelimit = headers.getlist(b"RateLimit")
    if not ratelimit:
        return None
    # A structured-field list may be split over several header lines.
    return parse_ratelimit(
        b", ".join(ratelimit), b", ".join(headers.getlist(b"RateLimit-Policy"))
    )


def response_delay(headers: HeaderLookup, wall_now: float) -> float | None:
    """The largest server-given delay of a backoff response, or ``None``.

    ``Retry-After`` (seconds or an HTTP date, relative to *wall_now*, a Unix
    time), ``RateLimit-Reset`` and an exhausted ``RateLimit`` policy.
    """
    delays = [
        delay
        for delay in (
            parse_retry_after(headers.get(b"Retry-After"), wall_now),
            parse_ratelimit_reset(headers.get(b"RateLimit-Reset")),
            exhausted_ratelimit_delay(headers),
        )
        if delay is not None
    ]
    return max(delays) if delays else None


def exhausted_quota_delay(headers: HeaderLookup) -> float | None:
    """Seconds until the server's quota resets if the headers say that it is
    used up (a ``RateLimit`` policy with ``r=0``, or ``RateLimit-Remaining:
    0`` with its ``RateLimit-Reset``), else ``None``."""
    delays = [exhausted_ratelimit_delay(headers)]
    if parse_ratelimit_remaining(headers.get(b"RateLimit-Remaining")) == 0:
        delays.append(parse_ratelimit_reset(headers.get(b"RateLimit-Reset")))
    valid = [delay for delay in delays if delay is not None]
    return max(valid) if valid else None


def decide_response_backoff(
    status: int,
    scope_codes: Iterable[tuple[Hashable, frozenset[int] | set[int]]],
    delay: Callable[[], float | None],
    quota_delay: Callable[[], float | None],
) -> list[Hashable] | dict[Hashable, dict[str, float]] | None:
    """The backoff data of a response with *status* for its scopes.

    *scope_codes* pairs each scope with its backoff codes. *delay* and
    *quota_delay* are only called when needed (they read headers): the
    server-given delay when a scope's codes include the status, the
    exhausted-quota hold when a scope backs off on 429 but not on this
    status. Returns the bare triggered scopes (one exponential step each),
    ``{scope: {"delay": seconds}}`` holds, or ``None``.
    """
    triggered: list[Hashable] = []
    rate_limited: list[Hashable] = []
    for scope, codes in scope_codes:
        if status in codes:
            triggered.append(scope)
        elif RATE_LIMITED_STATUS in codes:
            rate_limited.append(scope)
    backoff: dict[Hashable, dict[str, float]] = {}
    if triggered:
        seconds = delay()
        if not seconds:
            if not rate_limited:
                return triggered
            backoff.update((scope, {}) for scope in triggered)
        else:
            backoff.update((scope, {"delay": seconds}) for scope in triggered)
    if rate_limited:
        hold_seconds = quota_delay()
        if hold_seconds:
            backoff.update((scope, {"delay": hold_seconds}) for scope in rate_limited)
    return backoff or None


def valid_hold(value: object) -> float | None:
    """A usable hold in seconds, or ``None`` (the trigger then takes an
    exponential step)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        delay = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(delay) or delay <= 0:
        return None
    return delay


def request_delay_seconds(value: object) -> float | None:
    """A ``throttling_delay`` value in seconds, ``None`` if out of range."""
    if isinstance(value, bool):
        return None
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if not 0 <= seconds <= MAX_REQUEST_DELAY:  # also false for nan
        return None
    return seconds


@dataclass(frozen=True)
class ConfiguredLimits:
    """What a scope's configured entry says about delay and concurrency."""

    ignore_robots_txt: bool
    explicit_delay: bool
    delay: float
    explicit_concurrency: bool
    concurrency: int | None
    min_concurrency: int


@dataclass(frozen=True)
class CrawlDelayMerge:
    """How a Crawl-delay applies to a scope: what the configuration keeps,
    and the conflicts to warn about."""

    keep_delay: bool
    keep_concurrency: bool
    conflicts: Sequence[str] = ()

    @property
    def changes_anything(self) -> bool:
        return not (self.keep_delay and self.keep_concurrency)


def merge_crawl_delay(
    configured: ConfiguredLimits | None, delay: float
) -> CrawlDelayMerge:
    """Merge a robots.txt Crawl-delay of *delay* seconds with a scope's
    configured values (``None``: the scope has no entry of its own).

    The Crawl-delay sets the scope's delay (and delay floor) and a
    concurrency of 1, except what the entry sets more aggressively: an
    explicit delay below it, an explicit concurrency other than 1, or a
    ``min_concurrency`` above 1. ``ignore_robots_txt`` keeps both.
    """
    if configured is None:
        return CrawlDelayMerge(keep_delay=False, keep_concurrency=False)
    if configured.ignore_robots_txt:
        return CrawlDelayMerge(keep_delay=True, keep_concurrency=True)
    conflicts = []
    keep_delay = keep_concurrency = False
    if configured.explicit_delay and configured.delay < delay:
        keep_delay = True
        conflicts.append(f"delay {configured.delay!r} < Crawl-delay {delay!r}")
    if configured.explicit_concurrency and configured.concurrency != 1:
        keep_concurrency = True
        limit = configured.concurrency or "unlimited"
        conflicts.append(f"concurrency {limit} > 1")
    elif configured.min_concurrency > 1:
        keep_concurrency = True
        conflicts.append(f"min_concurrency {configured.min_concurrency} > 1")
    return CrawlDelayMerge(keep_delay, keep_concurrency, tuple(conflicts))
