"""Containment of errors in user code and user data.

Custom managers and scope managers, ``throttling_scopes`` meta and the like
enter the throttling system at a few places (the scheduler queue's push and
pop, the gate, the release of a download, the response and exception
hooks). An error there must affect only the request concerned:

- it is reported once, at ERROR, with the request's URL and the component
  that failed (the traceback the first time a component fails, one line
  after that, so a broken component does not flood the log);
- the request either goes on with the scope of its host (when its scopes
  cannot be resolved: sending it throttled as its host is the safe choice)
  or ends in its errback with :class:`ThrottlingComponentError` (when a
  scope manager fails: it cannot be throttled, so it is not sent);
- no reservation is left behind, and the crawl goes on.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import IgnoreRequest
from scrapy.utils.httpobj import urlparse_cached

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.statscollectors import StatsCollector

    from ._types import RequestScopes

logger = logging.getLogger(__name__)

#: Stats key counting the requests a throttling component failed for.
ERROR_STAT = "throttling/component_error_count"


class ThrottlingComponentError(IgnoreRequest):
    """A throttling component failed for this request, which was not sent.

    The request's errback receives it; ``__cause__`` is the original error.
    It is an :exc:`~scrapy.exceptions.IgnoreRequest`, so Scrapy does not log
    it a second time (the plugin already reported it at ERROR level) and
    RetryMiddleware does not retry it.
    """

    def __init__(self, component: str, request: Request, error: BaseException):
        self.component = component
        super().__init__(
            f"{component} failed for {request.url}: {type(error).__name__}: {error}"
        )


class ScopeManagerError(Exception):
    """A scope manager method raised; names the scope and the method."""

    def __init__(self, scope_id: str, manager: Any, method: str, error: Exception):
        self.component = (
            f"scope manager {type(manager).__module__}.{type(manager).__qualname__}"
            f".{method}() of scope {scope_id!r}"
        )
        #: The exception the scope manager raised.
        self.error = error
        super().__init__(f"{self.component}: {type(error).__name__}: {error}")


_reported_components: set[str] = set()
#: Requests popped from the queue that must fail instead of being downloaded.
_failed: weakref.WeakKeyDictionary[Request, ThrottlingComponentError] = (
    weakref.WeakKeyDictionary()
)


def component_of(error: BaseException, default: str) -> str:
    """The component named by *error* (a :class:`ScopeManagerError`), else
    *default*."""
    return error.component if isinstance(error, ScopeManagerError) else default


def report(
    request: Request,
    component: str,
    error: BaseException,
    consequence: str,
    stats: StatsCollector | None = None,
) -> None:
    """Log, once, that *component* failed for *request*, and what follows."""
    first = component not in _reported_components
    _reported_components.add(component)
    logger.error(
        "%s failed for %s (%s: %s); %s",
        component,
        request.url,
        type(error).__name__,
        error,
        consequence,
        exc_info=error if first else None,
    )
    if stats is not None:
        stats.inc_value(ERROR_STAT)


def fail_request(request: Request, component: str, error: BaseException) -> None:
    """Make the download of *request* end in its errback with a
    :class:`ThrottlingComponentError` (see :func:`take_failure`)."""
    failure = ThrottlingComponentError(component, request, error)
    failure.__cause__ = error
    _failed[request] = failure


def take_failure(request: Request) -> ThrottlingComponentError | None:
    """The error to raise instead of downloading *request*, if any."""
    return _failed.pop(request, None)


def host_scope(request: Request) -> str:
    """The default scope of *request*: its URL's ``host[:port]``."""
    return urlparse_cached(request).netloc.rpartition("@")[2].lower()


def validate_scopes(scopes: Any, request: Request) -> RequestScopes:
    """Return *scopes* in their stored form (``None``, a scope id, a list of
    scope ids, or a dict of scope id to quota amount), or raise
    :exc:`ValueError` naming the request and the value."""
    if scopes is None or isinstance(scopes, str):
        return scopes
    if isinstance(scopes, dict):
        for scope, amount in scopes.items():
            if not isinstance(scope, str) or not (
                amount is None
                or (isinstance(amount, (int, float)) and not isinstance(amount, bool))
            ):
                raise ValueError(_invalid(scopes, request))
        return scopes
    if isinstance(scopes, Iterable) and not isinstance(scopes, (bytes, bytearray)):
        items = list(scopes)
        if all(isinstance(scope, str) for scope in items):
            return items
    raise ValueError(_invalid(scopes, request))


def _invalid(scopes: Any, request: Request) -> str:
    return (
        f"invalid throttling scopes {scopes!r} for {request.url}: expected a "
        "scope id (str), an iterable of scope ids, or a dict of scope id to "
        "quota amount"
    )
