"""The live scopes: one scope manager per scope id, created on first use.

The registry builds each scope manager from the scope's settings (the class
of its :setting:`THROTTLING_SCOPES` entry, of its kind, or
:setting:`THROTTLING_SCOPE_MANAGER`), wraps it once in a
:class:`~scrapy_adaptive_throttle._scope_adapter.ScopeAdapter`, and bounds
how many it keeps: :setting:`THROTTLING_SCOPE_LIMIT` (least recently used
idle scopes go first) and :setting:`THROTTLING_SCOPE_MAX_IDLE`.
"""

from __future__ import annotations

import difflib
import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator, KeysView, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from scrapy import signals

from ._containment import ScopeManagerError
from ._scope_adapter import ScopeAdapter, build_scope_manager
from ._types import ScopeID, ThrottlingScopeManagerProtocol

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from ._settings import ThrottlingSettings

__all__ = ["AdaptedScopeManagers", "ScopeManagers", "ScopeRegistry"]

logger = logging.getLogger(__name__)

#: How many scopes one creation looks at to find an idle one to evict: busy
#: scopes are never evicted, and a bound keeps creation O(1).
_EVICTION_LOOKS = 16


class ScopeRegistry:
    """The scope adapters of the live scopes, least recently used first.

    :param on_create: called with each new adapter, after it is registered
        (the manager applies a remembered robots.txt Crawl-delay there).
    :param on_slots_changed: called with a scope id for each slot that a
        raised limit of a built-in scope manager adds (the manager's
        ``notify_slots_changed``, which wakes the scheduler queue).
    """

    def __init__(
        self,
        crawler: Crawler,
        config: ThrottlingSettings,
        clock: Callable[[], float],
        on_create: Callable[[ScopeAdapter], None],
        on_slots_changed: Callable[[ScopeID], None],
    ) -> None:
        self.crawler = crawler
        self.config = config
        self.clock = clock
        self._on_create = on_create
        self._on_slots_changed = on_slots_changed
        self.adapters: OrderedDict[ScopeID, ScopeAdapter] = OrderedDict()
        #: THROTTLING_SCOPES keys that got a scope manager, i.e. matched a
        #: scope of some request.
        self.matched_configured: set[ScopeID] = set()
        # Set on the first look, so that the first eviction pass comes one
        # half max-idle later: a scope configured before its first request
        # (e.g. with set_scope_delay) must not be dropped as never used.
        self._last_eviction: float | None = None
        if config.scopes_set:
            crawler.signals.connect(self.warn_unmatched, signal=signals.spider_closed)

    @property
    def live(self) -> Mapping[ScopeID, ScopeAdapter]:
        """A read-only, live view of the adapters, least recently used
        first; reading it creates, refreshes and evicts nothing."""
        return MappingProxyType(self.adapters)

    def get(self, scope_id: ScopeID) -> ScopeAdapter:
        """The adapter of *scope_id*, created if needed."""
        adapters = self.adapters
        adapter = adapters.get(scope_id)
        if adapter is not None:
            adapters.move_to_end(scope_id)
            return adapter
        return self._create(scope_id)

    def _create(self, scope_id: ScopeID) -> ScopeAdapter:
        scope_config = self.config.scope(scope_id)
        from ._scope_manager import ThrottlingScopeManager

        cls = scope_config.manager or self.config.scope_manager_cls
        if scope_config.kind == "slot" and scope_config.manager is None:
            # Another plugin's slot with no entry of its own: it limits
            # nothing (the host scope does), so there is nothing to adapt.
            cls = ThrottlingScopeManager
        config = dict(scope_config.raw)
        config["id"] = scope_id
        try:
            manager = build_scope_manager(cls, self.crawler, config)
        except Exception as exc:
            raise ScopeManagerError(scope_id, cls, "from_crawler", exc) from exc
        if isinstance(manager, ThrottlingScopeManager):
            manager.slots_listener = self._on_slots_changed
        adapter = ScopeAdapter(scope_id, manager)
        self.adapters[scope_id] = adapter
        if scope_id in self.config.scopes:
            self.matched_configured.add(scope_id)
        self._on_create(adapter)
        self._enforce_limit(scope_id)
        return adapter

    def _enforce_limit(self, keep: ScopeID) -> None:
        limit = self.config.scope_limit
        adapters = self.adapters
        if not limit or len(adapters) <= limit:
            return
        now = self.clock()
        # Busy scopes move to the back, so that the next look starts with
        # idle ones.
        for _ in range(min(len(adapters), _EVICTION_LOOKS)):
            if len(adapters) <= limit:
                return
            scope_id, adapter = adapters.popitem(last=False)
            if scope_id != keep and adapter.is_idle(now, 0.0):
                continue
            adapters[scope_id] = adapter

    def maybe_evict(self, now: float) -> None:
        """Drop the scopes idle for :setting:`THROTTLING_SCOPE_MAX_IDLE`, at
        most once every half of it."""
        max_idle = self.config.scope_max_idle
        if max_idle <= 0:
            return
        if self._last_eviction is None:
            self._last_eviction = now
            return
        if now - self._last_eviction < max_idle / 2:
            return
        self._last_eviction = now
        idle = [
            scope_id
            for scope_id, adapter in self.adapters.items()
            if adapter.is_idle(now, max_idle)
        ]
        for scope_id in idle:
            del self.adapters[scope_id]

    def states(self, now: float) -> Iterator[dict[str, Any]]:
        """The ``get_state`` snapshot of each live scope (from a copy of the
        registry: reading a state may create or evict scopes)."""
        for adapter in list(self.adapters.values()):
            yield adapter.get_state(now)

    def warn_unmatched(self) -> None:
        """Warn about the :setting:`THROTTLING_SCOPES` keys that matched no
        request of the crawl, with the closest live scope as a hint."""
        # A key that never matches (a bare host for a host with a port, a
        # URL instead of host[:port]) is otherwise a silent no-op.
        matched = self.matched_configured
        unmatched = [scope for scope in self.config.scopes if scope not in matched]
        if not unmatched:
            return
        # The most recently used scopes: enough for a hint, and bounded in a
        # broad crawl.
        live = [
            scope
            for scope in itertools.islice(reversed(self.adapters), 10_000)
            if isinstance(scope, str)
        ]
        hints = []
        for scope in unmatched:
            closest = difflib.get_close_matches(scope, live, n=1, cutoff=0.5)
            hint = f" (closest scope of the crawl: {closest[0]!r})" if closest else ""
            hints.append(f"{scope!r}{hint}")
        logger.warning(
            "THROTTLING_SCOPES entries that matched no request of this crawl: %s. "
            "A key must be a scope id exactly as the requests get it: host[:port] "
            "of the URL by default (see 'scrapy throttling URL').",
            "; ".join(hints),
        )


class ScopeManagers(Mapping[ScopeID, ThrottlingScopeManagerProtocol]):
    """A read-only, live view of the registry: scope id -> scope manager."""

    __slots__ = ("_adapters",)

    def __init__(self, adapters: OrderedDict[ScopeID, ScopeAdapter]) -> None:
        self._adapters = adapters

    def __getitem__(self, scope_id: ScopeID) -> ThrottlingScopeManagerProtocol:
        return self._adapters[scope_id].manager

    def __iter__(self) -> Iterator[ScopeID]:
        return iter(self._adapters)

    def __reversed__(self) -> Iterator[ScopeID]:
        return reversed(self._adapters)

    def __len__(self) -> int:
        return len(self._adapters)

    def __contains__(self, scope_id: object) -> bool:
        return scope_id in self._adapters

    def keys(self) -> KeysView[ScopeID]:
        return self._adapters.keys()


class AdaptedScopeManagers(Mapping[ScopeID, ScopeAdapter]):
    """Scope managers held by another manager (scope id -> scope manager),
    each read through a :class:`ScopeAdapter` made when it is looked up.

    For the scope managers of a manager that is not a
    :class:`~scrapy_adaptive_throttle.ThrottlingManager` (Scrapy's own, in
    native mode), so that diagnostics read every scope the same way.
    """

    __slots__ = ("_managers",)

    def __init__(self, managers: Mapping[ScopeID, ThrottlingScopeManagerProtocol]):
        self._managers = managers

    def __getitem__(self, scope_id: ScopeID) -> ScopeAdapter:
        return ScopeAdapter(scope_id, self._managers[scope_id])

    def __iter__(self) -> Iterator[ScopeID]:
        return iter(self._managers)

    def __len__(self) -> int:
        return len(self._managers)

    def __contains__(self, scope_id: object) -> bool:
        return scope_id in self._managers
