"""The pace a rate-limited scope keeps, learned from its refusals.

Rule: a refusal for too many requests (HTTP 429) says that the server's
window is full, so the requests it accepted over the ``period`` before the
refused one are its limit. At each refusal the learned interval between
sends becomes::

    interval = period * (1 + margin) / accepted

where ``accepted`` counts the requests *sent* over the ``period`` before the
refused request was sent, minus the refusals among them. Sends, not
completions: an accepted request takes its service time to come back and a
refusal comes back at once, so counting completions would miss what was
accepted in the last service time (3 of 50 measured at 10 ms). The count is
exact (times are kept, at most ``max_samples``; past that many in one period
it is extrapolated from their span): at 20 requests/s one request miscounted
is 5 %, more than the margin, so sub-buckets would not do.

``margin`` keeps the pace just under the limit, so that the jitter of a
crawler's event loop does not push a send into a full window: a pace
``1 + margin`` slower than the limit leaves ``margin / 2`` seconds of arrival
jitter (10 ms at 2 %) before a window of one second can hold one request too
many. At the window's edge the count can be one off either way (the send
times seen by the crawler are not the server's arrival times), and one in 20
is more than the margin, so the count only sets the pace when nothing is
known yet, or after a probe (never slower than the pace tolerated before
it); a refusal at the learned pace slows it by the margin instead.

Only the first refusal of an *episode* (``period`` seconds) is learned from:
the requests in flight when it came back are refused too, a few milliseconds
later, and counting again then would count what was accepted in those
milliseconds. But the echoes correct the count: an echo of a request sent
*before* the refused one was counted as accepted, and was not (requests sent
together, as after a hold, do not reach the server in the order they were
sent). Without this, one CI run learned a pace of about 21 requests/s from
such a burst where the server allows 20 (each later refusal came 0.95 s
after its hold ended, 20 sends later), and took four more refusals, 2 %
each, to come under the limit. Each such echo takes one from the count and
sets the interval again (within the bounds the count itself had).

The interval is a floor of the scope's spacing, not a hold: the server's own
wait (``Retry-After``) is honoured by the backoff hold, once per refusal.
Sends are paced on a schedule (:meth:`LearnedRate.record_send`): each is
allowed one interval after the previous one was *allowed*, not after it was
sent, so the crawler's own lag (a few hundred microseconds per request on the
event loop) does not add up to a slower pace; a send later than half an
interval starts a new schedule, so an idle or held scope never saves up a
burst (one request more in a window of 20 is 5 %, more than the margin).

Probing: a server may raise its limit, and the margin costs a few percent.
After ``patience`` quiet windows of ``window`` seconds (no refusal), the
interval shrinks by ``probe_step``; each further quiet window takes a step
twice as large (2, 4, 8 % ...), so that a raised limit is found in a few
windows. A refusal re-learns the limit from its count (one refusal per
overshoot, however large the step) and doubles the patience (up to
``max_patience`` windows), so that a limit found again and again is probed
ever more rarely: a refusal costs a ``Retry-After`` hold, so probing every
window would cost more than the margin gains. For the same reason a probing
window lasts at least ``hold_ratio`` (30) holds: with a 2-second
:setting:`BACKOFF_WINDOW` and ``Retry-After: 1``, each probe would otherwise
cost half a window. With the defaults (2 % margin
and steps, patience up to 32 windows) a scope settles at about 0.98 of the
limit and, once the patience has grown, draws about one refusal per 33
windows: one every half hour with :setting:`BACKOFF_WINDOW` 60 s.

Why not recover to the base delay, as backoff does: after each quiet window
the scope would run into the limit again and pay a refusal and a
``Retry-After`` hold per window (measured with the add-on's defaults before
this: an API allowing 50 requests/s got 0.86 of it, with about 50 refusals;
see ``bench/RESULTS.md``).

The count only sees limits over ``period`` (1 s by default: "R requests per
second"); for a limit over a longer window, each refusal still slows the
pace by the margin.

Several processes sharing one limit (:setting:`THROTTLING_STATE_URL`): a
process's own sends are only its share of what the server counted, and
that share is low while the others ramp up, so each process would learn a
pace of its share at that moment and keep it until a probe. The count is
then the *global* one, of every process's sends (kept by the shared state,
passed as ``accepted`` to :meth:`LearnedRate.refuse`), one process learns
per episode (the others' refusals of the same episode are only recorded,
:meth:`LearnedRate.record_echo`), and the others take over the state it
learned (:meth:`LearnedRate.learned_state`, :meth:`LearnedRate.adopt`):
since the probing schedule follows from that state and the time, every
process probes at the same moments without talking to the others.
"""

from __future__ import annotations

import math
from collections import deque
from typing import NamedTuple

__all__ = ["LearnedRate", "LearnedState"]


class LearnedState(NamedTuple):
    """What a refusal taught a :class:`LearnedRate`, for another process's
    copy of it (see :meth:`LearnedRate.adopt`)."""

    #: The learned interval between sends, in seconds.
    interval: float
    #: Quiet windows before the first probe.
    patience: int
    #: The longest hold a refusal caused (a probe's cost), in seconds.
    hold: float
    #: The count the interval came from (``None``: none yet).
    accepted: float | None


class LearnedRate:
    """The learned minimum interval between sends of one rate-limited scope.

    All times are monotonic seconds passed in by the caller.

    :param period: the server window assumed when counting accepted
        requests, in seconds.
    :param margin: how far below the counted limit to keep (0.02 = 2 %).
    :param window: seconds of quiet per probing window; <= 0 never probes.
    :param probe_step: how much faster each probe paces (0.02 = 2 %).
    :param max_patience: the most quiet windows before a probe.
    :param hold_ratio: a probing window lasts at least this many times the
        longest hold a refusal caused (a probe costs one hold).
    :param max_samples: the most send (and refusal) times kept.
    :raises ValueError: on a non-positive period or sample count, or a
        negative or non-finite margin or probe step.

    Attributes:

    * ``interval``: the learned minimum spacing between sends (0.0 until a
      refusal could be counted).
    * ``accepted``: the last count of accepted requests (None before).
    * ``refusal_count`` / ``probe_count``: refusals seen, probes taken.
    """

    __slots__ = (
        "_allowed",
        "_counted",
        "_hold",
        "_known",
        "_last_refusal",
        "_max_patience",
        "_patience",
        "_probe_step",
        "_quiet_since",
        "_refused",
        "_sent",
        "_step",
        "_wait",
        "accepted",
        "hold_ratio",
        "interval",
        "margin",
        "period",
        "probe_count",
        "refusal_count",
        "window",
    )

    def __init__(
        self,
        *,
        period: float = 1.0,
        margin: float = 0.02,
        window: float = 60.0,
        probe_step: float = 0.02,
        max_patience: int = 32,
        hold_ratio: float = 30.0,
        max_samples: int = 4096,
    ) -> None:
        if not (math.isfinite(period) and period > 0):
            raise ValueError(f"period must be > 0, got {period!r}")
        for name, value in (("margin", margin), ("probe_step", probe_step)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        if max_samples < 2:
            raise ValueError(f"max_samples must be >= 2, got {max_samples!r}")
        self.period = period
        self.margin = margin
        self.window = window
        self._probe_step = probe_step
        self._max_patience = max(1, max_patience)
        self._sent: deque[float] = deque(maxlen=max_samples)
        self._refused: deque[float] = deque(maxlen=max_samples)
        self._allowed = -math.inf
        self.interval = 0.0
        #: The interval set by the last refusal, before any probe.
        self._known = 0.0
        self._hold = 0.0
        self.hold_ratio = hold_ratio
        self.accepted: float | None = None
        self._patience = 1
        #: Quiet windows before the next probe, and that probe's step.
        self._wait = 1
        self._step = probe_step
        self._quiet_since: float | None = None
        self._last_refusal: float | None = None
        #: The send time of the refusal whose count set the interval in
        #: this episode, and the slowest pace that count may set (see
        #: :meth:`_recount`); None when the interval did not come from it.
        self._counted: tuple[float, float] | None = None
        self.refusal_count = 0
        self.probe_count = 0

    def count_accepted(self, now: float, sent_at: float | None = None) -> float:
        """Sends minus refusals over the period before *sent_at* (the send
        of a refused request; default *now*), that send excluded."""
        end = now if sent_at is None else min(sent_at, now)
        since = end - self.period
        sent = self._count(self._sent, since, end)
        refused = self._count(self._refused, since, now)
        return max(0.0, sent - refused)

    def _count(self, times: deque[float], since: float, end: float) -> float:
        """Times in ``[since, end)``; older ones are dropped."""
        while times and times[0] < since:
            times.popleft()
        count = len(times)
        if count and times[-1] >= end:
            count = sum(1 for t in times if t < end)
        if count == times.maxlen and count > 1 and times[-1] > times[0]:
            # More in one period than kept: extrapolate from their span.
            return (count - 1) * self.period / (times[-1] - times[0])
        return float(count)

    def record_send(self, now: float, *, processes: int = 1) -> float:
        """Record a send at *now*; return the earliest time of the next one
        (*now* itself while nothing is learned).

        *processes*: how many processes pace on their own copy of this
        pace (a shared state that is lost): each keeps to its share, one
        send per *processes* intervals.
        """
        self._sent.append(now)
        interval = self.roll(now) * processes
        if not interval:
            return now
        allowed = self._allowed + interval
        if allowed < now + 0.5 * interval:
            # More than half an interval late (idle, or held): a new
            # schedule, with no credit for the time not used.
            allowed = now + interval
        self._allowed = allowed
        return allowed

    def refuse(
        self,
        now: float,
        sent_at: float | None = None,
        hold: float = 0.0,
        *,
        accepted: float | None = None,
    ) -> float:
        """Record a refusal of a request sent earlier (with
        :meth:`record_send`), at *sent_at* if known; return the learned
        interval.

        The server's window at the refused request's arrival is the period
        before its send; without *sent_at*, the period before *now*, which
        misses the sends of that period's first moments (one request in 20
        is 5 %). *hold* is how long the refusal holds the scope (its
        ``Retry-After``): what each probe will cost, so probing waits at
        least ``hold_ratio`` times as long.

        *accepted*: the requests accepted over that period counted by the
        caller (every process's sends, from a shared state) instead of this
        object's own sends; the caller also decided that this refusal is
        the first of its episode (the others go to :meth:`record_echo`).
        """
        self.roll(now)
        shared = accepted is not None
        if accepted is None:
            accepted = self.count_accepted(now, now if sent_at is None else sent_at)
            if sent_at is None:
                accepted -= 1  # the refused request itself, sent just before
        self._refused.append(now)
        self.refusal_count += 1
        episode = self._last_refusal
        if not shared and episode is not None and now - episode < self.period:
            # An echo of the refusal that started this episode: requests
            # sent before the scope was held. The count since then says
            # nothing about the limit, but an echo of a request sent
            # before the one counted from was counted as accepted.
            self._recount(sent_at)
            return self.interval
        self._counted = None
        if accepted >= 1:
            self.accepted = accepted
            counted = self._paced_for(accepted)
            known = self._known
            # The slowest pace the count may set, should echoes correct it
            # (None: this interval did not come from the count).
            cap: float | None
            if not known:
                learned = counted
                cap = math.inf
            elif self.interval < known:
                # A probe went past the limit: the count says where it is,
                # but never slower than the pace tolerated before the probe
                # (the count can be one short at the window's edge).
                learned = min(counted, known)
                cap = known
            else:
                # Refused at the pace learned: the limit is about this pace
                # (the count that set it was one too many at the window's
                # edge, or the limit is not only per period). Slow down by
                # the margin, not by what a count one short would say.
                learned = known * (1.0 + self.margin)
                cap = None
            if cap is not None and sent_at is not None and not shared:
                self._counted = (sent_at, cap)
            if self.probe_count:
                # Found again after probing: probe more rarely from now on.
                self._patience = min(self._patience * 2, self._max_patience)
            self.interval = self._known = learned
        self._step = self._probe_step
        self._wait = self._patience
        self._hold = max(self._hold, hold)
        self._last_refusal = now
        self._quiet_since = now
        return self.interval

    def _recount(self, sent_at: float | None) -> None:
        """Correct the count of this episode for the echo of a request sent
        at *sent_at*: sent before the request counted from, it was counted
        as accepted, and was refused."""
        counted = self._counted
        if counted is None or sent_at is None or self.accepted is None:
            return
        first_sent, cap = counted
        if not first_sent - self.period <= sent_at < first_sent:
            return
        accepted = self.accepted - 1.0
        if accepted < 1:
            return
        self.accepted = accepted
        self.interval = self._known = min(self._paced_for(accepted), cap)

    def _paced_for(self, accepted: float) -> float:
        """The interval that keeps *accepted* requests a period, slowed by
        the margin."""
        return self.period * (1.0 + self.margin) / accepted

    def record_echo(self, now: float) -> None:
        """Record a refusal that another process learns from (the first of
        its episode was refused there): counted, not learned from."""
        self._refused.append(now)
        self.refusal_count += 1

    def learned_state(self) -> LearnedState:
        """What the last refusal taught, for :meth:`adopt` elsewhere."""
        return LearnedState(self._known, self._patience, self._hold, self.accepted)

    def adopt(self, state: LearnedState, refused_at: float) -> None:
        """Take over *state*, learned by another process from a refusal at
        *refused_at* (on this object's clock): the same interval, and the
        same probing schedule from then on."""
        self.interval = self._known = state.interval
        self._patience = max(1, state.patience)
        self._hold = max(self._hold, state.hold)
        self.accepted = state.accepted
        self._step = self._probe_step
        self._wait = self._patience
        self._last_refusal = refused_at
        self._quiet_since = refused_at
        self._counted = None

    def roll(self, now: float) -> float:
        """Take the probing step due by *now*, if any; return the interval.

        The first probe after a refusal waits ``patience`` quiet windows;
        each later one waits one window and takes twice the step of the one
        before, which went unrefused (so a raised limit is found in a few
        windows); time spent idle counts as one window, not several.
        """
        since = self._quiet_since
        window = self.window
        if since is None or not self.interval or window <= 0:
            return self.interval
        window = max(window, self.hold_ratio * self._hold)
        if now - since >= window * self._wait:
            self.interval /= 1.0 + self._step
            self.probe_count += 1
            if self._wait > 1:
                self._wait = 1
            else:
                self._step = min(2.0 * self._step, 1.0)
            self._quiet_since = now
        return self.interval

    def __repr__(self) -> str:
        return (
            f"<LearnedRate interval={self.interval:.4f} accepted={self.accepted}"
            f" patience={self._patience}>"
        )
