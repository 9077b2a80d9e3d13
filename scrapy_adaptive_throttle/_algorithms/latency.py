"""A concurrency limit that adapts to a host's latency (AIMD on latency).

Rule, from the guide "Adapting Crawl Rate to Host Latency"
(``shared/reference/000_3452b3576d47e7cc.txt``, sections 2 to 5), made
robust to hosts whose service time is noisy (issue 9):

* A host's latency at low load is its service time; once requests queue at the
  host, latency rises before errors appear. So compare latencies with a
  **baseline, the host's unloaded median latency**: an answer within
  ``baseline * tolerance`` raises the limit by ``1 / limit`` (about +1 per
  round of requests, TCP's additive increase); a round of answers whose
  median is slower multiplies it by 0.9.
* **The baseline is a median, not a minimum**, of the answers of the
  lowest in-flight levels, measured by ``latency_baseline.py`` (which states
  its rules: pooling, expiry, stale samples) and kept unloaded by probe rounds
  (``latency_probe.py``, BBR's ProbeRTT).
* **A round needs enough answers to beat the noise**: the answers to
  requests sent after the last decision, at least ``limit`` of them and more
  on a noisy host; its majority slow lowers the limit, its majority within
  the tolerance ends it without a decrease (``latency_round.py`` states the
  rules and their figures).
* **The limit only grows while it is used** (in-flight requests close to the
  limit): an idle scope must not inflate a limit it never tested. And it only
  grows on answers to requests sent since the whole-number limit last went
  up: older answers tested the lower limit (on host B, 2 x 50 ms, counting
  them put half the crawl at a limit of 4, past the tolerance).
* **Slow start** (TCP's): until a queue forms, each fast answer adds a whole
  request, doubling the limit every round (``latency_slow_start.py``).
* **Growth slows down near the tolerance, and near the level whose round
  was last slow** (``latency_growth.py``).
* **A host that changed speed** becomes the baseline: a slowdown the
  limit cannot fix (three mostly slow rounds that lowering the limit did
  not make faster, confirmed by a probe at half the limit), or a host that
  sped up (``latency_speed.py``).
* **A resolution**: an answer is only slow when it is also ``resolution``
  seconds above the baseline. The crawler measures latency on its own event
  loop, which adds milliseconds of noise that grow with its load; for a host
  answering in 1.5 ms, the tolerance of 1.5 is 0.75 ms, far inside that
  noise, and the limit stayed at 3 (0.7-0.85 of the throughput of a fixed
  limit of 16, with no queue at the host at all).
* **An overload halves the limit once per round**: at most once per baseline
  latency, so the burst of 503s shed from one round counts once; and it
  starts a new round (and ends a probe).
* **An error page** (a status that is not a backoff code, e.g. 404 or 500)
  never raises the limit nor makes the baseline, because error pages are
  often much faster than real pages; a slow one still counts as slow.
* Zero, negative and non-finite latencies are ignored: a zero would become a
  baseline that every later answer exceeds.

Known limits (``tests/algorithms/test_latency_traces.py``, strict xfails):
the baseline is the median of about 32 unloaded answers, whose standard error
at sigma 0.6-1.0 is 13-22%; when it comes out 15-25% low, noise reads as
slow and the limit stays below what the host allows (it still grows, slowly).
After a slow first quarter second, the probe's sign test misses some
lognormal seeds (baseline up to 1.43x); on a bimodal host a request queued
behind a miss waits far past the tolerance band, so the settled median is
about 1.55x at a small turnaround and, measured with Scrapy, the limit stays
below a fixed 8 (0.79 of capacity against 0.96).
"""

from __future__ import annotations

import math

from .latency_baseline import lower_median
from .latency_growth import grown_limit, growth_step
from .latency_round import lowered_limit, round_size_for_noise
from .latency_state import LatencyState

__all__ = ["LatencyLimit"]

#: Probe answers that decide a suspected slowdown (fewer: the probe ran out
#: of time, and no new baseline is taken).
_CHECK_ANSWERS = 4


class LatencyLimit(LatencyState):
    """The adaptive concurrency limit of one scope.

    Times are monotonic seconds passed in by the caller.

    :param initial: the starting limit, clamped into ``[minimum, maximum]``.
    :param minimum: the floor of the limit (at least 1).
    :param maximum: the ceiling of the limit (raised to *minimum* if lower).
    :param tolerance: how much the median latency may rise above the host's
        unloaded median; a politeness setting (1.5 = at most ~50% added
        latency).
    :param window: seconds after which a latency sample starts to expire
        (samples older than two windows no longer make the baseline).
    :param resolution: the smallest added latency (seconds) that counts as
        slow, whatever the tolerance: differences below the noise of the
        crawler's own measurements say nothing about the host.
    :param slow_start: start by doubling the limit every round until the
        first sign of a queue (TCP's slow start).
    :param probe: run probe rounds (half the limit for a few answers) at the
        end of slow start and every two windows, so that the baseline is
        made of unloaded answers (BBR's ProbeRTT).
    :raises ValueError: on a tolerance below 1, a non-finite window or a
        negative resolution.

    Attributes: ``limit`` (the fractional limit), ``tolerance``, ``window``,
    ``best`` (the baseline latency: the host's estimated unloaded median,
    None before the first sample), ``last_latency``, and the counters
    ``increase_count`` (answers that raised the limit), ``decrease_count``
    (slow rounds), ``overload_count`` (every overload signal) and
    ``rebaseline_count`` (slowdowns and speed-ups taken as the new
    baseline).
    """

    __slots__ = ()

    def _end_probe(self, now: float, *, overloaded: bool = False) -> None:
        probe = self._probe
        checking = probe.checking
        latencies = probe.latencies
        suspected = probe.suspected
        probe.end(now, self.window, self._baseline.samples, self.current())
        if checking is not None and not overloaded:
            self._settle_slowdown(now, checking, latencies, suspected)
        self._size_rounds()
        self._note_limit(now)

    def _suspect_slowdown(
        self, now: float, median: float, latencies: list[float]
    ) -> None:
        """Three slow rounds did not get faster as the limit fell: check with
        a probe at half the limit before taking the slower baseline.

        A queue the crawler causes drains when its requests do, but with
        noise three rounds of a dozen answers can still come out flat: on
        the host model 2 of 72 hosts that kept their speed were taken as
        slower and held about twice their unloaded median for the rest of
        the crawl. A host that got slower is slow at half the limit too. At
        a limit that cannot be halved (the rounds were already unloaded), or
        without probe rounds, the *median* of the last round's *latencies*
        is taken at once.
        """
        self._speed.reset()
        probe = self._probe
        limit = int(self.limit)
        if probe.started is None:
            if not probe.enabled or limit < 2 or limit // 2 < self._minimum:
                self._rebaseline(now, median, latencies, slower=True)
                return
            probe.begin(now)
            self._note_limit(now)
        # The probe's own answers pull the baseline up while it runs: the
        # check compares them with the one the slow rounds were judged by.
        probe.checking = self.best
        probe.suspected = list(latencies)

    def _check_decided(self) -> bool:
        """Whether the first answers of a probe checking a slowdown already
        agree: all beyond the tolerance, or all within it.

        With independent answers, a host that kept its speed puts all four
        of them beyond the tolerance about 1 time in 80 at sigma 1.0 (and
        far less at lower noise); the other four answers of the check are
        waited for only when they disagree.
        """
        probe = self._probe
        checking = probe.checking
        latencies = probe.latencies
        if checking is None or len(latencies) != _CHECK_ANSWERS:
            return False
        threshold = self._threshold(checking)
        beyond = sum(1 for latency in latencies if latency > threshold)
        return beyond in (0, _CHECK_ANSWERS)

    def _settle_slowdown(
        self,
        now: float,
        baseline: float,
        latencies: list[float],
        suspected: list[float],
    ) -> None:
        """A probe that checked a slowdown suspected at *baseline* ended with
        *latencies*: the host got slower if their median is beyond the
        tolerance. The new baseline is the median of those and of the
        *suspected* round's latencies together: a handful of answers alone
        is too few to measure a noisy host by."""
        if len(latencies) < _CHECK_ANSWERS:
            return
        if lower_median(sorted(latencies)) > self._threshold(baseline):
            pooled = sorted(latencies + suspected)
            self._rebaseline(now, lower_median(pooled), pooled, slower=True)
            # The running round counted the slower host's answers against
            # the old baseline (as a queue forming, which would end the
            # slow start the new baseline begins).
            self._round.start(now)

    def on_sent(self, now: float, in_flight: int) -> None:
        """Note a request sent at *now* with *in_flight* requests of the scope
        in flight, itself included: the load its answer will have measured.

        Optional: without it, the load is estimated from the limit at the
        time the request was sent.
        """
        self._baseline.load.on_sent(now, in_flight)

    def _update_baseline(self, now: float) -> None:
        """Recompute the baseline from the lowest in-flight levels."""
        baseline = self._baseline
        if baseline.update(now, self.window, self._threshold):
            self.best = baseline.best
            self._size_rounds()

    def _size_rounds(self) -> None:
        self._round_size = round_size_for_noise(
            max(self._baseline.pool_slow_share, self._probe.slow_share())
        )

    def _rebaseline(
        self,
        now: float,
        baseline: float,
        latencies: list[float],
        *,
        slower: bool = False,
    ) -> None:
        """The host itself changed speed: start the baseline over."""
        level = max(1, int(self.limit))
        self._baseline.restart(now, baseline, latencies, level, self._threshold)
        self.best = baseline
        self._size_rounds()
        self._speed.reset()
        self._plateau.forget()
        if slower:
            # Three decreases found nothing to fix: the limit the slower
            # host needs is found again by slow start.
            self._slow_start.restart()
        self.rebaseline_count += 1

    # -- answers ------------------------------------------------------------------

    def on_response(self, now: float, latency: float, in_flight: int) -> None:
        """Adapt to one normal answer.

        :param now: the current time.
        :param latency: the answer's latency in seconds.
        :param in_flight: requests of the scope in flight, including the one
            that just answered.
        """
        if not 0 < latency < math.inf:
            return
        self.last_latency = latency
        self._baseline.record(now, latency, in_flight, self.current())
        self._speed.answered(now, latency)
        probe = self._probe
        started = probe.started
        if started is not None:
            if now - latency >= started:
                best = self.best
                probe.add(
                    latency,
                    slow=best is not None and latency > self._threshold(best),
                )
            if probe.is_over(now, self.best) or self._check_decided():
                self._end_probe(now)
        if self._baseline.is_due(now, self.window):
            self._update_baseline(now)
        best = self.best
        assert best is not None

        limit = self.limit
        sent = now - latency
        current_round = self._round
        counted = sent >= current_round.mark
        if counted:
            current_round.loads.append(in_flight)
        threshold = self._threshold(best)
        if latency <= threshold:
            step = growth_step(latency, best, threshold)
            slow_start = self._slow_start
            if step < 1.0:
                if counted:
                    current_round.upper += 1
                slow_start.answered_high(current_round, steady=self._baseline.steady)
            # int(limit) is current(): the limit always lies within its bounds.
            if (
                limit < self._maximum
                and in_flight >= int(limit) - 1
                and (slow_start.active or sent >= self._raised_at)
            ):
                grown = grown_limit(
                    limit,
                    step,
                    slow_start=slow_start.active,
                    plateau=self._plateau.near(limit, now, self.window),
                    maximum=self._maximum,
                )
                raised = int(grown) > int(limit)
                self.limit = limit = grown
                if raised:
                    self._raised_at = now
                    self._note_limit(now)
                self.increase_count += 1
            if counted:
                current_round.add_fast(latency)
                if 2 * current_round.fast > self._round_target():
                    self._end_round(now, slow=False)
        else:
            if counted:
                current_round.upper += 1
            self._slow_start.answered_high(current_round, steady=self._baseline.steady)
            if counted:
                self._count_slow(now, latency)

    def _round_target(self) -> int:
        size = self._round_size
        limit = int(self.limit)
        return limit if limit > size else size

    def on_error_response(self, now: float, latency: float) -> None:
        """Adapt to an error page (e.g. 404, 500; not a backoff code).

        It never raises the limit nor makes the baseline (error pages are
        often much faster than real pages), but a slow one still counts as a
        slow answer of its round: the host is queueing whatever it answers.
        """
        if not 0 < latency < math.inf:
            return
        self.last_latency = latency
        best = self.best
        if (
            best is not None
            and latency > self._threshold(best)
            and now - latency >= self._round.mark
        ):
            self._round.upper += 1
            self._count_slow(now, latency)

    def _count_slow(self, now: float, latency: float) -> None:
        current_round = self._round
        current_round.add_slow(latency)
        if current_round.slow_majority(
            latency,
            self._round_target(),
            int(self.limit),
            self._baseline.unloaded_max,
        ):
            self._end_round(now, slow=True)

    def _end_round(self, now: float, *, slow: bool) -> None:
        current_round = self._round
        latencies = current_round.latencies
        if slow and self._probe.checking is not None:
            # A probe checks a suspected slowdown at half the limit: its
            # answers decide, lowering the limit more would only slow it.
            pass
        elif slow:
            self._slow_start.end()
            limit_before = self.limit
            self.limit = lowered_limit(limit_before, self._minimum)
            self._note_limit(now)
            self._plateau.failed(int(limit_before), now)
            self.decrease_count += 1
            slower = self._speed.after_slow_round(
                latencies,
                mostly_slow=current_round.mostly_slow(),
                load=current_round.load(),
            )
            if slower is not None:
                # Lowering the limit three rounds in a row did not bring the
                # latency down: the host is slower, not queueing our
                # requests, unless a probe shows otherwise.
                self._suspect_slowdown(now, slower, latencies)
        else:
            values = self._speed.sped_up(
                now, self.window, self.best, self._baseline.speedup_factor
            )
            if values is not None:
                # The host sped up (e.g. the end of a slowdown).
                self._rebaseline(now, lower_median(values), values)
                # Those answers came while the limit grew back: a probe
                # measures the faster host unloaded (on the model, the
                # median at the host after a 3-s slowdown: 1.72x the
                # unloaded one without it, 1.51x with it, over 12 seeds).
                self._probe.next_at = min(self._probe.next_at, now)
            if self._baseline.samples.dirty:
                self._update_baseline(now)
        current_round.start(now)
        probe = self._probe
        if (
            not self._slow_start.active
            and probe.started is None
            and now >= probe.next_at
            and probe.try_begin(now, int(self.limit), self._minimum, self.window)
        ):
            self._note_limit(now)

    # -- a limit run away from where it is enforced ---------------------------------

    def hold(self, now: float) -> None:
        """The limit just changed at *now*, but is enforced elsewhere, later
        (the leader of a shared limit publishes it to every process after a
        drain of their samples): until :meth:`release`, what the change
        started (a new round, growth from the raised limit, a probe) counts
        no answer.

        The answers fed meanwhile are to requests sent under the earlier
        limit, so they tell nothing about the new one. Counted, a lowered
        limit's next rounds are still slow, which lowers it again and reads
        as a slowdown lowering cannot fix (a wrong, higher baseline), and a
        raised limit grows again on answers that never tested it. They
        still make the baseline, and a round the change did not end (slow
        start raising the limit) goes on counting them, as without a hold.
        """
        current_round = self._round
        if current_round.mark == now:
            current_round.mark = math.inf
        if self._raised_at == now:
            self._raised_at = math.inf
        probe = self._probe
        if probe.started == now:
            probe.started = math.inf

    def release(self, now: float) -> None:
        """What :meth:`hold` kept waiting starts at *now*: answers to
        requests sent from then on count."""
        current_round = self._round
        if current_round.mark == math.inf:
            current_round.start(now)
        if self._raised_at == math.inf:
            self._raised_at = now
        probe = self._probe
        if probe.started == math.inf:
            probe.started = now

    @property
    def held(self) -> bool:
        """Whether a change waits for :meth:`release`."""
        return math.inf in (self._round.mark, self._raised_at, self._probe.started)

    def adopt(self, now: float, limit: float, baseline: float | None) -> None:
        """Take over a limit learned elsewhere: *limit* and its *baseline*
        latency (``None``: unknown), as the new leader of a shared limit
        does.

        Slow start is over (the limit was found); the baseline, when given,
        replaces this instance's (the answers it would be made of came while
        the host carried *limit* requests, not unloaded); a new round
        starts at *now*.
        """
        self.limit = float(limit)
        self.set_bounds(self._minimum, self._maximum)
        self._slow_start.end()
        if baseline is not None and 0 < baseline < math.inf:
            # Unloaded: at the lowest level, which later loaded answers do
            # not pool with.
            self._baseline.restart(now, baseline, [baseline], 1, self._threshold)
            self.best = baseline
            self._size_rounds()
            self._speed.reset()
        self._round.start(now)
        self._raised_at = now
        if self._probe.started is not None:
            self._probe.finish(now, self.window)
        self._note_limit(now)

    def on_overload(self, now: float) -> None:
        """Halve the limit on an explicit overload signal (429, 503, ...).

        At most once per baseline latency (the overload answers of one round
        count once); every overload starts a new round.
        """
        self.overload_count += 1
        self._slow_start.end()
        if now >= self._last_overload + (self.best or 0.0):
            self.limit = max(float(self._minimum), self.limit / 2)
            self._note_limit(now)
            self._last_overload = now
        self._round.start(now)
        self._speed.interrupted()
        if self._probe.started is not None:
            self._end_probe(now, overloaded=True)
