"""Scopes of a request and backoff data: their types, and the helpers that
read and build them.

Names and signatures follow the throttling chapter of Scrapy's pull request
#6931, so code written for it works with this plugin by changing the import
path from ``scrapy.throttling`` to ``scrapy_adaptive_throttle``.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from ._meta_keys import RESOLVED_SCOPES_META_KEY

if TYPE_CHECKING:
    from scrapy import Request
    from typing_extensions import NotRequired
else:  # pragma: no cover - runtime fallbacks for TypedDict keys
    try:
        from typing import NotRequired
    except ImportError:
        from typing_extensions import NotRequired

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
