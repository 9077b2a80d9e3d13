"""What the diagnostics read of ``crawler.throttler``, and of the scheduler.

The diagnostics extension runs with any :setting:`THROTTLING_MANAGER`: the
default :class:`~scrapy_adaptive_throttle.ThrottlingManager`, a manager
written only to the protocol, Scrapy's own in native mode, or none yet (the
crawl has not built it). :class:`ThrottlerView` is the one place that tells
them apart; everything else reads scopes through the
:class:`~scrapy_adaptive_throttle._scope_adapter.ScopeAdapter` of each.

The default manager is recognised by its type and read through its typed
accessors. Any other manager is asked for the optional parts of the protocol
that the diagnostics use (``_scope_managers``, the attribute the protocol
lists for the pull request's manager, ``iter_scope_states``, ``clock``,
``config``, ``get_request_scopes``) by the ``read_*`` functions of
``_protocol_manager.py``; what it lacks reads as empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._crawler_throttler import current_throttler
from ._manager import ThrottlingManager
from ._protocol_manager import (
    read_clock,
    read_configured_scopes,
    read_request_scopes,
    read_scope_managers,
    read_scope_states,
)
from ._queue_schedule import engine_slot, pending_scopes
from ._scope_registry import AdaptedScopeManagers

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scrapy import Request
    from scrapy.crawler import Crawler

    from ._scope_adapter import ScopeAdapter
    from ._types import RequestScopes, ScopeID

__all__ = ["ThrottlerView"]


class ThrottlerView:
    """Read-only access to the throttler and the scheduler of *crawler*."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler

    @property
    def throttler(self) -> Any:
        """``crawler.throttler`` (looked up at each use: it is built lazily)."""
        return current_throttler(self.crawler)

    def scopes(self) -> Mapping[ScopeID, ScopeAdapter]:
        """The live scopes, each behind its adapter (empty when the manager
        does not say which it has)."""
        throttler = self.throttler
        if isinstance(throttler, ThrottlingManager):
            return throttler.scope_adapters()
        managers = read_scope_managers(throttler)
        return {} if managers is None else AdaptedScopeManagers(managers)

    def states(self) -> list[dict[str, Any]]:
        """The state snapshot of every live scope (the manager's
        ``iter_scope_states``; empty without it)."""
        throttler = self.throttler
        if isinstance(throttler, ThrottlingManager):
            return list(throttler.iter_scope_states())
        return read_scope_states(throttler)

    def clock(self) -> Callable[[], float] | None:
        """The manager's monotonic clock, ``None`` if it has none."""
        throttler = self.throttler
        if isinstance(throttler, ThrottlingManager):
            return throttler.clock
        return read_clock(throttler)

    def configured_scopes(self) -> Iterable[ScopeID]:
        """The :setting:`THROTTLING_SCOPES` keys, as the manager read them."""
        throttler = self.throttler
        if isinstance(throttler, ThrottlingManager):
            return throttler.config.scopes
        return read_configured_scopes(throttler)

    def request_scopes(self, request: Request) -> RequestScopes | None:
        """The scopes of *request*, ``None`` if the manager cannot say
        synchronously."""
        throttler = self.throttler
        if isinstance(throttler, ThrottlingManager):
            return throttler.get_request_scopes(request)
        return read_request_scopes(throttler, request)

    # -- the scheduler --------------------------------------------------------

    def scheduler(self) -> Any:
        """The running scheduler, ``None`` before the crawl starts."""
        try:
            engine = self.crawler.engine
        except RuntimeError:  # the crawl has not started
            return None
        # Scrapy's engine slot, not user code: None while no spider is open.
        return getattr(engine_slot(engine), "scheduler", None)

    def pending_scopes(self) -> set[ScopeID] | None:
        """The scopes with requests waiting in the scheduler, ``None`` when
        its queue is not the add-on's (which does not say)."""
        scheduler = self.scheduler()
        # Scrapy's scheduler: memory and disk queues (``dqs`` is None
        # without JOBDIR; a custom scheduler may have neither).
        pending = pending_scopes(getattr(scheduler, "mqs", None))
        if pending is None:
            return None
        pending.update(pending_scopes(getattr(scheduler, "dqs", None)) or ())
        return pending
