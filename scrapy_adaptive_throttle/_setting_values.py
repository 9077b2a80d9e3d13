"""Converters from raw setting values to typed ones.

Each raises :exc:`ValueError` naming the setting, the scope and the key (for
:setting:`THROTTLING_SCOPES` entries) and the value, so a typo stops the
crawl at start-up instead of silently changing how hard a site is hit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from scrapy.utils.misc import load_object

from ._algorithms import JitterRange


def _where(setting: str, scope: str | None, key: str | None) -> str:
    if scope is None:
        return setting
    return f"{setting}[{scope!r}][{key!r}]"


def invalid_value(
    setting: str, scope: str | None, key: str | None, value: Any, expected: str
) -> ValueError:
    return ValueError(
        f"Invalid {_where(setting, scope, key)} value {value!r}: {expected}"
    )


def to_float(
    value: Any,
    setting: str,
    *,
    scope: str | None = None,
    key: str | None = None,
    minimum: float = 0.0,
    exclusive_minimum: bool = False,
) -> float:
    """Return *value* as a finite float >= *minimum* (or > it), else raise."""
    if isinstance(value, bool):
        raise invalid_value(setting, scope, key, value, "expected a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise invalid_value(setting, scope, key, value, "expected a number") from None
    if not math.isfinite(number):
        raise invalid_value(setting, scope, key, value, "expected a finite number")
    if number < minimum or (exclusive_minimum and number == minimum):
        bound = ">" if exclusive_minimum else ">="
        raise invalid_value(
            setting, scope, key, value, f"expected a number {bound} {minimum}"
        )
    return number


def to_int(
    value: Any,
    setting: str,
    *,
    scope: str | None = None,
    key: str | None = None,
    minimum: int = 0,
) -> int:
    """Return *value* as an int >= *minimum*, else raise.

    Integral strings and floats (``"4"``, ``4.0``) are accepted, as Scrapy's
    ``getint`` does; ``"abc"``, ``2.5`` and booleans are not.
    """
    if isinstance(value, bool):
        raise invalid_value(setting, scope, key, value, "expected an integer")
    if isinstance(value, int):
        number = value
    else:
        try:
            as_float = float(value)
        except (TypeError, ValueError):
            raise invalid_value(
                setting, scope, key, value, "expected an integer"
            ) from None
        if not as_float.is_integer():
            raise invalid_value(setting, scope, key, value, "expected an integer")
        number = int(as_float)
    if number < minimum:
        raise invalid_value(
            setting, scope, key, value, f"expected an integer >= {minimum}"
        )
    return number


def to_bool(
    value: Any, setting: str, *, scope: str | None = None, key: str | None = None
) -> bool:
    """Return *value* as a bool (``True``/``False``, 0/1 and their strings)."""
    if isinstance(value, bool):
        return value
    if value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in {"true", "false", "0", "1"}:
        return value.strip().lower() in {"true", "1"}
    raise invalid_value(setting, scope, key, value, "expected True or False")


def to_jitter(
    value: Any,
    setting: str,
    *,
    scope: str | None = None,
    key: str | None = None,
    allow_bool: bool = False,
) -> JitterRange:
    """Return a jitter as a ``(low, high)`` range of offsets.

    A number ``j`` means ``±j``; a ``[low, high]`` pair is taken as is; with
    *allow_bool* (:setting:`RANDOMIZE_DOWNLOAD_DELAY`) ``True`` means ±50%.
    """
    if isinstance(value, bool):
        if not allow_bool:
            raise invalid_value(
                setting, scope, key, value, "expected a number or [low, high]"
            )
        return (-0.5, 0.5) if value else (0.0, 0.0)
    if (
        isinstance(value, str)
        and allow_bool
        and value.strip().lower() in {"true", "false"}
    ):
        return (-0.5, 0.5) if value.strip().lower() == "true" else (0.0, 0.0)
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != 2:
            raise invalid_value(
                setting, scope, key, value, "expected a [low, high] pair"
            )
        low = to_float(value[0], setting, scope=scope, key=key, minimum=-1.0)
        high = to_float(value[1], setting, scope=scope, key=key, minimum=-1.0)
        if low > high:
            raise invalid_value(setting, scope, key, value, "low must not exceed high")
        return (low, high)
    magnitude = to_float(value, setting, scope=scope, key=key)
    if magnitude > 1:
        raise invalid_value(
            setting, scope, key, value, "expected a fraction between 0 and 1"
        )
    return (-magnitude, magnitude)


def to_target(
    value: Any, setting: str, *, scope: str | None = None, key: str | None = None
) -> tuple[float, float]:
    """Return a rampup backoff target as a ``(low, high)`` range."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != 2:
            raise invalid_value(
                setting, scope, key, value, "expected a number or [low, high]"
            )
        low = to_float(value[0], setting, scope=scope, key=key)
        high = to_float(value[1], setting, scope=scope, key=key)
        if low > high:
            raise invalid_value(setting, scope, key, value, "low must not exceed high")
        return (low, high)
    number = to_float(value, setting, scope=scope, key=key)
    return (number, number)


def to_class(
    value: Any, setting: str, *, scope: str | None = None, key: str | None = None
) -> type:
    """Load a class given as a class or an import path."""
    if isinstance(value, type):
        return value
    if not isinstance(value, str):
        raise invalid_value(
            setting, scope, key, value, "expected a class or an import path"
        )
    try:
        loaded = load_object(value)
    except (ImportError, NameError, ValueError, AttributeError) as exc:
        raise invalid_value(
            setting, scope, key, value, f"cannot import it ({exc})"
        ) from None
    if not isinstance(loaded, type):
        raise invalid_value(setting, scope, key, value, "it is not a class")
    return loaded


#: The methods every scope manager must have: the manager falls back to
#: defaults for the rest of ``ThrottlingScopeManagerProtocol``, not for these.
SCOPE_MANAGER_METHODS = ("can_send", "record_sent", "record_done")


def to_scope_manager_class(
    value: Any, setting: str, *, scope: str | None = None, key: str | None = None
) -> type:
    """Load a scope manager class, checking it implements the protocol.

    Checked at start-up because the first call would otherwise come with the
    first request of the scope, deep in the scheduler, where the mistake (a
    manager class given as a scope manager, say) fails every request of the
    scope instead of the crawl's start.
    """
    cls = to_class(value, setting, scope=scope, key=key)
    missing = [
        name for name in SCOPE_MANAGER_METHODS if not callable(getattr(cls, name, None))
    ]
    if missing:
        raise invalid_value(
            setting,
            scope,
            key,
            value,
            "it does not implement ThrottlingScopeManagerProtocol "
            f"(missing: {', '.join(missing)})",
        )
    return cls


def to_exceptions(
    value: Any, setting: str, *, scope: str | None = None, key: str | None = None
) -> tuple[type[BaseException], ...]:
    """Load a list of exception classes (classes or import paths)."""
    if isinstance(value, str) or not isinstance(value, Sequence | set | frozenset):
        raise invalid_value(
            setting, scope, key, value, "expected a list of exception classes"
        )
    classes: list[type[BaseException]] = []
    for item in value:
        cls = to_class(item, setting, scope=scope, key=key)
        if not issubclass(cls, BaseException):
            raise invalid_value(
                setting, scope, key, item, "it is not an exception class"
            )
        classes.append(cls)
    return tuple(classes)


def to_codes(
    value: Any, setting: str, *, scope: str | None = None, key: str | None = None
) -> frozenset[int]:
    """Load a list of HTTP status codes."""
    if isinstance(value, str) or not isinstance(value, Sequence | set | frozenset):
        raise invalid_value(
            setting, scope, key, value, "expected a list of HTTP status codes"
        )
    codes = set()
    for item in value:
        code = to_int(item, setting, scope=scope, key=key, minimum=100)
        if code > 999:
            raise invalid_value(
                setting, scope, key, item, "expected an HTTP status code"
            )
        codes.add(code)
    return frozenset(codes)
