"""LearnedRate: the pace of a rate-limited scope, learned from its 429s.

Pure tests with a fake clock, and a simulated API (a sliding one-second
window of ``rate`` requests, as ``simhosts/``'s ``ratelimit`` kind)
paced by the learned interval, so the figures of issue 9 (at least 0.95 of
the rate once converged, at most one refusal per 10 s) are pinned without a
crawl.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_adaptive_throttle._algorithms import LearnedRate


def test_counts_sends_minus_refusals_over_the_period() -> None:
    rate = LearnedRate()
    for index in range(30):
        rate.record_send(10.01 + index * 0.03)  # 10.01 .. 10.88
    assert rate.count_accepted(10.9) == 30
    rate.record_send(10.9)
    rate.refuse(10.901)
    assert rate.count_accepted(10.95) == 30
    # Later, only what was sent in the last period counts: the 15 sends
    # from 10.46, and the refused one, which cancels out with its refusal.
    assert rate.count_accepted(11.45) == 15
    assert rate.count_accepted(13.0) == 0


def test_first_count_sets_the_interval_with_the_margin() -> None:
    rate = LearnedRate(margin=0.03)
    assert rate.interval == 0.0
    for index in range(51):
        rate.record_send(index * 0.005)
    assert rate.refuse(0.26) == pytest.approx(1.03 / 50)
    assert rate.accepted == 50


def test_more_completions_than_kept_are_extrapolated() -> None:
    rate = LearnedRate(max_samples=100)
    for index in range(1000):
        rate.record_send(index * 0.001)  # 1000 per second
    assert rate.count_accepted(0.9995) == pytest.approx(1000, rel=0.02)


def test_echoes_of_a_refusal_are_not_learned_from() -> None:
    """The requests in flight when a refusal comes back are refused a few
    milliseconds later: what was accepted in between says nothing."""
    rate = LearnedRate()
    for index in range(52):
        rate.record_send(index * 0.01)
    learned = rate.refuse(0.515)
    assert learned == pytest.approx(1.02 / 51)
    assert rate.refuse(0.516) == learned
    assert rate.refuse(1.4) == learned  # still the same episode
    assert rate.refusal_count == 3


def test_echoes_of_requests_sent_before_the_counted_one_correct_the_count() -> None:
    """A burst reaches the server out of order: the refused request was the
    23rd sent, but two sent before it arrived after it and were refused
    too. Their echoes say the count was two too many."""
    rate = LearnedRate()
    for index in range(25):
        rate.record_send(10.0 + index * 0.001)
    assert rate.refuse(10.05, sent_at=10.022) == pytest.approx(1.02 / 22)
    # Echoes of requests sent after the counted one: nothing to correct.
    assert rate.refuse(10.051, sent_at=10.023) == pytest.approx(1.02 / 22)
    assert rate.refuse(10.052, sent_at=10.020) == pytest.approx(1.02 / 21)
    assert rate.refuse(10.053, sent_at=10.021) == pytest.approx(1.02 / 20)
    assert rate.accepted == 20
    # A send from before the counted period was not in the count.
    assert rate.refuse(10.054, sent_at=9.0) == pytest.approx(1.02 / 20)
    # The next episode is learned anew; its echoes no longer correct the
    # last count (a refusal at the learned pace slows by the margin).
    rate._sent.extend(12.0 + index * 0.051 for index in range(20))
    again = rate.refuse(13.1, sent_at=13.0)
    assert again == pytest.approx(1.02 / 20 * 1.02)
    assert rate.refuse(13.101, sent_at=12.9) == again


def test_echo_corrections_keep_the_bounds_of_the_count() -> None:
    """After a probe the count never slows below the pace tolerated before
    it; corrected, it still does not; without a send time, nothing is
    corrected."""
    rate = LearnedRate(window=10.0)
    rate._sent.extend(index * 0.045 for index in range(20))
    known = rate.refuse(0.91, sent_at=0.9)
    probed = rate.roll(11.0)
    assert probed < known
    rate._sent.extend(11.0 + index * 0.04 for index in range(21))
    assert rate.refuse(12.01, sent_at=11.85) == pytest.approx(1.02 / 21)
    assert rate.refuse(12.02, sent_at=11.5) == pytest.approx(known)
    assert rate.refuse(12.03, sent_at=11.6) == pytest.approx(known)
    unknown = LearnedRate()
    for index in range(25):
        unknown.record_send(index * 0.001)
    learned = unknown.refuse(0.05)
    assert unknown.refuse(0.051) == learned


def test_a_refusal_with_nothing_accepted_learns_nothing() -> None:
    rate = LearnedRate()
    assert rate.refuse(5.0) == 0.0
    assert rate.accepted is None
    assert rate.refusal_count == 1


def test_a_refusal_at_the_learned_pace_slows_by_the_margin() -> None:
    rate = LearnedRate(margin=0.05, window=0)
    for index in range(20):
        rate.record_send(index * 0.045)
    first = rate.refuse(0.91, sent_at=0.9)
    assert first == pytest.approx(1.05 / 20)
    # At that pace, fewer are counted (19 here); the pace slows by the
    # margin only.
    rate._sent.extend(2.0 + index * 0.0526 for index in range(19))
    assert rate.refuse(3.01, sent_at=3.0) == pytest.approx(first * 1.05)


def test_after_a_probe_a_short_count_does_not_slow_below_the_known_pace() -> None:
    rate = LearnedRate(window=10.0)
    rate._sent.extend(index * 0.045 for index in range(20))
    known = rate.refuse(0.91, sent_at=0.9)
    assert known == pytest.approx(1.02 / 20)
    probed = rate.roll(11.0)
    assert probed < known
    rate._sent.extend(11.0 + index * 0.0525 for index in range(19))
    assert rate.refuse(12.01, sent_at=12.0) == pytest.approx(known)
    # After probes that found a raised limit, the count is believed.
    for t in (22.1, 32.2, 42.3):
        rate.roll(t)
    rate._sent.extend(43.0 + index * 0.03 for index in range(33))
    assert rate.refuse(44.0, sent_at=43.99) == pytest.approx(1.02 / 33)


def test_a_refusal_at_a_pace_the_count_calls_safe_slows_by_the_margin() -> None:
    """The count can be one off at the window's edge: 21 where the server
    allows 20, so the pace learned from it is refused again."""
    rate = LearnedRate(margin=0.02, window=0)
    for index in range(22):
        rate.record_send(index * 0.0476)
    first = rate.refuse(1.005, sent_at=21 * 0.0476)
    assert first == pytest.approx(1.02 / 21)
    # The same count again, at the pace learned from it.
    rate._sent.extend(3.0 + index * 0.0476 for index in range(21))
    again = rate.refuse(4.005, sent_at=4.0)
    assert again == pytest.approx(first * 1.02)


def test_probing_shrinks_the_interval_after_quiet_windows() -> None:
    rate = LearnedRate(window=10.0, probe_step=0.02)
    for index in range(40):
        rate.record_send(index * 0.02)
    learned = rate.refuse(0.8)
    assert rate.roll(10.7) == learned
    assert rate.roll(10.8) == pytest.approx(learned / 1.02)
    # Unrefused: the next steps come one window apart, each twice as large;
    # a long idle time counts as one window.
    assert rate.roll(20.8) == pytest.approx(learned / 1.02 / 1.04)
    assert rate.roll(90.0) == pytest.approx(learned / 1.02 / 1.04 / 1.08)
    assert rate.probe_count == 3


def test_patience_doubles_after_each_refusal_that_follows_a_probe() -> None:
    rate = LearnedRate(window=10.0, max_patience=4)

    def refuse_at(t: float) -> None:
        for index in range(20):
            rate._sent.append(t - 0.9 + index * 0.04)  # sends, not paced
        rate.refuse(t)

    refuse_at(1.0)
    rate.roll(11.0)
    assert rate.probe_count == 1
    refuse_at(12.0)  # found again: the next probe waits 2 windows
    rate.roll(12.0 + 19.9)
    assert rate.probe_count == 1
    rate.roll(12.0 + 20.0)
    assert rate.probe_count == 2
    refuse_at(33.0)  # 4 windows
    refuse_at(35.0)  # capped at 4
    rate.roll(35.0 + 39.9)
    assert rate.probe_count == 2
    rate.roll(35.0 + 40.0)
    assert rate.probe_count == 3


def test_probing_waits_at_least_thirty_holds() -> None:
    """A probe costs one Retry-After hold: with a 2-second window and
    1-second holds, probing every window would cost half of each."""
    rate = LearnedRate(window=2.0)
    rate._sent.extend(index * 0.05 for index in range(20))
    learned = rate.refuse(1.0, sent_at=1.0, hold=1.0)
    assert rate.roll(1.0 + 29.9) == learned
    assert rate.roll(1.0 + 30.0) < learned


def test_a_count_given_by_the_caller_replaces_the_own_count() -> None:
    """With a shared state the count is every process's sends: this
    process's own 5 sends say nothing of the 49 the server accepted."""
    rate = LearnedRate()
    for index in range(5):
        rate.record_send(index * 0.1)
    learned = rate.refuse(0.5, sent_at=0.45, accepted=49)
    assert rate.accepted == 49
    assert learned == pytest.approx(1.02 / 49)
    # The caller decides what starts an episode: a given count is learned
    # from even within the period of the last refusal.
    assert rate.refuse(0.6, sent_at=0.58, accepted=50) == pytest.approx(learned * 1.02)


def test_an_echo_is_counted_not_learned_from() -> None:
    rate = LearnedRate()
    for index in range(20):
        rate.record_send(index * 0.05)
    learned = rate.refuse(1.0, sent_at=1.0)
    rate.record_echo(5.0)
    assert rate.interval == learned
    assert rate.refusal_count == 2
    # The echo counts as refused in the next count (sends minus refusals).
    for index in range(10):
        rate.record_send(4.5 + index * 0.05)
    assert rate.count_accepted(5.2) == 9


def test_an_adopted_state_probes_on_the_same_schedule() -> None:
    """A process that takes over the state another learned probes at the
    same moments as that one, with no further word between them."""
    learner = LearnedRate(window=10.0, max_patience=8)
    learner.refuse(1.0, sent_at=1.0, hold=0.2, accepted=40)
    learner.roll(11.0)  # a probe, found again: patience doubles
    learner.refuse(12.0, sent_at=12.0, hold=0.2, accepted=45)
    follower = LearnedRate(window=10.0, max_patience=8)
    follower.adopt(learner.learned_state(), refused_at=12.0)
    assert follower.interval == learner.interval
    assert follower.accepted == 45
    for now in (20.0, 31.9, 32.0, 41.9, 42.0, 60.0):
        assert follower.roll(now) == learner.roll(now), now
    # Probes at 32, 42 and 60 (patience 2, then one window each); the
    # learner also took its own probe at 11, before the adoption.
    assert follower.probe_count == 3
    assert learner.probe_count == 4


def test_record_send_paces_a_share_of_the_interval() -> None:
    """*processes* > 1 (a shared pace whose Redis is lost): each process
    keeps one send per that many intervals."""
    rate = LearnedRate(window=0)
    rate.refuse(0.0, sent_at=0.0, accepted=10)
    interval = rate.interval
    assert rate.record_send(1.0, processes=3) == pytest.approx(1.0 + 3 * interval)
    assert rate.record_send(1.0 + 3 * interval, processes=3) == pytest.approx(
        1.0 + 6 * interval
    )


def test_no_probe_without_a_window() -> None:
    rate = LearnedRate(window=0)
    for index in range(10):
        rate.record_send(index * 0.1)
    learned = rate.refuse(1.0)
    assert rate.roll(1e6) == learned


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("period", 0.0),
        ("period", math.nan),
        ("margin", -0.1),
        ("margin", math.inf),
        ("probe_step", -1.0),
        ("max_samples", 1),
    ],
)
def test_invalid_parameters(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        LearnedRate(**{field: value})  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# A simulated API and a client paced by the learned interval
# --------------------------------------------------------------------------


@dataclass
class SlidingWindowAPI:
    """At most ``rate`` requests admitted in any trailing ``period``."""

    rate: float
    period: float = 1.0
    admitted: deque[float] = field(default_factory=deque)

    def admit(self, now: float) -> bool:
        while self.admitted and self.admitted[0] <= now - self.period:
            self.admitted.popleft()
        if len(self.admitted) >= self.rate:
            return False
        self.admitted.append(now)
        return True


@dataclass
class Run:
    pages: list[float] = field(default_factory=list)
    refusals: list[float] = field(default_factory=list)
    intervals: list[tuple[float, float]] = field(default_factory=list)
    #: (send time, interval) of every send paced by a learned interval.
    paces: list[tuple[float, float]] = field(default_factory=list)

    def pages_per_second(self, start: float, end: float) -> float:
        return sum(start <= t < end for t in self.pages) / (end - start)

    def refusals_between(self, start: float, end: float) -> int:
        return sum(start <= t < end for t in self.refusals)


def crawl(
    api: SlidingWindowAPI,
    rate: LearnedRate,
    *,
    seconds: float,
    unlearned_interval: float,
    latency: float = 0.010,
    lag: float = 0.0005,
    retry_after: float = 1.0,
    change: tuple[float, float] | None = None,
    reorder: float = 0.0,
    seed: int = 0,
) -> Run:
    """Send as fast as the learned interval allows (before anything is
    learned: every *unlearned_interval*, an adaptive limit's pace), each send
    *lag* seconds late (the crawler's loop); every refusal holds the client
    *retry_after* seconds. *change* = (time, new rate) raises the limit.
    *reorder*: each request reaches the API up to that many seconds after
    its send (uniform, seeded), so close sends arrive out of order."""
    run = Run()
    draw = random.Random(seed)
    # (time, order, arrived?, accepted?, sent_at): arrivals, then answers.
    events: list[tuple[float, int, bool, bool, float]] = []
    order = 0
    next_send = 0.0
    hold_until = 0.0
    while True:
        send_at = max(next_send, hold_until)
        if events and events[0][0] <= send_at:
            at, _, arrival, accepted, sent_at = heapq.heappop(events)
            order += 1
            if arrival:
                if change is not None and at >= change[0]:
                    api.rate = change[1]
                admitted = api.admit(at)
                done_at = at + (latency if admitted else 0.001)
                heapq.heappush(events, (done_at, order, False, admitted, sent_at))
            elif accepted:
                run.pages.append(at)
            else:
                run.refusals.append(at)
                rate.refuse(at, sent_at)
                run.intervals.append((at, rate.interval))
                hold_until = max(hold_until, at + retry_after)
            continue
        if send_at >= seconds:
            return run
        order += 1
        arrive_at = send_at + (draw.uniform(0.0, reorder) if reorder else 0.0)
        heapq.heappush(events, (arrive_at, order, True, False, send_at))
        allowed = rate.record_send(send_at)
        if rate.interval:
            run.paces.append((send_at, rate.interval))
        next_send = (
            allowed if allowed > send_at else send_at + unlearned_interval
        ) + lag


@pytest.mark.parametrize("limit", [20, 50, 200])
@pytest.mark.parametrize("window", [2.0, 10.0, 60.0])
def test_converges_under_the_limit_with_rare_refusals(
    limit: int, window: float
) -> None:
    run = crawl(
        SlidingWindowAPI(limit),
        LearnedRate(window=window),
        seconds=300.0,
        unlearned_interval=1 / (4 * limit),
    )
    assert run.pages_per_second(10.0, 300.0) >= 0.95 * limit
    # At most one refusal per 10 s once converged.
    assert run.refusals_between(10.0, 300.0) <= 29
    for start in range(10, 300, 10):
        assert run.refusals_between(start, start + 10) <= 1


def test_without_learning_every_hold_ends_in_the_limit() -> None:
    """What the learned pace replaces: a client that only honours the
    Retry-After hold runs into the limit again as soon as it ends."""
    run = crawl(
        SlidingWindowAPI(50),
        LearnedRate(window=0.0),  # no probing
        seconds=60.0,
        unlearned_interval=1 / 200,
    )
    assert run.refusals_between(10.0, 60.0) == 0
    unpaced = LearnedRate(period=1e-6, window=0.0)  # never counts anything
    run = crawl(SlidingWindowAPI(50), unpaced, seconds=60.0, unlearned_interval=1 / 200)
    assert run.refusals_between(10.0, 60.0) >= 30
    assert run.pages_per_second(10.0, 60.0) < 0.9 * 50


def test_a_raised_limit_is_found_again_by_probing() -> None:
    run = crawl(
        SlidingWindowAPI(20),
        LearnedRate(window=10.0),
        seconds=400.0,
        unlearned_interval=1 / 80,
        change=(100.0, 30.0),
    )
    assert run.pages_per_second(10.0, 100.0) >= 0.93 * 20
    # Found within a few windows once the next probe comes (the patience
    # had grown to 4 windows by then).
    assert run.pages_per_second(200.0, 400.0) >= 0.95 * 30


@settings(max_examples=40, deadline=None)
@given(
    limit=st.integers(min_value=5, max_value=400),
    lag=st.floats(min_value=0.0, max_value=0.5),
)
def test_never_paces_faster_than_the_limit_after_a_refusal(
    limit: int, lag: float
) -> None:
    unlearned = 1 / (3 * limit)
    run = crawl(
        SlidingWindowAPI(limit),
        LearnedRate(window=0.0),
        seconds=30.0,
        unlearned_interval=unlearned,
        lag=lag * unlearned,
    )
    learned = [interval for _, interval in run.intervals if interval]
    assert learned, "a refusal was learned from"
    assert all(interval >= 0.99 / limit for interval in learned)


@settings(max_examples=40, deadline=None)
@given(
    limit=st.integers(min_value=5, max_value=100),
    reorder=st.floats(min_value=0.0, max_value=4.0),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_a_burst_out_of_order_does_not_learn_a_pace_over_the_limit(
    limit: int, reorder: float, seed: int
) -> None:
    """Before anything is learned the scope sends in bursts, which reach
    the API out of order (here: each up to *reorder* unlearned intervals
    late): the refused request was not the first to arrive over the
    limit, and the sends before it that arrived after it were counted as
    accepted. Their echoes correct the count before the hold ends."""
    unlearned = 1 / (4 * limit)
    run = crawl(
        SlidingWindowAPI(limit),
        LearnedRate(window=0.0),
        seconds=20.0,
        unlearned_interval=unlearned,
        reorder=reorder * unlearned,
        seed=seed,
    )
    assert run.paces, "a refusal was learned from"
    assert min(interval for _, interval in run.paces) >= 1.0 / limit
