"""Scope eviction with the scheduler queue, and job directories that keep
every request's scopes and delays, whatever the scope ids."""

from __future__ import annotations

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.engine_crawls import ADDON, REACTORS, crawl_follow, crawl_in_process


@pytest.mark.parametrize("reactor", REACTORS)
@deferred_f_from_coro_f
async def test_idle_scopes_are_evicted_when_requests_come_from_the_queue(
    simhosts, reactor
):
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.0})
    result = await crawl_follow(
        reactor,
        {
            "ADDONS": ADDON,
            "THROTTLING_MANAGER": "tests.faulty_components.ScopePerPage",
            "THROTTLING_SCOPE_MAX_IDLE": 0.5,
            "CONCURRENT_REQUESTS": 8,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
        },
        [hosts.url("A")],
        depth=3,
        fanout=6,
        child_query="delay=0.1",
    )
    assert result["finish_reason"] == "finished"
    assert result["lost"] == []
    assert len(result["responses"]) == 259
    # 260 scopes were used over ~4 s; those idle for 0.5 s are gone.
    assert result["live_scopes"] < 100


@pytest.mark.parametrize("reactor", REACTORS)
@deferred_f_from_coro_f
async def test_scopes_that_backed_off_are_evicted_once_recovered(simhosts, reactor):
    # Every page answers 503 (no Retry-After): its page scope backs off once
    # and is never used again. It used to stay backing off, unevictable, for
    # ever; now it recovers after a quiet BACKOFF_WINDOW, then goes idle.
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.0})
    result = await crawl_follow(
        reactor,
        {
            "ADDONS": ADDON,
            "THROTTLING_MANAGER": "tests.faulty_components.ScopePerPage",
            "THROTTLING_SCOPE_MANAGER": (
                "scrapy_adaptive_throttle.ThrottlingScopeManager"
            ),
            "THROTTLING_SCOPE_MAX_IDLE": 0.5,
            "BACKOFF_WINDOW": 0.5,
            "BACKOFF_MIN_DELAY": 0.01,
            "BACKOFF_MAX_DELAY": 0.01,
            "RETRY_ENABLED": False,
            "CONCURRENT_REQUESTS": 8,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
            "CLOSESPIDER_TIMEOUT": 60,
        },
        [hosts.url("A")],
        depth=3,
        fanout=5,
        child_query="status=503&delay=0.2",
    )
    assert result["finish_reason"] == "finished"
    assert result["lost"] == []
    assert len(result["responses"]) == 156
    assert sum(entry["status"] == 503 for entry in result["responses"]) == 155
    # Counted per scope: each 503 backs off its host's and its page's.
    assert result["stats"]["throttling/backoff/status/503_count"] == 2 * 155
    # 157 scopes were used over a few seconds; the recovered idle ones are gone.
    assert result["live_scopes"] < 100


REACTOR_SETTINGS = {
    "asyncio": {},
    "epoll": {"TWISTED_REACTOR": "twisted.internet.epollreactor.EPollReactor"},
}


#: URLs queued at start, or yielded from an index page's callback (so that
#: the first run stops with requests a callback queued, not start requests).
FOLLOW_MODES = pytest.mark.parametrize(
    "follow", [False, True], ids=["queued", "followed"]
)


@FOLLOW_MODES
@pytest.mark.parametrize("reactor", REACTORS)
def test_jobdir_resume_honours_the_remaining_throttling_delay(
    simhosts, tmp_path, reactor, follow
):
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.02})
    urls = [hosts.url("A", f"/page/{i}") for i in range(4)] + [
        hosts.url("A", "/delayed")
    ]
    config = {
        "settings": {
            "ADDONS": ADDON,
            "JOBDIR": str(tmp_path / "job"),
            **REACTOR_SETTINGS[reactor],
        },
        "urls": urls,
        "metas": [{}, {}, {}, {}, {"throttling_delay": 6.0}],
        "stop_after": 4,
        "follow": follow,
    }
    first = crawl_in_process(config)
    assert first["finish_reason"] == "stopped_half_way"
    assert all("/delayed" not in entry["url"] for entry in first["responses"])
    second = crawl_in_process({**config, "stop_after": None})
    assert second["finish_reason"] == "finished"
    arrivals = {path: t for t, path, *_ in hosts.stats("A")["arrivals"]}
    assert set(arrivals) == {"/page/0", "/page/1", "/page/2", "/page/3", "/delayed"}
    # Host time 0 is the first page's arrival, just after the delay started.
    assert arrivals["/delayed"] >= 5.5


@FOLLOW_MODES
@pytest.mark.parametrize("reactor", REACTORS)
def test_jobdir_with_long_scope_ids_pauses_and_resumes(
    simhosts, tmp_path, reactor, follow
):
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.02})
    # Three ids of ~80 characters (a directory name over 255 bytes before
    # the fix), and one of characters a path must not carry as they are.
    long_scopes = [f"{'x' * 75}-{n}" for n in range(3)] + ["a/../b\\c:日本語 \n*?\x00"]
    urls = [hosts.url("A", f"/page/{i}") for i in range(20)]
    config = {
        "settings": {
            "ADDONS": ADDON,
            "JOBDIR": str(tmp_path / "job"),
            "CONCURRENT_REQUESTS": 2,
            "THROTTLING_SCOPES": {long_scopes[0]: {"concurrency": 1}},
            **REACTOR_SETTINGS[reactor],
        },
        "urls": urls,
        "metas": [{"throttling_scopes": long_scopes}] * 20,
        "stop_after": 5,
        "follow": follow,
    }
    first = crawl_in_process(config)
    assert first["finish_reason"] == "stopped_half_way"
    second = crawl_in_process({**config, "stop_after": None})
    assert second["finish_reason"] == "finished"
    fetched = sorted(path for _, path, *_ in hosts.stats("A")["arrivals"])
    assert fetched == sorted(f"/page/{i}" for i in range(20))
    assert hosts.stats("A")["max_concurrency"] == 1
