"""Types, protocols and scope helpers of the throttling system.

Names and signatures follow the throttling chapter of Scrapy's pull request
#6931, so code written for it works with this plugin by changing the import
path from ``scrapy.throttling`` to ``scrapy_adaptive_throttle``.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, TypeVar

from ._meta_keys import (
    AUTOTHROTTLE_DONT_ADJUST_DELAY_META_KEY,
    DONT_TRACK_META_KEY,
    RESOLVED_SCOPES_META_KEY,
)

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from twisted.internet.defer import Deferred
    from typing_extensions import NotRequired, Self
else:  # pragma: no cover - runtime fallbacks for TypedDict keys
    try:
        from typing import NotRequired
    except ImportError:
        from typing_extensions import NotRequired

__all__ = [
    "RESOLVED_SCOPES_META_KEY",
    "BackoffConfig",
    "BackoffData",
    "BackoffScopeData",
    "RampupConfig",
    "RequestScopes",
    "ScopeID",
    "ThrottlingManagerProtocol",
    "ThrottlingScopeConfig",
    "ThrottlingScopeManagerProtocol",
    "add_scope",
    "dont_track",
    "iter_scope_values",
    "iter_scopes",
    "scope_cache",
    "update_scope_backoff",
]

#: A throttling scope identifier.
ScopeID = str


class BackoffScopeData(TypedDict):
    """Backoff data for one scope, as returned by the backoff hooks.

    ``delay`` is a hard minimum wait (like ``Retry-After``); ``consumed`` is
    the difference between actual and estimated quota use; ``remaining`` is
    the remaining quota as reported by the server.
    """

    delay: NotRequired[float]
    consumed: NotRequired[float]
    remaining: NotRequired[float]


#: Scopes of a request: none, one, several, or a dict of scope → expected
#: quota consumption (``None`` for no quota amount).
RequestScopes = None | ScopeID | Iterable[ScopeID] | dict[ScopeID, float | None]

#: What the backoff hooks return: bare scopes mean "this scope is exhausted"
#: (one exponential backoff step); a dict gives details per scope.
BackoffData = None | ScopeID | Iterable[ScopeID] | dict[ScopeID, BackoffScopeData]


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


class ThrottlingManagerProtocol(Protocol):
    """The throttling manager, reachable as ``crawler.throttler``.

    It maps requests to scopes, gates requests on their scopes, and turns
    responses and exceptions into backoff.
    """

    async def get_scopes(self, request: Request) -> RequestScopes:
        """Return the scopes that apply to *request*."""

    async def get_initial_backoff(self) -> BackoffData:
        """Return backoff data to apply before the first request is sent."""

    async def get_response_backoff(self, response: Response) -> BackoffData:
        """Return the backoff update derived from *response*."""

    async def get_exception_backoff(
        self, request: Request, exception: BaseException
    ) -> BackoffData:
        """Return the backoff update derived from a download exception."""

    async def acquire(self, request: Request) -> None:
        """Return once every scope of *request* allows it, having reserved it."""

    def release(self, request: Request) -> None:
        """Free the slots reserved for *request*. Idempotent."""

    def is_ready(self, request: Request) -> bool:
        """Return whether *request* could be sent right now (non-blocking)."""

    def reserve(self, request: Request) -> None:
        """Record *request* as sent; a later :meth:`acquire` returns at once."""

    def get_time_until_ready(self, request: Request) -> float | None:
        """Seconds until every time gate of *request* opens (``None``: open)."""

    def get_slot_key(self, request: Request) -> str:
        """A single string for the scopes of *request* (sorted ids joined by ``+``)."""

    def get_scope_load(self, scope_id: ScopeID) -> float:
        """Active requests of the scope divided by its concurrency limit."""

    def get_request_delay(self, request: Request, now: float | None = None) -> float:
        """Remaining ``throttling_delay`` of *request* (0.0 if none)."""

    def delay_scope(self, scope_id: ScopeID, delay: float) -> None:
        """Hold back a scope for at least *delay* seconds (a backoff trigger)."""

    def get_scope_delay(self, scope_id: ScopeID) -> float:
        """Return the base (non-backoff) delay of a scope."""

    def set_scope_delay(self, scope_id: ScopeID, delay: float) -> None:
        """Set the base delay of a scope, up or down (not a backoff trigger)."""

    async def process_response(self, response: Response) -> None:
        """Update throttling state from a response."""

    async def process_exception(
        self, request: Request, exception: BaseException
    ) -> None:
        """Update throttling state from a download exception."""


class ThrottlingScopeManagerProtocol(Protocol):
    """The state of one throttling scope.

    Only ``can_send``, ``record_sent`` and ``record_done`` are required by
    :class:`~scrapy_adaptive_throttle.ThrottlingManager`; it falls back to
    sensible defaults when any other method is missing.
    """

    @classmethod
    def from_crawler(cls, crawler: Crawler, config: dict[str, Any]) -> Self: ...

    def can_send(self, now: float | None = None, amount: float | None = None) -> float:
        """Seconds to wait before a request consuming *amount* may be sent (0 = now)."""

    def record_sent(
        self, now: float | None = None, amount: float | None = None
    ) -> None:
        """Record that a request was sent, consuming *amount* of quota."""

    def record_done(self, now: float | None = None) -> None:
        """Record that a previously sent request finished."""

    def record_backoff(
        self, delay: float | None = None, now: float | None = None, cap: bool = True
    ) -> None:
        """Apply a backoff trigger; *delay* is a hard minimum wait."""

    def reconcile_quota(
        self,
        consumed: float | None = None,
        remaining: float | None = None,
        now: float | None = None,
    ) -> None:
        """Correct the quota estimate (actual delta, or server-reported rest)."""

    def get_base_delay(self) -> float:
        """Return the base (non-backoff) delay."""

    def set_base_delay(self, delay: float, *, only_increase: bool = True) -> None:
        """Set the base delay (by default only raising it)."""

    def set_concurrency(self, concurrency: int) -> None:
        """Set the maximum concurrency."""

    def concurrency_blocked(self) -> bool:
        """Whether the scope is at its concurrency limit."""

    def get_load(self) -> float:
        """Active requests / limit (1.0 = as busy as allowed)."""

    def slot_event(self) -> Deferred[None]:
        """A Deferred that fires when a slot may be free."""

    def discard_slot_event(self, event: Deferred[None]) -> None:
        """Forget an unfired slot event."""

    def is_idle(self, now: float, max_idle: float) -> bool:
        """Whether the scope state can be evicted."""


def dont_track(meta: dict[str, Any]) -> bool:
    """Whether a request's outcome must not change throttling state:
    :reqmeta:`throttling_dont_track`, or AutoThrottle's
    ``autothrottle_dont_adjust_delay``, which the reference chapter maps to
    it (so spiders written for AutoThrottle keep their exclusions)."""
    return bool(
        meta.get(DONT_TRACK_META_KEY)
        or meta.get(AUTOTHROTTLE_DONT_ADJUST_DELAY_META_KEY)
    )


def iter_scopes(scopes: RequestScopes | BackoffData) -> Iterable[ScopeID]:
    """Iterate over the scope ids of *scopes* (``None`` → nothing)."""
    if scopes is None:
        return ()
    if isinstance(scopes, str):
        return (scopes,)
    if isinstance(scopes, dict):
        return scopes.keys()
    return scopes


def iter_scope_values(scopes: RequestScopes) -> Iterable[tuple[ScopeID, float | None]]:
    """Iterate over ``(scope, quota amount)`` pairs of *scopes*."""
    if scopes is None:
        return ()
    if isinstance(scopes, str):
        return ((scopes, None),)
    if isinstance(scopes, dict):
        return scopes.items()
    return ((scope, None) for scope in scopes)


def _add_bare_scope(collection: Any, scope: ScopeID, empty: Callable[[], Any]) -> Any:
    if collection is None:
        return scope
    if isinstance(collection, str):
        return collection if collection == scope else {collection, scope}
    if isinstance(collection, dict):
        if scope not in collection:
            collection[scope] = empty()
        return collection
    if isinstance(collection, Iterable):
        items = list(collection)
        if scope in items:
            return collection
        return {*items, scope}
    raise TypeError(f"Unsupported scopes value: {collection!r}")


def _to_scope_dict(collection: Any, default: Callable[[], Any]) -> dict[ScopeID, Any]:
    if isinstance(collection, dict):
        return collection
    if collection is None:
        return {}
    if isinstance(collection, str):
        return {collection: default()}
    if isinstance(collection, Iterable):
        return {scope: default() for scope in collection}
    raise TypeError(f"Unsupported scopes value: {collection!r}")


def add_scope(
    scopes: RequestScopes, scope: ScopeID, value: float | None = None, /
) -> RequestScopes:
    """Return *scopes* with *scope* added, with an optional quota amount.

    Without *value* the most compact form is kept (a string stays a string
    when *scope* is already it, a dict gains a ``None`` entry). With *value*
    the result is a dict mapping scopes to quota amounts (a dict argument is
    updated in place). Adding an amount to a scope that already has one
    raises :exc:`TypeError`.
    """
    if value is None:
        return _add_bare_scope(scopes, scope, lambda: None)  # type: ignore[no-any-return]
    result = _to_scope_dict(scopes, lambda: None)
    if result.get(scope) is not None:
        raise TypeError(
            f"Scope {scope!r} already has a quota amount: {result[scope]!r}"
        )
    result[scope] = value
    return result


def update_scope_backoff(
    backoff: BackoffData,
    scope: ScopeID,
    /,
    *,
    delay: float | None = None,
    consumed: float | None = None,
    remaining: float | None = None,
) -> BackoffData:
    """Return *backoff* updated for *scope*.

    Without keyword arguments *scope* is added as a bare scope (one backoff
    step). With ``delay`` (a hard minimum wait), ``consumed`` (actual minus
    estimated quota use) or ``remaining`` (server-reported remaining quota)
    the result is a dict with those keys set for *scope*.
    """
    if delay is None and consumed is None and remaining is None:
        return _add_bare_scope(backoff, scope, dict)  # type: ignore[no-any-return]
    result = _to_scope_dict(backoff, dict)
    for key, entry in list(result.items()):
        if entry is None:
            result[key] = {}
    data = result.setdefault(scope, {})
    if not isinstance(data, dict):
        raise TypeError(f"Backoff data for scope {scope!r} is not a dict: {data!r}")
    if delay is not None:
        data["delay"] = delay
    if consumed is not None:
        data["consumed"] = consumed
    if remaining is not None:
        data["remaining"] = remaining
    return result


_F = TypeVar("_F", bound=Callable[..., Awaitable[RequestScopes]])


def scope_cache(f: _F) -> _F:
    """Decorate an ``async def get_scopes(self, request)`` implementation.

    The resolved scopes are stored in the request meta (as plain, serialisable
    data), so that backoff is attributed to the scopes the request was sent
    under and a request restored from a disk queue keeps them. Every call
    resolves again, so a redirect to another host gets the new host's scopes.
    """

    @functools.wraps(f)
    async def wrapper(self: Any, request: Request) -> RequestScopes:
        from ._containment import validate_scopes

        scopes = validate_scopes(await f(self, request), request)
        request.meta[RESOLVED_SCOPES_META_KEY] = scopes
        return scopes

    return wrapper  # type: ignore[return-value]
