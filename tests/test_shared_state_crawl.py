"""Several real Scrapy processes sharing one host's limits through Redis.

Each test starts 2-3 crawler processes (``python -m tests.crawl_process``,
as subprocesses, on the asyncio or the EPoll reactor) against one simulated
host and a real ``redis-server``, and checks at the server (requests in
service, every page's arrivals) what the processes did together:

* with :setting:`THROTTLING_STATE_URL`, a scope concurrency of 4 holds
  across all processes, and without it each process has its own 4 (the
  control run, which proves the check can fail);
* a scope delay of 50 ms spaces the sends of all processes together, each
  having its share of them (and without Redis, each process only its own);
* a process killed with SIGKILL mid-crawl: the others finish, and once its
  leases expire (``DOWNLOAD_TIMEOUT`` + 5 s) they use the whole limit again;
* Redis stopped and restarted mid-crawl: every page is fetched once, each
  process logs the loss once (a warning) and the recovery.

Pages are yielded from the callback of an index page (``PagesSpider``'s
``follow`` mode) and a few of them redirect, so the requests come from
callbacks and from the redirect middleware, not only from the start.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.engine_crawls import ADDON, ROOT
from tests.server_checks import max_in_service, service_intervals

LIMIT = 4
PLAIN_SCOPE_MANAGER = "scrapy_adaptive_throttle.ThrottlingScopeManager"
_EPOLL = "twisted.internet.epollreactor.EPollReactor"


def process_config(
    hosts: Any,
    process: int,
    pages: int,
    *,
    redis_url: str | None,
    prefix: str,
    reactor: str = "asyncio",
    **settings: Any,
) -> dict[str, Any]:
    """The crawl of one process: *pages* pages of its own on host A, every
    tenth of them reached through a redirect."""
    urls = []
    for index in range(pages):
        url = hosts.url("A", f"/p{process}/page/{index}")
        if index % 10 == 5:
            url = hosts.url("A", f"/p{process}/moved/{index}?redirect={quote(url)}")
        urls.append(url)
    crawl_settings: dict[str, Any] = {
        "ADDONS": ADDON,
        "CONCURRENT_REQUESTS": 16,
        "THROTTLING_SCOPES": {hosts.netloc("A"): {"concurrency": LIMIT}},
        "THROTTLING_STATE_PREFIX": prefix,
        "DOWNLOAD_TIMEOUT": 5,
        "SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue",
        **settings,
    }
    if redis_url is not None:
        crawl_settings["THROTTLING_STATE_URL"] = redis_url
    if reactor == "epoll":
        crawl_settings["TWISTED_REACTOR"] = _EPOLL
    return {"settings": crawl_settings, "urls": urls, "follow": True}


def together(
    hosts: Any,
    count: int,
    pages: int,
    *,
    redis_url: str | None,
    reactor: str,
    prefix: str | None = None,
    **settings: Any,
) -> list[dict[str, Any]]:
    """The configs of *count* processes crawling *pages* pages each of
    their own on host A (:func:`process_config`), under one key *prefix*
    (a fresh one by default)."""
    prefix = prefix or f"crawl-{uuid.uuid4().hex[:8]}"
    return [
        process_config(
            hosts,
            index,
            pages,
            redis_url=redis_url,
            prefix=prefix,
            reactor=reactor,
            **settings,
        )
        for index in range(count)
    ]


def assert_reactor(outcome: dict[str, Any], reactor: str) -> None:
    """The crawl ran on *reactor* ("asyncio" or "epoll")."""
    assert outcome["reactor"].endswith(
        "EPollReactor" if reactor == "epoll" else "AsyncioSelectorReactor"
    )


def start_process(config: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.crawl_process", json.dumps(config)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str], timeout: float = 60) -> dict[str, Any]:
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # A hung crawl: its log says where it stood.
        process.kill()
        _, stderr = process.communicate()
        raise AssertionError(
            f"the crawl did not end within {timeout} s; its log ends with:\n"
            + stderr[-3000:]
        ) from None
    assert process.returncode == 0, stderr[-3000:]
    outcome: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    outcome["log"] = stderr
    return outcome


def wait_for_arrivals(hosts: Any, count: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while len(hosts.stats("A")["arrivals"]) < count:
        assert time.monotonic() < deadline, "the crawl did not start"
        time.sleep(0.05)


def start_together(
    configs: list[dict[str, Any]], directory: Path, timeout: float = 60
) -> list[subprocess.Popen[str]]:
    """Start one crawl process per config and let them crawl only once all
    are set up: on a loaded machine one may take seconds longer to import
    Scrapy, and a test that acts mid-crawl must find every process crawling
    (one still starting when Redis goes away stops at its start-up check, as
    documented; one started early may be finished)."""
    go = directory / "go"
    ready = []
    processes = []
    for index, config in enumerate(configs):
        ready.append(directory / f"ready-{index}")
        config["barrier"] = {"ready": str(ready[-1]), "go": str(go)}
        processes.append(start_process(config))
    deadline = time.monotonic() + timeout
    while not all(path.exists() for path in ready):
        assert time.monotonic() < deadline, "a crawl process did not start"
        assert all(process.poll() is None for process in processes), [
            process.communicate()[1][-3000:] for process in processes
        ]
        time.sleep(0.02)
    go.touch()
    return processes


def page_arrivals(stats: dict[str, Any]) -> Counter[str]:
    """How many times each page (not counting redirecting URLs) arrived."""
    return Counter(
        record[1]
        for record in stats["arrivals"]
        if "/page/" in record[1].partition("?")[0]
    )


def assert_complete(outcome: dict[str, Any], pages: int) -> None:
    assert outcome["unanswered"] == []
    assert outcome["failures"] == []
    assert len(outcome["responses"]) == pages
    assert outcome["finish_reason"] == "finished"


#: The purposes of round trips to Redis (see ``SharedConnection._call``).
PURPOSES = {
    "check",
    "release",
    "refund",
    "reconcile",
    "hold",
    "resume",
    "lead",
    "publish",
    "resign",
    "refuse",
    "pace",
    "reconnect",
}


def crawl_together(
    hosts: Any,
    count: int,
    pages: int,
    *,
    redis_url: str | None,
    reactor: str = "asyncio",
    prefix: str | None = None,
    metas: list[dict[str, Any]] | None = None,
    timeout: float = 60,
    **settings: Any,
) -> list[dict[str, Any]]:
    """*count* processes (one key *prefix*, a fresh one by default) each
    crawling *pages* pages of their own on host A (:func:`process_config`,
    with *settings* and per-URL *metas*); every one must answer all its
    pages. Returns their outcomes."""
    processes = []
    configs = together(
        hosts,
        count,
        pages,
        redis_url=redis_url,
        reactor=reactor,
        prefix=prefix,
        **settings,
    )
    for config in configs:
        if metas is not None:
            config["metas"] = metas
        processes.append(start_process(config))
    outcomes = [finish(process, timeout=timeout) for process in processes]
    for outcome in outcomes:
        assert_complete(outcome, pages)
    return outcomes


def assert_each_page_once(
    stats: dict[str, Any], total: int, *, status: int | None = None
) -> None:
    """Each of the *total* pages arrived at the host exactly once (with
    *status*: answered with it exactly once, e.g. 200 where refusals are
    retried)."""
    if status is not None:
        stats = {"arrivals": [r for r in stats["arrivals"] if r[3] == status]}
    arrivals = page_arrivals(stats)
    assert set(arrivals.values()) == {1}
    assert len(arrivals) == total


@pytest.mark.parametrize("reactor", ["asyncio", "epoll"])
def test_limit_holds_across_processes(simhosts, redis_server, reactor):
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.05})
    pages = 40
    prefix = f"crawl-{uuid.uuid4().hex[:8]}"
    outcomes = crawl_together(
        hosts, 3, pages, redis_url=redis_server.url, reactor=reactor, prefix=prefix
    )
    for outcome in outcomes:
        assert outcome["stats"]["throttling/shared_state/command_count"] > 0
        # Every round trip is timed: more than nothing, less than the 1 s
        # socket timeout each (Redis answered every one).
        waited = outcome["stats"]["throttling/shared_state/command_seconds"]
        commands = outcome["stats"]["throttling/shared_state/command_count"]
        assert 0 < waited < commands * 1.0
        # Each round trip is counted once under its purpose; every send
        # was admitted by a check or took a lease handed on in this process.
        prefix = "throttling/shared_state/command_count/"
        purposes = {
            key[len(prefix) :]: value
            for key, value in outcome["stats"].items()
            if key.startswith(prefix)
        }
        assert sum(purposes.values()) == commands
        handed_on = outcome["stats"].get("throttling/shared_state/handover_count", 0)
        sent = outcome["stats"]["downloader/request_count"]
        assert purposes["check"] + handed_on >= sent
        assert set(purposes) <= PURPOSES
        assert_reactor(outcome, reactor)
    stats = hosts.stats("A")
    assert_each_page_once(stats, 3 * pages)
    peak = max_in_service([stats])
    # At most the shared limit, and the limit is used (not 1 per process).
    assert LIMIT - 1 <= peak <= LIMIT
    # Every lease was released: nothing holds the host after the crawl.
    client = redis_server.client()
    assert client.zcard(f"{prefix}:lease:{hosts.netloc('A')}") == 0


def test_without_shared_state_each_process_has_its_own_limit(simhosts):
    """The control: the same crawl without THROTTLING_STATE_URL exceeds the
    limit at the server, so the check above can fail."""
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.05})
    pages = 40
    crawl_together(hosts, 3, pages, redis_url=None)
    assert max_in_service([hosts.stats("A")]) > LIMIT


def test_sigkilled_process_does_not_hold_the_host(simhosts, redis_server):
    """A process holding every lease of the host is killed: the others wait
    for its leases to expire (they still count: the host may still be
    serving them), then crawl with the whole limit."""
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.05})
    pages = 40
    prefix = f"crawl-{uuid.uuid4().hex[:8]}"
    # Its pages take 1.5 s: it holds the host's 4 leases when killed. Its
    # leases live its DOWNLOAD_TIMEOUT + 5 s. A fixed limit: an adaptive one
    # is now one limit across processes (the killed one's slow answers would
    # lower it below 4, so it would not hold every lease).
    timeout = 2.0
    fixed = {"THROTTLING_SCOPE_MANAGER": PLAIN_SCOPE_MANAGER}
    slow = process_config(
        hosts,
        0,
        pages,
        redis_url=redis_server.url,
        prefix=prefix,
        DOWNLOAD_TIMEOUT=timeout,
        **fixed,
    )
    slow["urls"] = [
        f"{url}{'&' if '?' in url else '?'}delay=1.5" for url in slow["urls"]
    ]
    killed = start_process(slow)
    wait_for_arrivals(hosts, LIMIT)
    leased_at = time.time()
    survivors = [
        start_process(
            process_config(
                hosts, index, pages, redis_url=redis_server.url, prefix=prefix, **fixed
            )
        )
        for index in (1, 2)
    ]
    time.sleep(0.3)
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=10)  # closes its pipes
    outcomes = [finish(process) for process in survivors]
    for outcome in outcomes:
        assert_complete(outcome, pages)
    stats = hosts.stats("A")
    arrivals = page_arrivals(stats)
    for index in (1, 2):
        assert all(arrivals[f"/p{index}/page/{page}"] == 1 for page in range(pages))
    assert max_in_service([stats]) <= LIMIT
    survivor_intervals = [
        interval
        for interval, record in zip(
            service_intervals(stats), stats["arrivals"], strict=True
        )
        if not record[1].startswith("/p0/")
    ]
    expiry = leased_at + timeout + 5.0
    first = min(start for start, _ in survivor_intervals)
    # Nothing was sent while the killed process's leases lived...
    assert first > expiry - 0.5
    # ...and they did not hold the host for longer: the others started at
    # once and used the whole limit.
    assert first < expiry + 2.0
    assert _peak(survivor_intervals) == LIMIT


def test_redis_lost_and_restarted_mid_crawl(simhosts, own_redis_server, tmp_path):
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.05})
    pages = 80
    prefix = f"crawl-{uuid.uuid4().hex[:8]}"
    processes = start_together(
        [
            process_config(
                hosts,
                index,
                pages,
                redis_url=own_redis_server.url,
                prefix=prefix,
                THROTTLING_STATE_PROCESSES=2,
                LOG_LEVEL="INFO",
            )
            for index in range(2)
        ],
        tmp_path,
    )
    wait_for_arrivals(hosts, 20)
    own_redis_server.stop()
    time.sleep(1.0)
    own_redis_server.start()  # empty: persistence is off
    outcomes = [finish(process) for process in processes]
    for outcome in outcomes:
        assert_complete(outcome, pages)
        log = outcome["log"]
        assert log.count("Lost the shared throttling state") == 1, log[-3000:]
        assert "Reconnected to the shared throttling state" in log
        assert outcome["stats"]["throttling/shared_state/fallback_count"] == 1
    arrivals = page_arrivals(hosts.stats("A"))
    assert len(arrivals) == 2 * pages
    assert set(arrivals.values()) == {1}
    # During the fallback each process allows 4 / 2; only the moment of the
    # loss, when one process may still have more in flight than its half,
    # can go one or two above the limit.
    assert max_in_service([hosts.stats("A")]) <= LIMIT + LIMIT // 2


def _peak(intervals: list[tuple[float, float]]) -> int:
    events = sorted(
        [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
        key=lambda event: (event[0], event[1]),
    )
    current = peak = 0
    for _, change in events:
        current += change
        peak = max(peak, current)
    return peak


def crawl_with_one_429(
    hosts: Any, redis_url: str | None, reactor: str, directory: Path, **settings: Any
) -> list[dict[str, Any]]:
    """Two processes of 30 pages each on host A, started together; the
    fourth page of the first is answered ``429`` with ``Retry-After: 1``.
    Checks that each ran on *reactor* and had every page answered; returns
    their outcomes, each with the ``settings`` it crawled with."""
    pages = 30
    configs = together(
        hosts, 2, pages, redis_url=redis_url, reactor=reactor, **settings
    )
    configs[0]["urls"][3] += "?status=429&header=Retry-After:1"
    outcomes = [finish(process) for process in start_together(configs, directory)]
    for outcome, config in zip(outcomes, configs, strict=True):
        assert_reactor(outcome, reactor)
        assert outcome["unanswered"] == []
        assert len(outcome["responses"]) + len(outcome["failures"]) == pages
        outcome["settings"] = config["settings"]
    return outcomes


#: The scope delay of the spacing test (s).
SPACING = 0.05


@pytest.mark.parametrize("reactor", ["asyncio", "epoll"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "independent"])
def test_a_delay_spaces_the_sends_of_every_process(
    simhosts, redis_server, shared, reactor, tmp_path
):
    """A scope delay of 50 ms holds across 3 processes: one send every 50 ms
    at the host, not three (the control, without THROTTLING_STATE_URL:
    each process spaces only its own sends). No process waits while the
    others crawl: each gets about a third of the sends of each part of the
    crawl (the processes waiting take turns, see ``ACQUIRE_SCRIPT``)."""
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.005})
    pages = 20
    configs = together(
        hosts,
        3,
        pages,
        redis_url=redis_server.url if shared else None,
        reactor=reactor,
        THROTTLING_SCOPES={
            hosts.netloc("A"): {"concurrency": LIMIT, "delay": SPACING, "jitter": 0}
        },
    )
    outcomes = [finish(process) for process in start_together(configs, tmp_path)]
    for outcome in outcomes:
        assert_reactor(outcome, reactor)
        assert_complete(outcome, pages)
    stats = hosts.stats("A")
    assert_each_page_once(stats, 3 * pages)
    arrivals = sorted(
        (record[0], record[1].split("/")[1]) for record in stats["arrivals"]
    )
    gaps = [later - earlier for (earlier, _), (later, _) in pairwise(arrivals)]
    if not shared:
        # Three processes, each at its own pace: sends 50 ms apart at most
        # a third of the time.
        assert sorted(gaps)[len(gaps) // 2] < 0.6 * SPACING
        return
    # One send per delay at the host (a little less: a send reaches the
    # host a few ms early or late), and no slower than it allows.
    assert min(gaps) >= 0.6 * SPACING
    assert sorted(gaps)[len(gaps) // 20] >= 0.9 * SPACING
    assert sorted(gaps)[len(gaps) // 2] <= 1.5 * SPACING
    # Every process has its share of each third of the sends.
    third = len(arrivals) // 3
    for part in (arrivals[:third], arrivals[third : 2 * third], arrivals[2 * third :]):
        shares = Counter(process for _, process in part)
        assert len(shares) == 3, shares
        assert min(shares.values()) >= len(part) / 6, shares


@pytest.mark.parametrize("reactor", ["asyncio", "epoll"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "independent"])
def test_a_backoff_hold_holds_every_process(
    simhosts, redis_server, shared, reactor, tmp_path
):
    """A 429 with ``Retry-After: 1`` answered to one process holds the host
    in both (without THROTTLING_STATE_URL, the control: the other process
    keeps sending). The refused page is retried once (a request of the
    retry middleware), and refused again. Both start crawling at once: the
    other process's 30 pages take about half a second, so one that set up
    Scrapy sooner on a loaded machine could be done before the hold (the
    control then fails, and the shared case checks only the refused
    process's own hold)."""
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.05})
    url = redis_server.url if shared else None
    crawl_with_one_429(hosts, url, reactor, tmp_path, RETRY_TIMES=1, BACKOFF_JITTER=0)
    stats = hosts.stats("A")
    intervals = service_intervals(stats)
    refusals = [
        end
        for (_, end), record in zip(intervals, stats["arrivals"], strict=True)
        if record[3] == 429
    ]
    assert len(refusals) == 2  # the page and its retry
    # Arrivals from either process while a hold runs (after a margin for
    # sends already decided when the 429 was answered).
    during_holds = [
        start
        for start, _ in intervals
        if any(end + 0.1 < start < end + 0.9 for end in refusals)
    ]
    if shared:
        assert during_holds == []
    else:
        assert during_holds


@pytest.mark.parametrize("reactor", ["asyncio", "epoll"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "independent"])
def test_one_429_sets_no_pace(simhosts, redis_server, shared, reactor, tmp_path):
    """One 429 of one page, a tenth of a second into the crawl, holds the
    host but sets no pace, with Redis as without: a pace is learned from the
    sends since the scope's first 429. Before, the shared count learned at
    once from the few requests sent by then, and paced both processes at a
    few requests a second until a probe 30 windows later."""
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.05})
    url = redis_server.url if shared else None
    outcomes = crawl_with_one_429(hosts, url, reactor, tmp_path, RETRY_TIMES=0)
    for outcome in outcomes:
        assert "throttling/rate_limit/learned_count" not in outcome["stats"]
    assert outcomes[0]["stats"]["throttling/backoff/status/429_count"] == 1
    statuses = [record[3] for record in hosts.stats("A")["arrivals"]]
    assert statuses.count(429) == 1
    if shared:
        prefix = outcomes[0]["settings"]["THROTTLING_STATE_PREFIX"]
        assert redis_server.client().get(f"{prefix}:pace:{hosts.netloc('A')}") is None


@pytest.mark.parametrize("reactor", ["asyncio", "epoll"])
@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "THROTTLING_STATE_URL = 'redis://127.0.0.1:{port}/0'",
            "THROTTLING_STATE_URL 'redis://127.0.0.1:{port}/0': cannot reach Redis "
            "(ConnectionError: ",
        ),
        (
            "THROTTLING_STATE_URL = 'localhost:6379'",
            "Invalid THROTTLING_STATE_URL value 'localhost:6379': expected a "
            "redis://, rediss:// or unix:// URL, or None",
        ),
    ],
    ids=["unreachable", "invalid"],
)
def test_shared_state_start_up_errors(tmp_path, simhosts, reactor, setting, message):
    """`scrapy crawl` as a user runs it: one ERROR line naming the setting
    and the URL, exit status 1, no request sent."""
    from tests.redis_server import free_port
    from tests.test_startup_messages import (
        EPOLL,
        host,
        new_project,
        scrapy_crawl,
        simhosts_requests,
    )

    port = free_port()
    url = host(simhosts)
    project = new_project(
        tmp_path, f"ADDONS = {ADDON!r}\n{setting.format(port=port)}\n"
    )
    args = ["-s", f"TWISTED_REACTOR={EPOLL}"] if reactor == "epoll" else []
    result = scrapy_crawl(project, url, *args)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if " ERROR: " in line]
    assert len(errors) == 1, result.stderr[-3000:]
    assert message.format(port=port) in errors[0]
    assert simhosts_requests(url) == 0
    assert "Task exception was never retrieved" not in result.stderr
    if reactor == "asyncio":
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
