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

import heapq
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from scrapy import Request, signals
from scrapy.extensions.telnet import update_telnet_vars
from scrapy.utils.asyncio import create_looping_call

from ._explain import REASONS, Explanation, primary_reason, scope_wait_reasons
from ._scope import Scope
from ._settings import (
    ThrottlingSettings,
    report_invalid_setting,
    to_bool,
    to_float,
    to_int,
)
from ._timeline import ScopeTraffic, TimelineWriter
from ._types import RESOLVED_SCOPES_META_KEY, ScopeID, dont_track, iter_scopes

if TYPE_CHECKING:
    from collections.abc import Iterable

    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.settings import BaseSettings
    from typing_extensions import Self

__all__ = ["ObservabilitySettings", "ThrottlingDiagnostics"]

logger = logging.getLogger(__name__)

#: Seconds between two logs of scope states with THROTTLING_DEBUG.
LOG_INTERVAL = 10.0
#: Scopes named in each periodic log line, and per stats list at close.
LISTED_SCOPES = 10
#: Scopes named as the busiest in the progress line.
PROGRESS_SCOPES = 3
#: Configured scopes given per-scope stats at close, at most.
CONFIGURED_STATS_SCOPES = 50
#: A scope is "pinned" at a bound when at least this share of its latency
#: samples was taken there ...
PINNED_SHARE = 0.5
#: ... out of at least this many samples (fewer say nothing about a host).
PINNED_MIN_SAMPLES = 20


@dataclass(frozen=True)
class ObservabilitySettings:
    """The settings of this extension, read and validated once."""

    progress: bool
    progress_interval: float
    timeline_file: str | None
    timeline_interval: float
    timeline_scopes: int
    stats_scopes: int
    debug: bool

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ObservabilitySettings:
        throttling = ThrottlingSettings.from_crawler(crawler)
        try:
            return cls._read(crawler.settings, throttling)
        except ValueError as exc:
            report_invalid_setting(exc)
            raise

    @classmethod
    def _read(
        cls, settings: BaseSettings, throttling: ThrottlingSettings
    ) -> ObservabilitySettings:
        timeline = settings.get("THROTTLING_TIMELINE_FILE")
        if timeline is not None and not isinstance(timeline, (str, Path)):
            raise ValueError(
                f"Invalid THROTTLING_TIMELINE_FILE value {timeline!r}: expected a path"
            )
        return cls(
            progress=to_bool(
                settings.get("THROTTLING_PROGRESS", True), "THROTTLING_PROGRESS"
            ),
            progress_interval=to_float(
                settings.get("LOGSTATS_INTERVAL", 60.0), "LOGSTATS_INTERVAL"
            ),
            timeline_file=str(timeline) if timeline else None,
            timeline_interval=to_float(
                settings.get("THROTTLING_TIMELINE_INTERVAL", 1.0),
                "THROTTLING_TIMELINE_INTERVAL",
                minimum=0.01,
            ),
            timeline_scopes=to_int(
                settings.get("THROTTLING_TIMELINE_SCOPES", 10),
                "THROTTLING_TIMELINE_SCOPES",
                minimum=1,
            ),
            stats_scopes=to_int(
                settings.get("THROTTLING_STATS_SCOPES", 10), "THROTTLING_STATS_SCOPES"
            ),
            debug=throttling.debug,
        )


@dataclass
class Survey:
    """One pass over the live scopes: what the progress line and the gauges say."""

    scopes: int = 0
    in_flight: int = 0
    #: Scopes with requests waiting in the scheduler, by the reason they wait.
    held: dict[str, int] | None = None
    busiest: list[tuple[int, ScopeID, Any]] | None = None
    longest_hold: float = 0.0
    longest_hold_scope: ScopeID | None = None
    scheduler_requests: int | None = None


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
        self.settings = ObservabilitySettings.from_crawler(crawler)
        self.debug = self.settings.debug
        self.task: Any = None
        self.progress_task: Any = None
        self.timeline_task: Any = None
        self.traffic = ScopeTraffic(track_interval=bool(self.settings.timeline_file))
        self.timeline: TimelineWriter | None = None
        self._timeline_stream: IO[str] | None = None
        self._started = time.monotonic()
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
        return getattr(self.crawler, "throttler", None)

    def _managers(self) -> dict[ScopeID, Any]:
        managers: dict[ScopeID, Any] = getattr(self.throttler, "_scope_managers", {})
        return managers

    def _states(self) -> list[dict[str, Any]]:
        iter_states = getattr(self.throttler, "iter_scope_states", None)
        if iter_states is None:
            return []
        states: Iterable[dict[str, Any]] = iter_states()
        return list(states)

    def _state(self, scope: ScopeID, now: float) -> dict[str, Any] | None:
        manager = self._managers().get(scope)
        if manager is None:
            return None
        get_state = getattr(manager, "get_state", None)
        if get_state is None:
            return {"in_flight": getattr(manager, "active", 0)}
        return dict(get_state(now))

    def _clock(self) -> float:
        clock = getattr(self.throttler, "clock", None)
        return float(clock()) if clock is not None else time.monotonic()

    # -- signals -----------------------------------------------------------------

    def spider_opened(self) -> None:
        self._started = self._last_sample = time.monotonic()
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
            get_scopes = getattr(self.throttler, "get_request_scopes", None)
            if get_scopes is None:
                return
            scopes = get_scopes(request)
        self.traffic.record(iter_scopes(scopes), meta.get("download_latency"))

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
        managers = self._managers()
        survey = Survey(scopes=len(managers), held=dict.fromkeys(REASONS, 0))
        assert survey.held is not None
        in_flight = 0
        longest = 0.0
        longest_scope = None
        busy: list[tuple[int, ScopeID, Any]] = []
        # One pass of attribute reads: this runs over every live scope.
        for scope, manager in managers.items():
            active = getattr(manager, "active", 0)
            if active:
                in_flight += active
                busy.append((active, scope, manager))
            hold = _hold_until(manager)
            if hold is not None and hold - now > longest:
                longest, longest_scope = hold - now, scope
        survey.in_flight = in_flight
        survey.longest_hold = longest
        survey.longest_hold_scope = longest_scope
        survey.busiest = heapq.nlargest(PROGRESS_SCOPES, busy, key=lambda item: item[0])
        for scope in self._pending_scopes(managers):
            manager = managers.get(scope)
            if manager is None:
                continue
            reason = primary_reason(scope_wait_reasons(manager, now))
            if reason is not None:
                survey.held[reason] = survey.held.get(reason, 0) + 1
        survey.scheduler_requests = self._scheduler_requests()
        return survey

    def _pending_scopes(self, managers: dict[ScopeID, Any]) -> Iterable[ScopeID]:
        """Scopes with requests waiting in the throttling-aware queue (every
        live scope if the queue does not say)."""
        scheduler = self._scheduler()
        queue = getattr(scheduler, "mqs", None)
        entries = getattr(queue, "_entries", None)
        if not isinstance(entries, dict):
            return list(managers)
        pending: set[ScopeID] = set()
        for entry in entries.values():
            pending.update(getattr(entry, "scopes", ()))
        disk = getattr(scheduler, "dqs", None)
        for entry in getattr(disk, "_entries", {}).values():
            pending.update(getattr(entry, "scopes", ()))
        return pending

    def _scheduler(self) -> Any:
        try:
            engine = self.crawler.engine
        except RuntimeError:  # the crawl has not started
            return None
        slot = getattr(engine, "_slot", None) or getattr(engine, "slot", None)
        return getattr(slot, "scheduler", None)

    def _scheduler_requests(self) -> int | None:
        scheduler = self._scheduler()
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
        if stats is None:
            return
        stats.set_value("throttling/live/scopes", survey.scopes)
        stats.set_value("throttling/live/in_flight", survey.in_flight)
        held = survey.held or {}
        stats.set_value("throttling/live/held_scopes", sum(held.values()))
        for reason, count in held.items():
            stats.set_value(f"throttling/live/held/{reason}", count)
        stats.set_value("throttling/live/longest_hold", round(survey.longest_hold, 3))
        if survey.scheduler_requests is not None:
            stats.set_value(
                "throttling/live/scheduler_requests", survey.scheduler_requests
            )

    def format_progress(self, survey: Survey, now: float) -> str:
        """The progress line (one line, a few hundred characters at most)."""
        from ._decisions import last_backoff_cause

        parts = [f"Throttling: {survey.scopes} scope(s), {survey.in_flight} in flight"]
        held = {reason: n for reason, n in (survey.held or {}).items() if n}
        if held:
            parts.append(
                f"{sum(held.values())} holding requests back ("
                + ", ".join(f"{reason}={n}" for reason, n in held.items())
                + ")"
            )
        else:
            parts.append("none holding requests back")
        if survey.busiest:
            described = []
            for active, scope, manager in survey.busiest:
                limit = getattr(manager, "concurrency", None)
                text = f"{scope} ({active}/{'-' if limit is None else limit} in flight"
                histogram = self.traffic.latencies.get(scope)
                if histogram is not None:
                    (p50,) = histogram.percentiles(0.5)
                    if p50 is not None:
                        text += f", p50 {p50 * 1000:.0f} ms"
                described.append(text + ")")
            parts.append("busiest: " + ", ".join(described))
        if survey.longest_hold_scope is not None:
            manager = self._managers().get(survey.longest_hold_scope)
            cause = last_backoff_cause(manager) if manager is not None else None
            parts.append(
                f"longest server hold {survey.longest_hold:.1f}s on "
                f"{survey.longest_hold_scope}" + (f" ({cause})" if cause else "")
            )
        if survey.scheduler_requests is not None:
            parts.append(f"{survey.scheduler_requests} request(s) in the scheduler")
        return "; ".join(parts)

    # -- timeline -------------------------------------------------------------

    def sample_timeline(self) -> None:
        """Write one timeline sample (see :setting:`THROTTLING_TIMELINE_FILE`)."""
        if self.timeline is None:
            return
        wall = time.monotonic()
        interval = wall - self._last_sample
        self._last_sample = wall
        now = self._clock()
        managers = self._managers()

        def state(scope: ScopeID) -> dict[str, Any] | None:
            manager = managers.get(scope)
            if manager is None:
                return None  # evicted since
            found = self._state(scope, now) or {}
            found["waiting"] = primary_reason(scope_wait_reasons(manager, now))
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
        if self._managers():
            survey = self.report_progress() if self.settings.progress else None
            if survey is None:
                self.set_gauges(self.survey(self._clock()))
        self.set_scope_stats()
        self.set_latency_summary()

    def stats_scopes(self) -> list[ScopeID]:
        """The scopes given per-scope stats at close: the configured ones
        (up to 50) and the :setting:`THROTTLING_STATS_SCOPES` busiest."""
        config = getattr(self.throttler, "config", None)
        configured = list(config.scopes)[:CONFIGURED_STATS_SCOPES] if config else []
        managers = self._managers()
        chosen = [
            scope
            for scope in configured
            if scope in self.traffic.responses or scope in managers
        ]
        for scope in self.traffic.top(self.settings.stats_scopes):
            if scope not in chosen:
                chosen.append(scope)
        return chosen

    def set_scope_stats(self) -> None:
        """Final limit, latency percentiles and responses of a bounded set of
        scopes, as ``throttling/scopes/<scope>/<name>`` stats."""
        stats = self.crawler.stats
        if stats is None:
            return
        now = self._clock()
        for scope in self.stats_scopes():
            prefix = f"throttling/scopes/{scope}"
            stats.set_value(
                f"{prefix}/response_count", self.traffic.responses.get(scope, 0)
            )
            histogram = self.traffic.latencies.get(scope)
            if histogram is not None:
                for name, value in zip(
                    ("latency_p50", "latency_p90", "latency_p99"),
                    histogram.percentiles(0.5, 0.9, 0.99),
                    strict=True,
                ):
                    if value is not None:
                        stats.set_value(f"{prefix}/{name}", round(value, 4))
            state = self._state(scope, now)
            if state is not None and state.get("limit") is not None:
                stats.set_value(f"{prefix}/limit", state["limit"])

    def log_states(self) -> None:
        """Log the busiest scopes (most requests in flight, then highest limit)."""
        states = self._states()
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
        adaptive = [state for state in self._states() if "ceiling" in state]
        if not adaptive:
            return
        fixed = [s for s in adaptive if s["ceiling"] <= s["floor"]]
        adapting = [
            s
            for s in adaptive
            if s["ceiling"] > s["floor"]
            and s.get("latency_samples", 0) >= PINNED_MIN_SAMPLES
        ]
        stats.set_value("throttling/latency/scope_count", len(adaptive))
        stats.set_value("throttling/latency/fixed_count", len(fixed))
        for bound in ("floor", "ceiling"):
            share_key = f"at_{bound}_share"
            pinned = sorted(
                (s for s in adapting if s.get(share_key, 0.0) >= PINNED_SHARE),
                key=lambda state: state.get("latency_samples", 0),
                reverse=True,
            )
            stats.set_value(f"throttling/latency/pinned_{bound}_count", len(pinned))
            if pinned:
                names = [str(state["scope"]) for state in pinned[:LISTED_SCOPES]]
                stats.set_value(f"throttling/latency/pinned_{bound}_scopes", names)
                logger.info(
                    "Throttling: %d scope(s) spent most of the crawl with their "
                    "concurrency limit at its %s: %s%s",
                    len(pinned),
                    bound,
                    ", ".join(names),
                    ", ..." if len(pinned) > len(names) else "",
                )


def _hold_until(manager: Any) -> float | None:
    """When the server-given hold of a default scope manager ends (``None``
    for a custom one, which does not say)."""
    scope = getattr(manager, "scope", None)
    return scope.backoff.hold_until if isinstance(scope, Scope) else None


def format_state(state: dict[str, Any]) -> str:
    """One scope's state in a few words, for the log."""
    parts = [f"{state.get('scope')}: limit {state.get('limit')}"]
    if "ceiling" in state:
        parts[0] += (
            f" ({state['limit_value']:.1f} in [{state['floor']}, {state['ceiling']}])"
        )
        best = state.get("best_latency")
        last = state.get("last_latency")
        if best is not None:
            parts.append(f"best {best * 1000:.0f} ms")
        if last is not None:
            parts.append(f"last {last * 1000:.0f} ms")
    parts.append(f"in flight {state.get('in_flight')}")
    delay = state.get("delay")
    if delay:
        parts.append(f"delay {delay:.3g} s")
    if state.get("backoff_level"):
        parts.append(
            f"backoff level {state['backoff_level']} "
            f"(wait {state.get('backoff_wait', 0.0):.3g} s)"
        )
    return ", ".join(parts)
