"""What the throttler decides, while the crawl runs and when it ends.

The guide "Adapting Crawl Rate to Host Latency" ends on the diagnostic hook:
a host whose limit sits at the minimum for long periods is overloaded or has
a baseline that no longer fits, one pinned at the maximum has capacity you
chose not to use, and neither shows in aggregate pages per second. So this
extension, enabled by the add-on, shows per scope what the aggregate hides:

* a progress line at INFO every :setting:`LOGSTATS_INTERVAL`, next to
  Scrapy's own (:setting:`THROTTLING_PROGRESS`), and the same figures as
  gauge stats (``throttling/live/...``) that ``PeriodicLog``, Spidermon or
  Scrapy Cloud read mid-crawl;
* per-scope stats at close: the final limit and latency percentiles of the
  configured scopes and of the busiest ones;
* the timeline file (:setting:`THROTTLING_TIMELINE_FILE`);
* ``explain(url_or_scope)`` in the telnet console.

Every figure is bounded: a pass over the live scopes per
:setting:`LOGSTATS_INTERVAL` (attribute reads, no copies), and work
proportional to the scopes written per timeline sample. ``bench/observe_cost.py``
measures the cost with 100 000 scopes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from scrapy import Request, signals
from scrapy.extensions.telnet import update_telnet_vars
from scrapy.utils.asyncio import create_looping_call

from ._clock import MONOTONIC_CLOCK
from ._explain import Explanation, primary_reason, scope_wait_reasons
from ._meta_keys import DOWNLOAD_LATENCY_META_KEY, RESOLVED_SCOPES_META_KEY
from ._observability_settings import ObservabilitySettings
from ._progress import Survey, format_progress, set_gauges, survey
from ._scope_stats import (
    LISTED_SCOPES,
    choose_stats_scopes,
    format_state,
    set_latency_summary,
    set_scope_stats,
)
from ._throttler_view import ThrottlerView
from ._timeline import ScopeTraffic, TimelineWriter
from ._types import ScopeID, dont_track, iter_scopes

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

    from ._scope_adapter import ScopeAdapter

__all__ = [
    "ObservabilitySettings",
    "Survey",
    "ThrottlingDiagnostics",
    "format_state",
]

logger = logging.getLogger(__name__)

#: Seconds between two logs of scope states with THROTTLING_DEBUG.
LOG_INTERVAL = 10.0


class ThrottlingDiagnostics:
    """Progress, gauges, per-scope stats, the timeline and the telnet shortcut.

    Enabled by the add-on; see :ref:`observability`. At spider close it also
    sets, for scopes with an adaptive limit
    (:class:`~scrapy_adaptive_throttle.LatencyScopeManager`), the
    ``throttling/latency/...`` summary stats (scopes pinned at their floor
    or ceiling, scopes with nothing to adapt).
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        #: The throttler and scheduler, read through one view.
        self.view = ThrottlerView(crawler)
        self.settings = ObservabilitySettings.from_crawler(crawler)
        self.debug = self.settings.debug
        self.task: Any = None
        self.progress_task: Any = None
        self.timeline_task: Any = None
        self.traffic = ScopeTraffic(track_interval=bool(self.settings.timeline_file))
        self.timeline: TimelineWriter | None = None
        self._timeline_stream: IO[str] | None = None
        #: The clock of the timeline's sample times (injected for tests).
        self.wall_clock: Callable[[], float] = MONOTONIC_CLOCK
        self._started = self.wall_clock()
        self._last_sample = self._started
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(
            self.response_downloaded, signal=signals.response_downloaded
        )
        # Fired by Scrapy's TelnetConsole (the signal lives in its module).
        crawler.signals.connect(self.update_telnet_vars, signal=update_telnet_vars)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    # -- access to the throttler -----------------------------------------------

    @property
    def throttler(self) -> Any:
        return self.view.throttler

    def _scopes(self) -> Mapping[ScopeID, ScopeAdapter]:
        return self.view.scopes()

    def _state(self, scope: ScopeID, now: float) -> dict[str, Any] | None:
        adapter = self._scopes().get(scope)
        if adapter is None:
            return None
        if not adapter.reports_state:
            return {"in_flight": adapter.in_flight}
        return adapter.get_state(now)

    def _clock(self) -> float:
        clock = self.view.clock()
        return float(clock()) if clock is not None else self.wall_clock()

    # -- signals -----------------------------------------------------------------

    def spider_opened(self) -> None:
        self._started = self._last_sample = self.wall_clock()
        if self.debug:
            self.task = create_looping_call(self.log_states)
            self.task.start(LOG_INTERVAL, now=False)
        if self.settings.progress_interval > 0:
            self.progress_task = create_looping_call(self.report_progress)
            self.progress_task.start(self.settings.progress_interval, now=False)
        if self.settings.timeline_file:
            path = Path(self.settings.timeline_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._timeline_stream = path.open("w", encoding="utf-8")
            self.timeline = TimelineWriter(
                self._timeline_stream, self.settings.timeline_scopes
            )
            self.timeline_task = create_looping_call(self.sample_timeline)
            self.timeline_task.start(self.settings.timeline_interval, now=False)

    def response_downloaded(self, response: Response, request: Request) -> None:
        """Count the response and its latency for each scope of its request."""
        meta = request.meta
        if dont_track(meta):
            return
        scopes = meta.get(RESOLVED_SCOPES_META_KEY)
        if scopes is None:
            scopes = self.view.request_scopes(request)
            if scopes is None:
                return
        self.traffic.record(iter_scopes(scopes), meta.get(DOWNLOAD_LATENCY_META_KEY))

    def update_telnet_vars(self, telnet_vars: dict[str, Any]) -> None:
        """Add ``explain`` (and ``throttler``) to the telnet console."""
        telnet_vars["throttler"] = self.throttler
        telnet_vars["explain"] = self.explain

    def explain(self, url_or_scope: Request | str) -> Explanation:
        """The telnet shortcut: why a request, a URL or a scope waits.

        A string with ``://`` is a URL (explained as a new request to it);
        any other string is a scope id.
        """
        subject: Request | str = url_or_scope
        if isinstance(subject, str) and "://" in subject:
            subject = Request(subject)
        explanation: Explanation = self.throttler.explain(subject)
        return explanation

    # -- progress and gauges --------------------------------------------------

    def survey(self, now: float) -> Survey:
        """One pass over the live scopes (bounded work per scope)."""
        scopes = self._scopes()
        result = survey(scopes, self._pending_scopes(scopes), now)
        result.scheduler_requests = self._scheduler_requests()
        return result

    def _pending_scopes(
        self, scopes: Mapping[ScopeID, ScopeAdapter]
    ) -> Iterable[ScopeID]:
        """Scopes with requests waiting in the throttling-aware queue (every
        live scope if the queue does not say)."""
        pending = self.view.pending_scopes()
        return list(scopes) if pending is None else pending

    def _scheduler_requests(self) -> int | None:
        scheduler = self.view.scheduler()
        try:
            return len(scheduler) if scheduler is not None else None
        except TypeError:
            return None

    def report_progress(self) -> Survey:
        """Set the gauge stats and (with :setting:`THROTTLING_PROGRESS`) log
        the progress line."""
        now = self._clock()
        survey = self.survey(now)
        self.set_gauges(survey)
        if self.settings.progress and survey.scopes:
            logger.info("%s", self.format_progress(survey, now))
        return survey

    def set_gauges(self, survey: Survey) -> None:
        stats = self.crawler.stats
        if stats is not None:
            set_gauges(stats, survey)

    def format_progress(self, survey: Survey, now: float) -> str:
        """The progress line (one line, a few hundred characters at most)."""
        return format_progress(survey, self.traffic, self._scopes())

    # -- timeline -------------------------------------------------------------

    def sample_timeline(self) -> None:
        """Write one timeline sample (see :setting:`THROTTLING_TIMELINE_FILE`)."""
        if self.timeline is None:
            return
        wall = self.wall_clock()
        interval = wall - self._last_sample
        self._last_sample = wall
        now = self._clock()
        scopes = self._scopes()

        def state(scope: ScopeID) -> dict[str, Any] | None:
            adapter = scopes.get(scope)
            if adapter is None:
                return None  # evicted since
            found = self._state(scope, now) or {}
            found["waiting"] = primary_reason(scope_wait_reasons(adapter, now))
            return found

        self.timeline.sample(wall - self._started, interval, self.traffic, state)

    # -- close ------------------------------------------------------------------

    def spider_closed(self) -> None:
        for task in (self.task, self.progress_task, self.timeline_task):
            if task is not None and task.running:
                task.stop()
        if self.timeline is not None:
            self.sample_timeline()
        if self._timeline_stream is not None:
            self._timeline_stream.close()
            self._timeline_stream = None
        if self._scopes():
            survey = self.report_progress() if self.settings.progress else None
            if survey is None:
                self.set_gauges(self.survey(self._clock()))
        self.set_scope_stats()
        self.set_latency_summary()

    def stats_scopes(self) -> list[ScopeID]:
        """The scopes given per-scope stats at close: the configured ones
        (up to 50) and the :setting:`THROTTLING_STATS_SCOPES` busiest."""
        return choose_stats_scopes(
            self.view.configured_scopes(),
            self.traffic,
            self._scopes(),
            self.settings.stats_scopes,
        )

    def set_scope_stats(self) -> None:
        """Final limit, latency percentiles and responses of a bounded set of
        scopes, as ``throttling/scopes/<scope>/<name>`` stats."""
        stats = self.crawler.stats
        if stats is None:
            return
        now = self._clock()

        def limit_of(scope: ScopeID) -> int | None:
            state = self._state(scope, now)
            return state.get("limit") if state is not None else None

        set_scope_stats(stats, self.stats_scopes(), self.traffic, limit_of)

    def log_states(self) -> None:
        """Log the busiest scopes (most requests in flight, then highest limit)."""
        states = self.view.states()
        if not states:
            return
        busiest = sorted(
            states,
            key=lambda state: (state.get("in_flight") or 0, state.get("limit") or 0),
            reverse=True,
        )[:LISTED_SCOPES]
        logger.info(
            "Throttling: %d live scope(s); busiest: %s",
            len(states),
            "; ".join(format_state(state) for state in busiest),
        )

    def set_latency_summary(self) -> None:
        stats = self.crawler.stats
        if stats is None:
            return
        now = self._clock()
        adaptive = []
        for scope, adapter in list(self._scopes().items()):
            scope_state = adapter.scope_state(now)
            if scope_state is not None and scope_state.adaptive is not None:
                adaptive.append((scope, scope_state.adaptive))
        set_latency_summary(stats, adaptive)
