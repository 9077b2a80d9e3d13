"""The pure response policy: which responses back off, for how long, and how
a robots.txt Crawl-delay merges with a scope's configured values."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapy_adaptive_throttle._algorithms.response_policy import (
    MAX_REQUEST_DELAY,
    ConfiguredLimits,
    CrawlDelayMerge,
    decide_response_backoff,
    exhausted_quota_delay,
    merge_crawl_delay,
    request_delay_seconds,
    response_delay,
    valid_hold,
)

NOW = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC


class Headers:
    """The two reads the policy makes, over a plain dict of lists."""

    def __init__(self, **fields: str | list[str]) -> None:
        self._fields = {
            name.replace("_", "-").lower().encode(): [
                value.encode()
                for value in (values if isinstance(values, list) else [values])
            ]
            for name, values in fields.items()
        }

    def get(self, key: bytes) -> bytes | None:
        values = self._fields.get(key.lower())
        return values[-1] if values else None

    def getlist(self, key: bytes) -> list[bytes]:
        return self._fields.get(key.lower(), [])


def _never() -> float | None:
    raise AssertionError("read although no scope needs it")


# -- decide_response_backoff ----------------------------------------------------

DEFAULT_CODES = frozenset({429, 503})


@pytest.mark.parametrize(
    ("status", "scopes", "delay", "quota", "expected"),
    [
        # Not a backoff code of any scope, no quota scope: nothing, no reads.
        (200, [("a", DEFAULT_CODES)], None, None, None),
        (404, [("a", frozenset({503}))], None, None, None),
        # A backoff code without a server delay: one exponential step each.
        (503, [("a", DEFAULT_CODES), ("b", DEFAULT_CODES)], None, None, ["a", "b"]),
        # With a server delay: that hold for each triggered scope.
        (503, [("a", DEFAULT_CODES)], 7.0, None, {"a": {"delay": 7.0}}),
        # A zero delay is no delay.
        (503, [("a", DEFAULT_CODES)], 0.0, None, ["a"]),
        # Only the scopes whose codes include the status back off.
        (
            500,
            [("a", frozenset({500})), ("b", frozenset({502}))],
            None,
            None,
            ["a"],
        ),
        # A successful response saying the quota is used up holds 429 scopes.
        (200, [("a", DEFAULT_CODES)], None, 30.0, {"a": {"delay": 30.0}}),
        (200, [("a", frozenset({429}))], None, 0.0, None),
        # Both: the triggered scope steps, the 429 scope is held.
        (
            500,
            [("a", frozenset({500})), ("b", DEFAULT_CODES)],
            None,
            30.0,
            {"a": {}, "b": {"delay": 30.0}},
        ),
        (
            500,
            [("a", frozenset({500})), ("b", DEFAULT_CODES)],
            4.0,
            30.0,
            {"a": {"delay": 4.0}, "b": {"delay": 30.0}},
        ),
    ],
)
def test_decide_response_backoff(status, scopes, delay, quota, expected):
    assert (
        decide_response_backoff(status, scopes, lambda: delay, lambda: quota)
        == expected
    )


def test_header_reads_happen_only_when_a_scope_needs_them():
    # No scope backs off on 503 nor on 429: neither delay is read.
    assert decide_response_backoff(503, [("a", frozenset())], _never, _never) is None
    # A 429 scope and a 429: the server delay is read, not the quota hold.
    assert decide_response_backoff(
        429, [("a", DEFAULT_CODES)], lambda: 2.0, _never
    ) == {"a": {"delay": 2.0}}


# -- server delays ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        (Headers(), None),
        (Headers(Retry_After="5"), 5.0),
        (Headers(Retry_After="Tue, 14 Nov 2023 22:13:50 GMT"), 30.0),
        (Headers(RateLimit_Reset="12"), 12.0),
        # The largest of the fields that give one.
        (Headers(Retry_After="5", RateLimit_Reset="12"), 12.0),
        (Headers(RateLimit='"default";r=0;t=40', Retry_After="5"), 40.0),
        # Garbage is ignored, not raised.
        (Headers(Retry_After="soon"), None),
    ],
)
def test_response_delay(headers, expected):
    assert response_delay(headers, NOW) == expected


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        (Headers(), None),
        (Headers(RateLimit_Remaining="3", RateLimit_Reset="10"), None),
        (Headers(RateLimit_Remaining="0", RateLimit_Reset="10"), 10.0),
        (Headers(RateLimit='"default";r=0;t=25'), 25.0),
        (Headers(RateLimit='"default";r=4;t=25'), None),
        # A structured-field list split over two header lines.
        (Headers(RateLimit=['"burst";r=5;t=1', '"day";r=0;t=60']), 60.0),
    ],
)
def test_exhausted_quota_delay(headers, expected):
    assert exhausted_quota_delay(headers) == expected


# -- holds and per-request delays ---------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (True, None),
        (0, None),
        (-1, None),
        ("nan", None),
        (math.inf, None),
        ("x", None),
        (10**400, None),
        (2, 2.0),
        ("1.5", 1.5),
    ],
)
def test_valid_hold(value, expected):
    assert valid_hold(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (False, None),
        (-0.1, None),
        (MAX_REQUEST_DELAY + 1, None),
        (math.nan, None),
        ("x", None),
        (0, 0.0),
        (MAX_REQUEST_DELAY, MAX_REQUEST_DELAY),
        ("3", 3.0),
    ],
)
def test_request_delay_seconds(value, expected):
    assert request_delay_seconds(value) == expected


@given(st.one_of(st.floats(allow_nan=True), st.integers(), st.text(), st.none()))
def test_a_hold_is_positive_and_finite_or_none(value):
    hold = valid_hold(value)
    assert hold is None or (math.isfinite(hold) and hold > 0)


# -- Crawl-delay merge ------------------------------------------------------------


def _limits(**overrides: object) -> ConfiguredLimits:
    values: dict[str, object] = {
        "ignore_robots_txt": False,
        "explicit_delay": False,
        "delay": 0.0,
        "explicit_concurrency": False,
        "concurrency": 8,
        "min_concurrency": 1,
    }
    values.update(overrides)
    return ConfiguredLimits(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("configured", "keep_delay", "keep_concurrency", "conflicts"),
    [
        # No entry of its own, or one that sets neither: robots.txt applies.
        (None, False, False, ()),
        (_limits(), False, False, ()),
        # An explicit delay at least the Crawl-delay is no conflict: replaced.
        (_limits(explicit_delay=True, delay=5.0), False, False, ()),
        # A lower explicit delay wins, with a conflict to warn about.
        (
            _limits(explicit_delay=True, delay=0.5),
            True,
            False,
            ("delay 0.5 < Crawl-delay 2.0",),
        ),
        # An explicit concurrency other than 1 wins; 1 is no conflict.
        (
            _limits(explicit_concurrency=True, concurrency=4),
            False,
            True,
            ("concurrency 4 > 1",),
        ),
        (
            _limits(explicit_concurrency=True, concurrency=None),
            False,
            True,
            ("concurrency unlimited > 1",),
        ),
        (_limits(explicit_concurrency=True, concurrency=1), False, False, ()),
        (
            _limits(min_concurrency=3),
            False,
            True,
            ("min_concurrency 3 > 1",),
        ),
        # ignore_robots_txt keeps everything, silently.
        (_limits(ignore_robots_txt=True, explicit_delay=True), True, True, ()),
    ],
)
def test_merge_crawl_delay(configured, keep_delay, keep_concurrency, conflicts):
    merge = merge_crawl_delay(configured, 2.0)
    assert merge == CrawlDelayMerge(keep_delay, keep_concurrency, conflicts)
    assert merge.changes_anything is not (keep_delay and keep_concurrency)
