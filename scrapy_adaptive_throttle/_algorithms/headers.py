"""Parsing of server-given delays: ``Retry-After`` and the ``RateLimit`` fields.

Rule: a server that is rate-limiting us may say how long to wait. These
functions turn such header values into seconds, or None when the value says
nothing usable; they never raise, whatever the input (non-UTF-8 bytes, NaN,
infinity, huge or negative numbers, dates in the past, garbage), because a
header is input from the network and a bad one must not crash a crawl.

Sources:

* ``Retry-After``: RFC 9110, section 10.2.3: delay-seconds or an HTTP-date.
  Decimal seconds (``1.5``) are accepted too, since some servers send them.
* ``RateLimit-Reset`` / ``RateLimit-Remaining``: draft-polli-ratelimit-headers-02
  (delta seconds, not an epoch time), as in Scrapy's throttling chapter.
* ``RateLimit`` / ``RateLimit-Policy``: draft-ietf-httpapi-ratelimit-headers,
  whose fields are RFC 8941 structured fields: a list of policy items with
  parameters, ``"default";r=0;t=10`` (``r`` = remaining, ``t`` = seconds until
  the quota resets) and ``"burst";q=100;w=60`` (``w`` = window), and the older
  dictionary form ``limit=10, remaining=0, reset=5``.
"""

from __future__ import annotations

import math
import re
from datetime import timezone
from email.utils import parsedate_to_datetime
from typing import TypeAlias

__all__ = [
    "parse_ratelimit",
    "parse_ratelimit_remaining",
    "parse_ratelimit_reset",
    "parse_retry_after",
]

HeaderValue: TypeAlias = bytes | str | None

# ASCII digits only: float() would also accept "1e309", "nan", "inf", "1_000"
# and non-ASCII digits, none of which is a valid header number.
_NUMBER = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)", re.ASCII)


def parse_retry_after(value: HeaderValue, now: float) -> float | None:
    """Seconds to wait according to a ``Retry-After`` value.

    :param value: the header value.
    :param now: the current UNIX time in seconds, for HTTP-dates.
    :return: a positive finite number of seconds, or None for a missing,
        malformed, zero or past value (0 means "retry now": no delay).
    """
    text = _text(value)
    if not text:
        return None
    number = _number(text)
    if number is not None:
        return number if 0 < number < math.inf else None
    try:
        date = parsedate_to_datetime(text)
        if date.tzinfo is None:
            # RFC 9110 dates are always GMT; "-0000" yields a naive datetime.
            date = date.replace(tzinfo=timezone.utc)
        seconds = date.timestamp() - now
    except Exception:
        # Whatever a malformed date raises (ValueError, OverflowError,
        # OSError from timestamp() ...), it means "no date".
        return None
    return seconds if 0 < seconds < math.inf else None


def parse_ratelimit_reset(value: HeaderValue) -> float | None:
    """Seconds until the quota resets, from a ``RateLimit-Reset`` value.

    :return: a positive finite number of seconds, or None.
    """
    number = _number(_text(value))
    return number if number is not None and 0 < number < math.inf else None


def parse_ratelimit_remaining(value: HeaderValue) -> float | None:
    """Units left in the quota, from a ``RateLimit-Remaining`` value.

    :return: a finite number >= 0, or None.
    """
    number = _number(_text(value))
    return number if number is not None and number < math.inf else None


def parse_ratelimit(ratelimit: HeaderValue, policy: HeaderValue = None) -> float | None:
    """Seconds to wait according to a ``RateLimit`` value.

    :param ratelimit: the ``RateLimit`` value: policy items such as
        ``"default";r=0;t=10`` or the dictionary ``limit=10, remaining=0,
        reset=5``.
    :param policy: the ``RateLimit-Policy`` value, such as
        ``"burst";q=100;w=60``; its window ``w`` stands in for the reset time
        of an exhausted item that has no ``t``.
    :return: the largest reset time among the exhausted items (``r=0``), or
        None when no item is exhausted or none says when it resets.
    """
    text = _text(ratelimit)
    if not text:
        return None
    windows: dict[str, float] | None = None
    result: float | None = None
    dictionary: dict[str, str] = {}
    for member in _split(text, ","):
        parts = _split(member, ";")
        head = parts[0].strip()
        key, sep, bare_value = head.partition("=")
        if sep and not key.startswith('"'):
            dictionary[key.strip().lower()] = bare_value
            continue
        params = _params(parts)
        remaining = _number(params.get("r"))
        if remaining != 0:
            continue
        if "t" in params:
            # t=0 means the quota is back already: no delay, and no fallback.
            reset = _positive(params["t"])
        else:
            if windows is None:
                windows = _policy_windows(policy)
            reset = windows.get(_unquote(head))
        if reset is not None and (result is None or reset > result):
            result = reset
    if dictionary and _number(dictionary.get("remaining")) == 0:
        reset = _positive(dictionary.get("reset"))
        if reset is not None and (result is None or reset > result):
            result = reset
    return result


def _text(value: HeaderValue) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        # Latin-1 maps every byte, so it cannot fail; a non-ASCII byte then
        # simply fails to parse as a number, a date or a token.
        return value.decode("latin-1").strip()
    if isinstance(value, str):
        return value.strip()
    return None


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    text = text.strip()
    if not _NUMBER.fullmatch(text):
        return None
    # Overflow gives inf, never an exception; callers reject it.
    return float(text)


def _positive(text: str | None) -> float | None:
    number = _number(text)
    return number if number is not None and 0 < number < math.inf else None


def _split(text: str, separator: str) -> list[str]:
    """Split *text* at *separator*, except inside double-quoted strings."""
    if '"' not in text:
        return text.split(separator)
    parts: list[str] = []
    start = 0
    quoted = False
    escaped = False
    for index, char in enumerate(text):
        if escaped:
            escaped = False
        elif quoted:
            if char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
        elif char == separator:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


def _params(parts: list[str]) -> dict[str, str]:
    params: dict[str, str] = {}
    for part in parts[1:]:
        key, separator, value = part.partition("=")
        # A parameter without a value is boolean true in RFC 8941.
        params[key.strip().lower()] = value if separator else "?1"
    return params


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    return text


def _policy_windows(policy: HeaderValue) -> dict[str, float]:
    """Map each policy name of a ``RateLimit-Policy`` value to its window."""
    windows: dict[str, float] = {}
    text = _text(policy)
    if not text:
        return windows
    for member in _split(text, ","):
        parts = _split(member, ";")
        window = _positive(_params(parts).get("w"))
        if window is not None:
            windows.setdefault(_unquote(parts[0]), window)
    return windows
