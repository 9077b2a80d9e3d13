from __future__ import annotations

import math
from email.utils import formatdate

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_adaptive_throttle._algorithms import (
    parse_ratelimit,
    parse_ratelimit_remaining,
    parse_ratelimit_reset,
    parse_retry_after,
)

NOW = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC

MALFORMED = [
    None,
    "",
    "   ",
    b"",
    b"\xff\xfe\x00",
    "garbage",
    "-3",
    "-0.5",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "1e309",
    "1e3",
    "1_000",
    "0x10",
    "+5",
    "5 s",
    "１２０",  # noqa: RUF001 - non-ASCII digits, which float() would accept
    "1.2.3",
]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", 120.0),
        (b"120", 120.0),
        (" 120 ", 120.0),
        ("1.5", 1.5),
        (".5", 0.5),
        ("9" * 400, None),  # overflows to infinity
        ("1" + "0" * 30, 1e30),
        ("0", None),
        ("0.0", None),
        (formatdate(NOW + 30, usegmt=True), 30.0),
        (formatdate(NOW + 30, usegmt=True).encode(), 30.0),
        ("Tue, 14 Nov 2023 22:13:50 -0000", 30.0),
        ("Tue, 14 Nov 2023 23:13:50 +0100", 30.0),
        ("Tuesday, 14-Nov-23 22:13:50 GMT", 30.0),
        (formatdate(NOW, usegmt=True), None),
        (formatdate(NOW - 30, usegmt=True), None),
        ("Sun, 06 Nov 1994 08:49:37 GMT", None),
        ("Mon, 01 Jan 0001 00:00:00 +2359", None),
        ("Fri, 31 Dec 9999 23:59:59 GMT", 253402300799.0 - NOW),
        ("Tue, 14 Nov 2023 99:99:99 GMT", None),
        ("Tue, 32 Foo 2023 22:13:50 GMT", None),
        *((value, None) for value in MALFORMED),
    ],
)
def test_parse_retry_after(value: str | bytes | None, expected: float | None) -> None:
    result = parse_retry_after(value, NOW)
    if expected is None:
        assert result is None
    else:
        assert result == pytest.approx(expected)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("5", 5.0),
        (b"5", 5.0),
        ("1.5", 1.5),
        (" 60 ", 60.0),
        ("0", None),
        ("9" * 400, None),
        (formatdate(NOW + 30, usegmt=True), None),
        *((value, None) for value in MALFORMED),
    ],
)
def test_parse_ratelimit_reset(
    value: str | bytes | None, expected: float | None
) -> None:
    assert parse_ratelimit_reset(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", 0.0),
        (b"7", 7.0),
        ("2.5", 2.5),
        ("9" * 400, None),
        *((value, None) for value in MALFORMED),
    ],
)
def test_parse_ratelimit_remaining(
    value: str | bytes | None, expected: float | None
) -> None:
    assert parse_ratelimit_remaining(value) == expected


POLICY = '"burst";q=100;w=60, "daily";q=1000;w=86400, slow;w=5'


@pytest.mark.parametrize(
    ("ratelimit", "policy", "expected"),
    [
        ('"default";r=0;t=10', None, 10.0),
        (b'"default";r=0;t=10', None, 10.0),
        ("default;r=0;t=10", None, 10.0),
        ('"default";t=10;r=0', None, 10.0),
        ('"default" ; r=0 ; t=10', None, 10.0),
        ('"default";r=5;t=10', None, None),
        ('"default";t=10', None, None),
        ('"default";r=0', None, None),
        ('"default";r=0;t=0', None, None),
        ('"a";r=0;t=10, "b";r=0;t=30, "c";r=1;t=90', None, 30.0),
        ('"a";r=3;t=10, "b";r=0;t=4', None, 4.0),
        ('"a;b,c";r=0;t=7', None, 7.0),
        ('"a\\"b";r=0;t=7', None, 7.0),
        # The policy's window stands in for a missing reset time.
        ('"burst";r=0', POLICY, 60.0),
        ("burst;r=0", POLICY, 60.0),
        ('"slow";r=0', POLICY, 5.0),
        ('"burst";r=0, "daily";r=0', POLICY, 86400.0),
        ('"burst";r=0;t=3', POLICY, 3.0),
        ('"burst";r=0;t=0', POLICY, None),
        ('"other";r=0', POLICY, None),
        ('"burst";r=1', POLICY, None),
        ('"burst";r=0', b"\xff\xfe", None),
        ('"burst";r=0', "garbage;;;==,,", None),
        # The older dictionary form.
        ("limit=10, remaining=0, reset=5", None, 5.0),
        (b"limit=10, remaining=0, reset=5", None, 5.0),
        ("limit=10;w=1, remaining=0, reset=5", None, 5.0),
        ("limit=10, remaining=3, reset=5", None, None),
        ("limit=10, remaining=0", None, None),
        ("limit=10, remaining=0, reset=-5", None, None),
        ("limit=10, remaining=0, reset=nan", None, None),
        # Malformed values.
        (None, None, None),
        ("", None, None),
        ("garbage", None, None),
        (b"\xff\xfe\x00", None, None),
        ('"unterminated;r=0;t=5', None, None),
        ('"default";r=0;t=1e309', None, None),
        ('"default";r=0;t=inf', None, None),
        ('"default";r=0;t=-10', None, None),
        ('"default";r=-0;t=10', None, None),
        ('"default";r=nan;t=10', None, None),
        ('"default";r;t=10', None, None),
        (",,,;;;===", None, None),
    ],
)
def test_parse_ratelimit(
    ratelimit: str | bytes | None,
    policy: str | bytes | None,
    expected: float | None,
) -> None:
    assert parse_ratelimit(ratelimit, policy) == expected


header_values = st.one_of(
    st.none(),
    st.text(max_size=80),
    st.binary(max_size=80),
    st.text(alphabet='0123456789.-+eE ";=,rtqw\\abcdefinINF', max_size=40),
    st.builds(
        lambda seconds: formatdate(NOW + seconds, usegmt=True),
        st.floats(min_value=-1e9, max_value=1e9),
    ),
)


def check_result(result: float | None, *, zero_ok: bool = False) -> None:
    if result is not None:
        assert math.isfinite(result)
        assert result >= 0 if zero_ok else result > 0


@settings(max_examples=300, deadline=None)
@given(
    value=header_values,
    other=header_values,
    now=st.floats(allow_nan=True, allow_infinity=True),
)
def test_no_value_raises(
    value: str | bytes | None, other: str | bytes | None, now: float
) -> None:
    check_result(parse_retry_after(value, now))
    check_result(parse_retry_after(value, NOW))
    check_result(parse_ratelimit_reset(value))
    check_result(parse_ratelimit_remaining(value), zero_ok=True)
    check_result(parse_ratelimit(value, other))
    check_result(parse_ratelimit(value))
