"""The pace learned from 429s, one pace across processes (issue 13).

Component tests: two :class:`SharedState` objects on one real
``redis-server`` stand for two crawler processes, each with a real scope
(a :class:`ThrottlingScopeManager` built from a crawler) whose pace is
shared. Then real crawls: 3 processes against a rate-limited API, shared
and independent, read at the server.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from scrapy import Spider
from scrapy.utils.test import get_crawler

from scrapy_adaptive_throttle import ThrottlingScopeManager
from tests.test_shared_state import make_state
from tests.test_shared_state_crawl import assert_each_page_once, crawl_together


class Process:
    """One crawler process's shared state and its scope ``api``."""

    def __init__(self, server: Any, prefix: str, *, processes: int = 1) -> None:
        self.state = make_state(server, prefix, processes=processes)
        crawler = get_crawler(Spider, {"THROTTLING_STATE_URL": server.url})
        self.state.paces.install(crawler)
        self.manager = ThrottlingScopeManager(crawler, {"id": "api"})
        self.scope = self.manager.scope
        self.sent: list[float] = []

    def send(self) -> float:
        """Check a send of ``api``; send it (claim, record) if allowed.
        Returns the wait (0.0: sent)."""
        scope = self.scope
        spacing = scope.next_spacing()
        wait, blocked = self.state.check(
            [("api", None, scope.counters.in_flight, spacing)]
        )
        assert blocked is None
        if wait > 0:
            return wait
        now = time.monotonic()
        self.state.claim(object(), ["api"], sent_at=now)  # type: ignore[arg-type]
        scope.record_sent(now)
        self.sent.append(now)
        return 0.0

    def refused(self, *, again: bool = False) -> None:
        """A 429 for this process's last send (*again*: a retry of a request
        refused before)."""
        self.scope.record_rate_limited(
            time.monotonic(), self.sent[-1], refused_before=again
        )

    def start_the_count(self) -> None:
        """The scope's first 429 (which only starts the count of sends a
        later one learns from), then a new episode."""
        self.send()
        self.refused()
        time.sleep(1.05)


def test_the_first_refusal_of_a_scope_only_starts_the_count(redis_server, prefix):
    """As in one process: one 429 (of one page, or at a crawl's start) sets
    no pace; the next episode learns from every process's sends since."""
    first, second = Process(redis_server, prefix), Process(redis_server, prefix)
    for _ in range(5):
        first.send()
        second.send()
    first.refused()
    assert first.scope.learned is not None
    assert first.scope.learned.interval == 0.0
    assert first.scope.learned.refusal_count == 1
    client = redis_server.client()
    assert client.get(f"{prefix}:pace:api") is None
    assert 3_500_000 < client.pttl(f"{prefix}:counted:api") <= 3_600_000
    second.send()  # no pace to take over
    assert second.scope.learned is None
    time.sleep(1.05)  # a new episode
    for _ in range(3):
        first.send()
        second.send()
    second.refused()
    learned = second.scope.learned
    assert learned is not None
    # Both processes' 5 sends before the refused one (the second's last);
    # the first refusal is more than a second older, so not subtracted.
    assert learned.accepted == 5
    assert learned.interval == pytest.approx(1.02 / 5)
    first.send()
    assert first.scope.learned.interval == learned.interval


def test_a_retry_refused_again_is_counted_not_learned_from(redis_server, prefix):
    """As in one process: the 429 of a request refused before (a page the
    server always refuses) neither learns nor claims its episode, and the
    next refusal, of any process, learns with it taken out of the count."""
    first, second = Process(redis_server, prefix), Process(redis_server, prefix)
    first.start_the_count()
    for _ in range(5):
        first.send()
        second.send()
    first.refused(again=True)
    assert first.scope.learned is not None
    assert first.scope.learned.interval == 0.0
    assert redis_server.client().get(f"{prefix}:pace:api") is None
    second.refused()
    learned = second.scope.learned
    assert learned is not None
    # The 9 sends before the second's last, minus the retry's refusal.
    assert learned.accepted == 8
    assert learned.interval == pytest.approx(1.02 / 8)
    first.send()
    assert first.scope.learned.interval == learned.interval


@pytest.fixture
def prefix() -> str:
    return f"pace-{uuid.uuid4().hex[:8]}"


def test_a_refusal_learns_from_every_process_sends(redis_server, prefix):
    first, second = Process(redis_server, prefix), Process(redis_server, prefix)
    first.start_the_count()
    for _ in range(6):
        assert first.send() == 0.0
    for _ in range(4):
        assert second.send() == 0.0
    second.refused()
    learned = second.scope.learned
    assert learned is not None
    # The 9 sends of both processes before the refused one, not the 3 of
    # the refused process (its share at that moment).
    assert learned.accepted == 9
    assert learned.interval == pytest.approx(1.02 / 9)
    # The other process takes the pace over with its next check.
    assert first.scope.learned is not None
    assert first.scope.learned.interval == 0.0
    first.send()
    assert first.scope.learned is not None
    assert first.scope.learned.interval == learned.interval
    assert first.scope.learned.accepted == 9


def test_one_process_learns_per_episode(redis_server, prefix):
    first, second = Process(redis_server, prefix), Process(redis_server, prefix)
    first.start_the_count()
    for _ in range(5):
        first.send()
        second.send()
    first.refused()
    learned = first.scope.learned
    assert learned is not None
    interval = learned.interval
    # The other process's refusal of the same episode is counted only: it
    # neither learns from its own count nor publishes.
    second.refused()
    assert second.scope.learned is not None
    assert second.scope.learned.refusal_count == 1
    assert second.scope.learned.interval == 0.0
    second.send()  # the check brings the pace learned by the first
    assert second.scope.learned.interval == interval
    client = redis_server.client()
    # Both refusals of this episode, and the first one (kept 2 s).
    assert client.zcard(f"{prefix}:refused:api") == 3
    assert 0 < client.pttl(f"{prefix}:pace:api") <= 3_600_000


def test_the_pace_spaces_the_sends_of_every_process(redis_server, prefix):
    first, second = Process(redis_server, prefix), Process(redis_server, prefix)
    first.start_the_count()
    for _ in range(10):
        first.send()
    first.refused()  # 9 accepted: one send per 1.02 / 9 = 0.113 s
    interval = 1.02 / 9
    time.sleep(0.15)
    assert second.send() == 0.0  # takes the pace over (and sends)
    assert second.scope.learned is not None
    time.sleep(0.15)
    assert first.send() == 0.0
    # The second process may send one interval after the first's send, not
    # before (its own last send was long ago: its own gate is open).
    wait = second.send()
    assert interval * 0.8 < wait <= interval
    time.sleep(wait)
    assert second.send() == 0.0
    assert 0 < first.send() <= interval
    # Sends over 1 s, both processes trying all the time: one pace, not two.
    start = time.monotonic()
    counts = [len(first.sent), len(second.sent)]
    while time.monotonic() - start < 1.0:
        for process in (first, second):
            process.send()
        time.sleep(0.002)
    sent = len(first.sent) + len(second.sent) - sum(counts)
    assert 8 <= sent <= 10, sent


def test_without_redis_each_process_keeps_its_share(own_redis_server, prefix):
    process = Process(own_redis_server, prefix, processes=2)
    process.start_the_count()
    for _ in range(10):
        process.send()
    process.refused()
    learned = process.scope.learned
    assert learned is not None
    interval = learned.interval
    own_redis_server.stop()
    # The check fails: the fallback allows the send, paced at this
    # process's share: one send per 2 intervals.
    assert process.send() == 0.0
    assert not process.state.sharing
    assert process.scope.gate.next_send_at == pytest.approx(
        process.sent[-1] + 2 * interval
    )
    # A refusal now is learned from this process's own sends, as without
    # sharing: refused at the learned pace, it slows by the margin (an echo
    # would leave the interval as it is). This process counts its sends
    # since its first refusal (the scope had no pace before).
    for _ in range(4):
        process.send()
    process.scope.record_rate_limited(process.sent[-1] + 1.5, process.sent[-1])
    assert learned.refusal_count == 3  # with the one that started the count
    assert learned.interval == pytest.approx(interval * 1.02)


# -- real crawls ------------------------------------------------------------

RATE = 30
PAGES = 150
PROCESSES = 3


def crawl_api(simhosts, redis_url, reactor, pages=PAGES):
    hosts = simhosts(
        {
            "name": "A",
            "kind": "ratelimit",
            "rate": RATE,
            "service_time": 0.01,
            "retry_after": 1,
        }
    )
    crawl_together(
        hosts,
        PROCESSES,
        pages,
        redis_url=redis_url,
        reactor=reactor,
        timeout=180,
        THROTTLING_SCOPES={},
        THROTTLING_STATE_PROCESSES=PROCESSES,
        CONCURRENT_REQUESTS_PER_DOMAIN=32,
        RETRY_TIMES=100,
    )
    stats = hosts.stats("A")
    # Every page served once (a refused one is retried until it is).
    assert_each_page_once(stats, PROCESSES * pages, status=200)
    return stats


def converged(stats: dict[str, Any], after: float = 5.0) -> tuple[float, int]:
    """Requests/s the API accepted (every answer but a 429: pages and the
    redirects to them count alike against its limit) and 429s, at the
    server, from *after* seconds of server time to the last answer."""
    arrivals = stats["arrivals"]
    late = [record for record in arrivals if record[0] >= after]
    served = [record[0] for record in late if record[3] != 429]
    refused = sum(1 for record in late if record[3] == 429)
    return len(served) / (max(served) - after), refused


@pytest.mark.parametrize("reactor", ["asyncio", "epoll"])
def test_processes_keep_one_pace_under_the_api_limit(simhosts, redis_server, reactor):
    shared = crawl_api(simhosts, redis_server.url, reactor)
    rate, refused = converged(shared)
    # The control crawls half the pages: 3 processes learning alone reach
    # 0.23-0.69 R, so its 3 x 150 pages took about 20-170 s of the suite's time;
    # 3 x 75 still run 5-30 s past the 5 s the rate is measured after.
    independent = crawl_api(simhosts, None, reactor, pages=PAGES // 2)
    alone_rate, alone_refused = converged(independent)
    print(
        f"after 5 s: shared {rate / RATE:.2f} R, {refused} 429s; "
        f"independent {alone_rate / RATE:.2f} R, {alone_refused} 429s"
    )
    # One pace, learned from every process's sends: close to the limit
    # (0.76-0.95 R in the first runs, on a machine loaded by other crawls;
    # the figure is the benchmark's, bench/RESULTS.md)...
    assert rate >= 0.7 * RATE
    # ...with at most a probe's or an edge count's refusals.
    assert refused <= 2 * PROCESSES
    # Each process on its own learns its share at its first refusal.
    assert alone_rate < rate
