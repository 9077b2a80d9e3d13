"""What the outcome of a download changes: its backoff and its latency.

:class:`DownloadOutcomes` is what the manager's ``process_response`` and
``process_exception`` do. It asks the manager's backoff hooks
(``get_response_backoff``, ``get_exception_backoff``: a subclass may
override them), applies what they return through the manager's
``apply_backoff``, records the pace of a 429 answer
(:class:`~scrapy_adaptive_throttle._backoff_triggers.BackoffTriggers`) and
hands the response's latency to its scopes
(:meth:`~scrapy_adaptive_throttle._scope_gate.ScopeGate.record_response`).
The default bodies of the two hooks are here too, over the rules of
``_algorithms/response_policy.py``.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING

from scrapy.utils.python import global_object_name

from ._decisions import responding
from ._meta_keys import REFUSED_META_KEY
from ._types import BackoffData, dont_track

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.http import Response

    from ._backoff_triggers import BackoffTriggers
    from ._manager import ThrottlingManager
    from ._scope_gate import ScopeGate

__all__ = ["DownloadOutcomes"]

#: The request whose response :meth:`DownloadOutcomes.process_response` is
#: handling, for responses that an overridden ``get_response_backoff`` builds
#: without one (the reference chapter's "X-Upstream-Status-Code" example).
_RESPONSE_REQUEST: ContextVar[Request | None] = ContextVar(
    "_RESPONSE_REQUEST", default=None
)


class DownloadOutcomes:
    """Responses and download exceptions, turned into scope state.

    :param manager: whose hooks decide the backoff (looked up at each call,
        so that a subclass's override, or one set on the instance, is used).
    """

    def __init__(
        self, manager: ThrottlingManager, backoff: BackoffTriggers, gate: ScopeGate
    ) -> None:
        self._manager = manager
        self._backoff = backoff
        self._gate = gate

    def response_backoff(self, response: Response) -> BackoffData:
        """The default ``get_response_backoff``: a response built without a
        request counts for the request being processed."""
        request = response.request
        if request is None:
            request = _RESPONSE_REQUEST.get()
        manager = self._manager
        return self._backoff.of_response(
            response,
            request,
            manager.queue_gate.sent_scope_values,
            lambda: manager.get_response_delay(response),
            lambda: manager.get_exhausted_quota_delay(response),
        )

    def exception_backoff(
        self, request: Request, exception: BaseException
    ) -> BackoffData:
        """The default ``get_exception_backoff``."""
        if dont_track(request.meta):
            return None
        scope_values = self._manager.queue_gate.sent_scope_values(request)
        return self._backoff.of_exception(scope_values, exception)

    async def process_response(self, response: Response) -> None:
        """Apply the backoff that *response* calls for, then feed its latency
        and status to its scopes."""
        request, status, now = response.request, response.status, self._gate.clock()
        token = _RESPONSE_REQUEST.set(request)
        try:
            backoff = await self._manager.get_response_backoff(response)
        finally:
            _RESPONSE_REQUEST.reset(token)
        if backoff is not None:
            # A retry answered as its request was before (a page the server
            # always refuses or fails) is not a new trigger: nothing new of
            # the host's load or rate, only the server's hold if it gives one
            # (the mark follows the request into its retries' copies).
            again = False
            if status >= 400 and request is not None:
                again = _marked(request)
            applied = _holds_only(backoff) if again else backoff
            if again:
                self._count_repeated()
            if applied is not None:
                # (names the header of a hold in the log)
                with responding(response, again=again):
                    self._manager.apply_backoff(
                        applied, now=now, cause=f"status/{status}"
                    )
            if status == 429:
                self._backoff.record_rate_limited(
                    backoff, now, self._gate.sent_at(request), again=again
                )
        self._gate.record_response(request, status, now)

    def _count_repeated(self) -> None:
        stats = self._manager.crawler.stats
        if stats is not None:
            stats.inc_value("throttling/backoff/repeated_count")

    async def process_exception(
        self, request: Request, exception: BaseException
    ) -> None:
        """Apply the backoff that a download exception calls for."""
        backoff = await self._manager.get_exception_backoff(request, exception)
        if backoff is not None:
            if _marked(request):
                # A retry failing as its request did before (a page that
                # always times out): not a new trigger, and no server hold.
                self._count_repeated()
                return
            self._manager.apply_backoff(
                backoff,
                now=self._gate.clock(),
                cause=f"exception/{global_object_name(type(exception))}",
            )


def _marked(request: Request) -> bool:
    """Whether *request* had a backoff answer or exception before (its
    retry: a copy with the same URL and meta), and mark it as having one.

    The mark is the URL, not a flag: a spider that passes ``response.meta``
    on to the requests it yields must not make their first answers repeats.
    """
    meta = request.meta
    again = meta.get(REFUSED_META_KEY) == request.url
    meta[REFUSED_META_KEY] = request.url
    return again


def _holds_only(backoff: BackoffData) -> BackoffData:
    """What of *backoff* still applies to a retry answered as its request
    was before: the server-given holds and quota reports of its scopes,
    not the exponential steps (``None``: nothing)."""
    if not isinstance(backoff, dict):
        return None
    kept = {
        scope: entry
        for scope, entry in backoff.items()
        if isinstance(entry, dict)
        and (
            entry.get("delay") is not None
            or entry.get("consumed") is not None
            or entry.get("remaining") is not None
        )
    }
    return kept or None
