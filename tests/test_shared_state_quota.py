"""Quota windows shared across processes (issue 13).

Component tests: two :class:`SharedState` objects on one real
``redis-server`` stand for two crawler processes spending one quota. Then
real crawls: 3 processes with a quota of N per window on one host, shared
and independent, counted at the server.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from tests.quota_report_manager import ACTUAL_COST
from tests.test_shared_state import make_state
from tests.test_shared_state_crawl import assert_each_page_once, crawl_together


@pytest.fixture
def prefix() -> str:
    return f"quota-{uuid.uuid4().hex[:8]}"


def spend(state, amount, quota=5.0, window=1.0):
    """Check a send of scope ``api`` consuming *amount*; claim it if
    allowed. Returns the wait (0.0: sent)."""
    wait, blocked = state.check([("api", None, 0, 0.0)], [(quota, window, amount)])
    assert blocked is None
    if wait == 0:
        state.claim(object(), ["api"])
    return wait


def test_processes_spend_one_window(redis_server, prefix):
    first = make_state(redis_server, prefix)
    second = make_state(redis_server, prefix)
    assert spend(first, 2.0) == 0.0
    assert spend(first, 1.0) == 0.0
    assert spend(second, 2.0) == 0.0  # 5 of 5
    # Neither may spend more in this window: it ends one window after the
    # first use.
    wait = spend(second, 1.0)
    assert 0.9 < wait <= 1.0
    assert 0.9 < spend(first, 0.5) <= 1.0
    # A request without an amount consumes nothing.
    assert spend(first, None) == 0.0
    client = redis_server.client()
    assert float(client.hget(f"{prefix}:quota:api", "consumed")) == 5.0
    assert 0 < client.pttl(f"{prefix}:quota:api") <= 2_000
    time.sleep(wait)
    # The next window: spent again from zero, by either process.
    assert spend(second, 4.0) == 0.0
    assert 0 < spend(first, 2.0) <= 1.0


def test_a_request_larger_than_the_quota_goes_in_an_unused_window(redis_server, prefix):
    state = make_state(redis_server, prefix)
    assert spend(state, 7.0) == 0.0  # nothing consumed yet: never waits forever
    assert spend(state, 1.0) > 0.9


def test_a_refused_check_spends_nothing(redis_server, prefix):
    first = make_state(redis_server, prefix)
    second = make_state(redis_server, prefix)
    assert spend(first, 1.0) == 0.0
    # Held back by another gate (a hold): the quota is not spent.
    second.hold("api", 0.5)
    assert spend(second, 3.0) > 0
    assert spend(first, 4.0, window=1.0) > 0  # held too
    time.sleep(0.5)
    assert spend(first, 4.0) == 0.0  # 5 of 5: the held check spent nothing


def consumed(redis_server, prefix) -> float:
    return float(redis_server.client().hget(f"{prefix}:quota:api", "consumed"))


def test_a_reported_consumption_corrects_every_process_window(redis_server, prefix):
    first = make_state(redis_server, prefix)
    second = make_state(redis_server, prefix)
    assert spend(first, 1.0) == 0.0
    # The answer says the call cost 3 units, not the 1 estimated: the
    # window every process spends from counts 3.
    first.reconcile_quota("api", (5.0, 1.0), 2.0, None)
    assert consumed(redis_server, prefix) == 3.0
    assert spend(second, 2.0) == 0.0  # 5 of 5
    assert spend(second, 1.0) > 0.9
    # A negative difference gives units back, never below nothing.
    second.reconcile_quota("api", (5.0, 1.0), -4.0, None)
    assert consumed(redis_server, prefix) == 1.0
    second.reconcile_quota("api", (5.0, 1.0), -4.0, None)
    assert consumed(redis_server, prefix) == 0.0
    assert spend(first, 4.0) == 0.0


def test_a_reported_remaining_wins_and_holds_every_process(redis_server, prefix):
    first = make_state(redis_server, prefix)
    second = make_state(redis_server, prefix)
    assert spend(first, 1.0) == 0.0
    # The server says nothing is left: no process sends in this window,
    # whatever the difference says.
    first.reconcile_quota("api", (5.0, 1.0), -1.0, 0.0)
    assert consumed(redis_server, prefix) == 5.0
    assert 0.9 < spend(second, 1.0) <= 1.0
    assert 0.9 < spend(first, 1.0) <= 1.0


def test_a_report_in_an_unused_window_starts_it(redis_server, prefix):
    state = make_state(redis_server, prefix)
    # The first word on a quota may come from the server (a crawl that
    # resumes): a reported exhaustion starts a window, so it expires.
    state.reconcile_quota("api", (5.0, 0.5), None, 0.0)
    assert 0.4 < spend(state, 1.0, window=0.5) <= 0.5
    assert 0 < redis_server.client().pttl(f"{prefix}:quota:api") <= 1_500
    time.sleep(0.5)
    assert spend(state, 1.0, window=0.5) == 0.0


def test_a_report_after_the_window_ended_corrects_the_next(redis_server, prefix):
    state = make_state(redis_server, prefix)
    assert spend(state, 5.0, window=0.3) == 0.0
    time.sleep(0.35)
    # As QuotaWindow.reconcile: the window rolls first, so the report
    # counts in the window it arrives in.
    state.reconcile_quota("api", (5.0, 0.3), 2.0, None)
    assert consumed(redis_server, prefix) == 2.0
    assert spend(state, 3.0, window=0.3) == 0.0
    assert spend(state, 1.0, window=0.3) > 0


@pytest.mark.parametrize(
    ("difference", "remaining"),
    [(float("nan"), None), (None, float("inf")), (None, None), (float("inf"), None)],
)
def test_a_report_that_is_not_a_number_changes_nothing(
    redis_server, prefix, difference, remaining
):
    state = make_state(redis_server, prefix)
    assert spend(state, 2.0) == 0.0
    state.reconcile_quota("api", (5.0, 1.0), difference, remaining)
    assert consumed(redis_server, prefix) == 2.0


# -- real crawls ------------------------------------------------------------

QUOTA = 10
WINDOW = 2.0
PAGES = 20
PROCESSES = 3


def crawl_quota(simhosts, redis_url, reactor):
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.01})
    netloc = hosts.netloc("A")
    crawl_together(
        hosts,
        PROCESSES,
        PAGES,
        redis_url=redis_url,
        reactor=reactor,
        # One unit a request (the redirects' targets too: they keep the meta).
        metas=[{"throttling_scopes": {netloc: 1.0}}] * PAGES,
        timeout=120,
        THROTTLING_SCOPES={netloc: {"quota": QUOTA, "window": WINDOW}},
        THROTTLING_STATE_PROCESSES=PROCESSES,
    )
    stats = hosts.stats("A")
    assert_each_page_once(stats, PROCESSES * PAGES)
    return stats


def per_window(stats: dict[str, Any], window: float = WINDOW) -> list[int]:
    """Requests at the server per quota window. A window's requests go at
    its start (the quota is spent in a burst, then everyone waits for the
    next window), so the windows are counted between the middles of the
    windows that the first arrival started: a burst at a boundary, seen a
    few milliseconds early or late at the server, stays in its window."""
    times = sorted(record[0] for record in stats["arrivals"])
    first = times[0]
    counts: dict[int, int] = {}
    for arrival in times:
        index = int((arrival - first + window / 2) // window)
        counts[index] = counts.get(index, 0) + 1
    return [counts.get(index, 0) for index in range(max(counts) + 1)]


@pytest.mark.parametrize("reactor", ["asyncio", "epoll"])
def test_processes_share_a_quota_window(simhosts, redis_server, reactor):
    shared = per_window(crawl_quota(simhosts, redis_server.url, reactor))
    independent = per_window(crawl_quota(simhosts, None, reactor))
    print("requests per window: shared", shared, "independent", independent)
    # 66 requests (60 pages, 6 redirects), at most QUOTA per window in all.
    assert sum(shared) == PROCESSES * (PAGES + PAGES // 10)
    assert max(shared) <= QUOTA
    # Each process spends a window of its own without the shared state.
    assert max(independent) > QUOTA


# A quota whose real use is only known from each answer: every request is
# estimated at 1 unit and reported as costing 3 (tests/quota_report_manager.py).
# One request at a time across the processes (a shared concurrency of 1), so
# that each report reaches the window before the next send is admitted:
# QUOTA_REPORTED / 3 = 2 requests a window fit the quota.
QUOTA_REPORTED = 6
WINDOW_REPORTED = 0.5
PAGES_REPORTED = 8  # one of them through a redirect (page 5)


@pytest.mark.parametrize("reactor", ["asyncio", "epoll"])
def test_a_reported_consumption_holds_every_process(simhosts, redis_server, reactor):
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.01})
    netloc = hosts.netloc("A")
    crawl_together(
        hosts,
        PROCESSES,
        PAGES_REPORTED,
        redis_url=redis_server.url,
        reactor=reactor,
        metas=[{"throttling_scopes": {netloc: 1.0}}] * PAGES_REPORTED,
        timeout=120,
        THROTTLING_MANAGER="tests.quota_report_manager.CostReportingManager",
        THROTTLING_SCOPES={
            netloc: {
                "concurrency": 1,
                "quota": QUOTA_REPORTED,
                "window": WINDOW_REPORTED,
            }
        },
        THROTTLING_STATE_PROCESSES=PROCESSES,
    )
    stats = hosts.stats("A")
    assert_each_page_once(stats, PROCESSES * PAGES_REPORTED)
    windows = per_window(stats, WINDOW_REPORTED)
    print("requests per window", windows)
    assert sum(windows) == PROCESSES * (PAGES_REPORTED + 1)
    # Each process's reports reach the window every process spends from.
    # Counted in its own window only, they would let each process send 2
    # of its own per window (up to 6 in all, 18 units; 4-5 seen). One
    # report may still be on its way when the next send is checked: one
    # request more.
    assert max(windows) * ACTUAL_COST <= QUOTA_REPORTED + ACTUAL_COST
