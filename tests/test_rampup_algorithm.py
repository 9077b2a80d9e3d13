"""Rampup, the pure algorithm, with a fake clock.

One window at a time: what a window below, within and above the target does,
when the delay stops being the bottleneck, idle and untested windows, and an
event-driven simulation of a rate-limited API and of a concurrency-limited
one that checks the promised convergence.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import pytest

from scrapy_adaptive_throttle._algorithms import RampupPolicy, RampupState

WINDOW = 10.0


def window(
    state: RampupState,
    start: float,
    *,
    sends: int = 10,
    latency: float = 0.1,
    delay_held: bool = True,
    concurrency_held: bool = False,
    triggers: int = 0,
) -> float:
    """Feed one window of activity starting at *start*; return its end.

    Requests are sent one after the other, each in flight for *latency*
    seconds; the end of the window is not rolled yet.
    """
    step = WINDOW / (sends + 1)
    for index in range(sends):
        at = start + index * step
        state.observe_hold(at, delay=delay_held, concurrency=concurrency_held)
        state.observe_send(at, 1)
        state.observe_done(at + latency, 0)
    for index in range(triggers):
        state.trigger(start + WINDOW * 0.95 + index * 0.001)
    return start + WINDOW


def fresh(delay: float = 1.0, **policy: object) -> RampupState:
    state = RampupState(RampupPolicy(window=WINDOW, **policy), delay=delay)  # type: ignore[arg-type]
    state.roll(0.0)  # starts the first window
    return state


# -- the policy -------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"target": (2.0, 1.0)},
        {"target": (-1.0, 1.0)},
        {"delay_factor": 1.0},
        {"delay_factor": 0.0},
        {"finest_factor": 1.5},
        {"min_delay": -1.0},
        {"min_delay": math.inf},
        {"window": math.nan},
        {"min_concurrency": 0},
        {"min_concurrency": 4, "max_concurrency": 2},
    ],
)
def test_policy_rejects_invalid_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011
        RampupPolicy(**kwargs)  # type: ignore[arg-type]


def test_starts_at_the_floor_with_the_configured_delay() -> None:
    state = RampupState(RampupPolicy(min_concurrency=2, max_concurrency=8), delay=0.5)
    assert (state.delay, state.concurrency) == (0.5, 2)
    assert state.window_start is None


# -- one window ---------------------------------------------------------------


def test_window_below_target_lowers_the_delay() -> None:
    state = fresh(delay=1.0)
    end = window(state, 0.0, latency=0.1)
    assert state.roll(end) == 1
    assert (state.delay, state.concurrency) == (0.5, 1)
    assert state.faster_steps == 1


def test_custom_delay_factor_and_min_delay() -> None:
    state = fresh(delay=1.0, delay_factor=0.8, min_delay=0.7)
    end = window(state, 0.0, latency=0.01)
    state.roll(end)
    assert state.delay == pytest.approx(0.8)
    end = window(state, end, latency=0.01)
    state.roll(end)
    assert state.delay == 0.7  # not 0.64


@pytest.mark.parametrize(
    ("target", "triggers"), [((1.0, 1.0), 1), ((1.0, 3.0), 1), ((1.0, 3.0), 3)]
)
def test_window_within_target_holds(target: tuple[float, float], triggers: int) -> None:
    state = fresh(delay=1.0, target=target)
    end = window(state, 0.0, triggers=triggers)
    assert state.roll(end) == 0
    assert (state.delay, state.concurrency) == (1.0, 1)
    assert state.slower_steps == 0


def test_trigger_above_target_undoes_the_last_step_at_once() -> None:
    state = fresh(delay=1.0)
    end = window(state, 0.0)
    state.roll(end)
    assert state.delay == 0.5
    assert state.trigger(end + 1.0) is True  # within the target: counted
    assert state.delay == 0.5
    assert state.trigger(end + 2.0) is True  # above it: handled gently
    assert state.delay == 1.0
    assert state.too_fast_delay == 0.5
    assert state.slower_steps == 1
    # The slower step starts a new window, at the new rate.
    assert (state.window_start, state.triggers) == (end + 2.0, 0)


def test_upper_bound_of_a_range_target_is_used() -> None:
    state = fresh(delay=1.0, target=(1.0, 3.0))
    end = window(state, 0.0)
    state.roll(end)
    for index in range(3):
        state.trigger(end + index)
    assert state.delay == 0.5
    state.trigger(end + 3)
    assert state.delay == 1.0


def test_exponential_mode_hands_the_step_back_to_backoff() -> None:
    state = fresh(delay=1.0, gentle=False)
    assert state.trigger(1.0) is True
    assert state.trigger(2.0) is False
    assert state.delay == 1.0
    assert state.slower_steps == 0


def test_too_fast_from_the_start_slows_from_the_rate_reached() -> None:
    state = fresh(delay=0.0)
    window(state, 0.0, sends=20, latency=0.02, delay_held=False, concurrency_held=True)
    state.trigger(9.0)
    assert state.delay == 0.0
    state.trigger(9.5)
    # 20 requests of 0.02 s one at a time: one request per 0.02 s was too
    # fast; half that rate is the new start.
    assert state.delay == pytest.approx(0.04)
    assert state.too_fast_delay == pytest.approx(0.02)


def test_nothing_to_slow_down_falls_back_to_backoff() -> None:
    state = fresh(delay=0.0)
    state.trigger(1.0)
    assert state.trigger(2.0) is False  # no latency, no delay, at the floor


def test_triggers_right_after_a_slower_step_are_not_counted() -> None:
    state = fresh(delay=1.0)
    end = window(state, 0.0, latency=0.5)
    state.roll(end)
    state.trigger(end + 1.0)
    state.trigger(end + 2.0)  # slower step; latency ~0.5 s
    assert state.slower_steps == 1
    state.trigger(end + 2.1)  # sent before the step
    assert state.triggers == 0
    state.trigger(end + 3.0)
    assert state.triggers == 1


def test_server_holds_do_not_count_in_the_window() -> None:
    """A Retry-After as long as the window must not make every window hold
    exactly one trigger: the window counts sending time only."""
    state = fresh(delay=0.1)
    state.trigger(3.0)
    state.pause(3.0, 3.0 + WINDOW)  # Retry-After: one whole window
    state.pause(4.0, 5.0)  # already covered
    assert state.window_start == WINDOW
    assert state.roll(WINDOW * 1.5) == 0  # the window is not over
    state.trigger(WINDOW * 1.6)  # so this is its second trigger: too many
    assert state.slower_steps == 1
    assert state.delay == pytest.approx(0.2)
    # The new window starts after the new hold.
    state.pause(WINDOW * 1.6, WINDOW * 1.7)
    assert state.window_start == pytest.approx(WINDOW * 1.7)


# -- idle and untested windows --------------------------------------------------


def test_idle_window_takes_no_step() -> None:
    state = fresh(delay=1.0)
    assert state.roll(WINDOW) == 0
    assert state.delay == 1.0


def test_window_that_never_held_a_request_takes_no_step() -> None:
    state = fresh(delay=1.0)
    end = window(state, 0.0, delay_held=False, concurrency_held=False)
    assert state.roll(end) == 0
    assert state.delay == 1.0


def test_idle_windows_are_skipped_not_caught_up() -> None:
    state = fresh(delay=1.0)
    window(state, 0.0)
    assert state.roll(WINDOW * 10.5) == 1  # one step for the busy window
    assert state.delay == 0.5
    assert state.window_start == WINDOW * 10
    assert state.roll(WINDOW * 11) == 0  # the window after the idle ones


# -- delay, then concurrency ------------------------------------------------------


def test_default_settings_reach_concurrency_above_the_floor() -> None:
    """With min_delay 0 the pull request halved the delay forever; here the
    delay stops once it no longer limits (latency / concurrency)."""
    state = fresh(delay=1.0)
    start = 0.0
    for _ in range(12):
        limited_by_delay = state.delay * state.concurrency > 0.2 * 1.01
        start = window(
            state,
            start,
            latency=0.2,
            delay_held=limited_by_delay,
            concurrency_held=not limited_by_delay,
        )
        state.roll(start)
    assert state.concurrency > 4
    # The delay never went far below what the concurrency allows anyway.
    assert state.delay >= 0.2 / state.concurrency / 2


def test_concurrency_rises_only_when_it_held_requests() -> None:
    state = fresh(delay=0.0)
    end = window(state, 0.0, delay_held=True, concurrency_held=False)
    state.roll(end)
    assert (state.delay, state.concurrency) == (0.0, 1)
    end = window(state, end, delay_held=False, concurrency_held=True)
    state.roll(end)
    assert state.concurrency == 2


def test_concurrency_never_above_the_ceiling() -> None:
    state = fresh(delay=0.0, max_concurrency=3)
    start = 0.0
    for _ in range(6):
        start = window(state, start, delay_held=False, concurrency_held=True)
        state.roll(start)
    assert state.concurrency == 3


def test_raising_concurrency_lowers_the_delay_to_make_the_slot_usable() -> None:
    state = fresh(delay=0.1)
    # latency 0.2 s per request: a delay of 0.1 s is not the bottleneck.
    end = window(state, 0.0, latency=0.2, delay_held=False, concurrency_held=True)
    state.roll(end)
    assert state.concurrency == 2
    assert state.delay == pytest.approx(0.1)  # 0.2 / 2
    end = window(state, end, latency=0.2, delay_held=False, concurrency_held=True)
    state.roll(end)
    assert state.concurrency == 3
    assert state.delay == pytest.approx(0.2 / 3)


# -- the search --------------------------------------------------------------------


def test_faster_steps_bisect_toward_a_known_too_fast_delay() -> None:
    state = fresh(delay=1.0)
    end = window(state, 0.0, latency=0.01)
    state.roll(end)  # 0.5
    state.trigger(end + 1)
    state.trigger(end + 2)  # back to 1.0, 0.5 is too fast
    end = window(state, end + 2, latency=0.01)
    state.roll(end)
    assert state.delay == pytest.approx(math.sqrt(0.5))


@pytest.mark.parametrize(
    ("target", "kept_with"), [((1.0, 1.0), 0), ((1.0, 3.0), 2), ((0.5, 0.5), 0)]
)
def test_step_toward_a_pace_found_too_fast_must_stay_below_the_top(
    target: tuple[float, float], kept_with: int
) -> None:
    """A free step is kept with up to ``high`` triggers in its window; a step
    toward a pace already found too fast (bisection, probe) is tentative and
    is undone by the trigger that reaches ``high``."""
    state = fresh(delay=1.0, target=target)
    end = window(state, 0.0, latency=0.01)
    state.roll(end)  # a free step: 0.5
    for index in range(int(target[1])):
        state.trigger(end + index)
    assert state.delay == 0.5  # within the target: kept
    state.trigger(end + 5)  # above it: undone
    assert (state.delay, state.too_fast_delay) == (1.0, 0.5)
    end = window(state, end + 5, latency=0.01)
    state.roll(end)
    assert state.delay == pytest.approx(math.sqrt(0.5))  # tentative
    for index in range(kept_with):
        state.trigger(end + index)
    assert state.delay == pytest.approx(math.sqrt(0.5))
    state.trigger(end + 5)
    assert state.delay == 1.0
    assert state.too_fast_delay == pytest.approx(math.sqrt(0.5))


def test_known_limit_is_probed_with_growing_patience() -> None:
    state = fresh(delay=1.0, finest_factor=0.95)
    state.too_fast_delay = 0.97  # within finest_factor (0.95) of the delay
    start = 0.0

    def quiet() -> None:
        nonlocal start
        start = window(state, start, latency=0.01)
        state.roll(start)

    quiet()
    assert state.delay == pytest.approx(0.95)  # first probe at once
    state.trigger(start + 1)  # the probe failed (one trigger is enough)
    start += 1
    assert state.delay == 1.0
    quiet()
    assert state.delay == 1.0  # patience: one quiet window held
    quiet()
    assert state.delay == pytest.approx(0.95)  # then the next probe


@pytest.mark.parametrize("delay", [0.0199, 0.0213, 0.3, 1.7, 4.1])
def test_a_failed_probe_is_not_probed_again_at_once(delay: float) -> None:
    """Whatever the rounding of ``delay * finest_factor``, a probe of one
    finest step that failed closes the bracket: the next quiet window holds."""
    state = fresh(delay=delay, finest_factor=0.95)
    end = window(state, 0.0, latency=0.0001)
    state.too_fast_delay = delay * 0.96  # within finest_factor: probe due
    state.roll(end)
    probe = state.delay
    assert probe == pytest.approx(delay * 0.95)
    state.trigger(end + 1)
    assert state.delay == delay
    assert state.too_fast_delay == probe
    end = window(state, end + 1, latency=0.0001)
    state.roll(end)
    assert state.delay == delay


def test_rebase_from_outside_forgets_the_history() -> None:
    state = fresh(delay=1.0)
    end = window(state, 0.0)
    state.roll(end)
    state.set_delay(2.0)
    state.trigger(end + 1)
    state.trigger(end + 2)
    assert state.delay == 4.0  # no step to undo: twice the delay
    state.set_concurrency(100)
    assert state.concurrency == 100


def test_delay_floor_is_respected() -> None:
    state = fresh(delay=1.0)
    state.delay_floor = 0.8
    end = window(state, 0.0, latency=0.01)
    state.roll(end)
    assert state.delay == 0.8


# -- convergence ----------------------------------------------------------------------


@dataclass
class Outcome:
    ok: list[float] = field(default_factory=list)
    rejected: list[float] = field(default_factory=list)

    def rate(self, since: float, until: float) -> float:
        return sum(since <= t < until for t in self.ok) / (until - since)

    def rejected_per_window(self, since: float, until: float) -> list[int]:
        counts = [0] * int((until - since) // WINDOW)
        for t in self.rejected:
            if since <= t < since + len(counts) * WINDOW:
                counts[int((t - since) // WINDOW)] += 1
        return counts


def simulate(
    policy: RampupPolicy,
    *,
    seconds: float,
    latency: float,
    rate: float | None = None,
    max_in_flight: int | None = None,
    retry_after: float | None = None,
) -> tuple[RampupState, Outcome]:
    """An event-driven scope with an endless backlog in front of a server that
    rejects requests past *rate* per sliding second or past *max_in_flight*
    at once (rejections are answered at once, with *retry_after*)."""
    state = RampupState(policy, delay=0.0)
    outcome = Outcome()
    in_flight: list[tuple[float, int, bool]] = []
    admitted: deque[float] = deque()
    served = 0
    next_allowed = hold_until = now = 0.0
    sequence = 0
    while now < seconds:
        while in_flight and in_flight[0][0] <= now:
            done_at, _, rejected = heapq.heappop(in_flight)
            if rejected:
                outcome.rejected.append(done_at)
                assert state.trigger(done_at)
                if retry_after:
                    hold_until = max(hold_until, done_at + retry_after)
                    state.pause(done_at, hold_until)
            else:
                served -= 1
                outcome.ok.append(done_at)
            state.observe_done(done_at, len(in_flight))
        state.roll(now)
        delay_held = next_allowed > now >= hold_until
        concurrency_held = len(in_flight) >= state.concurrency
        if delay_held or concurrency_held or hold_until > now:
            if delay_held or concurrency_held:
                state.observe_hold(now, delay=delay_held, concurrency=concurrency_held)
            events = [in_flight[0][0]] if in_flight else []
            if not concurrency_held:
                events.append(max(next_allowed, hold_until))
            now = max(now, min(events))
            continue
        while admitted and admitted[0] <= now - 1.0:
            admitted.popleft()
        rejected = (rate is not None and len(admitted) >= rate) or (
            max_in_flight is not None and served >= max_in_flight
        )
        if not rejected:
            admitted.append(now)
            served += 1
        sequence += 1
        heapq.heappush(
            in_flight, (now + (0.001 if rejected else latency), sequence, rejected)
        )
        state.observe_send(now, len(in_flight))
        next_allowed = now + state.delay
    return state, outcome


def test_converges_under_a_rate_limit() -> None:
    """50 requests/s allowed, 429 + Retry-After: 1 past that: rampup settles
    above 0.9 of the limit with about the target of 429s per window."""
    policy = RampupPolicy(window=WINDOW, max_concurrency=16)
    state, outcome = simulate(
        policy, seconds=400.0, latency=0.015, rate=50, retry_after=1.0
    )
    assert outcome.rate(200.0, 400.0) >= 0.9 * 50
    per_window = outcome.rejected_per_window(200.0, 400.0)
    assert sum(per_window) / len(per_window) <= 1.0
    assert state.concurrency == 1  # one request at a time already reaches 50/s


def test_converges_under_a_concurrency_limit() -> None:
    """A server that serves 4 requests at once and rejects the 5th: rampup
    raises the concurrency to about 4, never to the ceiling."""
    policy = RampupPolicy(window=WINDOW, max_concurrency=32)
    state, outcome = simulate(policy, seconds=600.0, latency=0.1, max_in_flight=4)
    assert 3 <= state.concurrency <= 5
    assert outcome.rate(300.0, 600.0) >= 0.8 * 40
    per_window = outcome.rejected_per_window(300.0, 600.0)
    assert sum(per_window) / len(per_window) <= 2.0
