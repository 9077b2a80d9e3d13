"""Custom throttling components for the containment tests, importable by
dotted path (so that crawls in a subprocess can load them too)."""

from __future__ import annotations

import itertools
from typing import Any

from scrapy import Request
from scrapy.http import Response

from scrapy_adaptive_throttle import ThrottlingManager, ThrottlingScopeManager


class CanSendRaises(ThrottlingScopeManager):
    """A scope manager whose time gate always fails."""

    def can_send(self, now: float | None = None, amount: float | None = None) -> float:
        raise RuntimeError("can_send is broken")


class RecordSentRaisesEveryOther(ThrottlingScopeManager):
    """Fails to record every other send, after the queue popped the request."""

    _calls = itertools.count()

    def record_sent(
        self, now: float | None = None, amount: float | None = None
    ) -> None:
        if next(self._calls) % 2:
            raise RuntimeError("record_sent is broken")
        super().record_sent(now, amount)


class RecordDoneRaises(ThrottlingScopeManager):
    """Counts the end of a download, then fails."""

    def record_done(self, now: float | None = None) -> None:
        super().record_done(now)
        raise RuntimeError("record_done is broken")


class InitRaises(ThrottlingScopeManager):
    """Cannot even be built."""

    def __init__(self, crawler: Any, config: dict[str, Any]) -> None:
        raise RuntimeError("cannot build this scope manager")


class ScopesRaiseForMarkedURLs(ThrottlingManager):
    """A custom manager whose scope resolution fails for URLs with ``boom``."""

    def get_request_scopes(self, request: Request) -> Any:
        if "boom" in request.url:
            raise RuntimeError("no scopes for this one")
        return super().get_request_scopes(request)


class ResponseBackoffRaises(ThrottlingManager):
    """A custom manager whose backoff hook fails on every response."""

    async def get_response_backoff(self, response: Response) -> Any:
        raise RuntimeError("get_response_backoff is broken")


class ScopePerPage(ThrottlingManager):
    """Well-behaved: every page is a scope of its own, besides its host's."""

    def get_request_scopes(self, request: Request) -> Any:
        host = super().get_request_scopes(request)
        return [host, "page:" + request.url.split("/follow/", 1)[-1]]


class ExceptionBackoffRaises(ThrottlingManager):
    """A custom manager whose backoff hook fails on every download error."""

    async def get_exception_backoff(
        self, request: Request, exception: BaseException
    ) -> Any:
        raise RuntimeError("get_exception_backoff is broken")


class ReleaseRaises(ThrottlingManager):
    """A custom manager that frees the slots of a request, then fails."""

    def release(self, request: Request) -> None:
        super().release(request)
        raise RuntimeError("release is broken")
