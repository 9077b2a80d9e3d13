"""Real crawls: the timeline file and its chart, the progress line, the gauges
and the per-scope stats at close.

Two simulated hosts of different capacity (a queue of 6 workers x 20 ms and
one of 2 workers x 50 ms) are crawled by :class:`tests.spiders.FollowSpider`,
whose callbacks yield the requests, on both reactors.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_adaptive_throttle.plot import main as plot_main
from tests.engine_crawls import ADDON, REACTORS, crawl_follow

FAST = {"name": "F", "kind": "queue", "workers": 6, "service_time": 0.02}
SLOW = {"name": "S", "kind": "queue", "workers": 2, "service_time": 0.05}


def crawl_settings(**extra: Any) -> dict[str, Any]:
    return {
        "ADDONS": ADDON,
        "CONCURRENT_REQUESTS": 32,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 16,
        "DOWNLOAD_DELAY": 0,
        "RETRY_ENABLED": False,
        **extra,
    }


@pytest.mark.parametrize("reactor", REACTORS)
@deferred_f_from_coro_f
async def test_the_timeline_and_its_chart_come_from_a_real_crawl(
    simhosts: Any, tmp_path: Path, reactor: str
) -> None:
    hosts = simhosts(FAST, SLOW)
    timeline = tmp_path / "timeline.jsonl"
    result = await crawl_follow(
        reactor,
        crawl_settings(
            THROTTLING_TIMELINE_FILE=str(timeline),
            THROTTLING_TIMELINE_INTERVAL=0.2,
            LOGSTATS_INTERVAL=0.5,
        ),
        [hosts.url("F"), hosts.url("S")],
        depth=3,
        fanout=5,
    )
    assert result["lost"] == []
    fast, slow = hosts.netloc("F"), hosts.netloc("S")
    answered = Counter(entry["url"].split("/")[2] for entry in result["responses"])
    assert answered == {fast: 156, slow: 156}

    lines = [json.loads(line) for line in timeline.read_text().splitlines()]
    by_scope: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        by_scope.setdefault(line["scope"], []).append(line)
    assert set(by_scope) == {fast, slow}
    for scope, samples in by_scope.items():
        times = [sample["time"] for sample in samples]
        assert times == sorted(times)
        assert len(samples) >= 3, scope
        # Every response is counted in exactly one sample (the last one is
        # written at close).
        assert sum(sample["responses"] for sample in samples) == answered[scope]
        assert all(1 <= sample["limit"] <= 16 for sample in samples)
        assert all(sample["ceiling"] == 16 for sample in samples)
        busy = [sample for sample in samples if sample["responses"]]
        assert all(sample["latency_p50"] > 0 for sample in busy)
        assert all(sample["pages_per_second"] > 0 for sample in busy)
        assert {"delay", "backoff_level", "in_flight", "waiting"} <= set(samples[0])
    # The slow host answers slower (median latency over its busy samples).
    assert median_latency(by_scope[slow]) > median_latency(by_scope[fast])

    chart = tmp_path / "chart.png"
    assert plot_main([str(timeline), "-o", str(chart)]) == 0
    data = chart.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width = int.from_bytes(data[16:20], "big")
    height = int.from_bytes(data[20:24], "big")
    assert (width, height) == (900, 800)

    stats = result["stats"]
    for scope in (fast, slow):
        prefix = f"throttling/scopes/{scope}"
        assert stats[f"{prefix}/response_count"] == answered[scope]
        assert 1 <= stats[f"{prefix}/limit"] <= 16
        assert 0 < stats[f"{prefix}/latency_p50"] <= stats[f"{prefix}/latency_p90"]
        assert stats[f"{prefix}/latency_p90"] <= stats[f"{prefix}/latency_p99"]
    assert (
        stats[f"throttling/scopes/{slow}/latency_p50"]
        > stats[f"throttling/scopes/{fast}/latency_p50"]
    )
    # The gauges, as set by the last pass (at close: nothing in flight).
    assert stats["throttling/live/scopes"] == 2
    assert stats["throttling/live/in_flight"] == 0
    assert stats["throttling/live/held_scopes"] == 0


def median_latency(samples: list[dict[str, Any]]) -> float:
    values = sorted(s["latency_p50"] for s in samples if s["latency_p50"] is not None)
    return values[len(values) // 2]


@deferred_f_from_coro_f
async def test_progress_is_logged_at_info_while_the_crawl_runs(
    simhosts: Any, caplog: pytest.LogCaptureFixture
) -> None:
    hosts = simhosts(SLOW)
    with caplog.at_level(logging.INFO, logger="scrapy_adaptive_throttle"):
        result = await crawl_follow(
            "asyncio",
            crawl_settings(LOGSTATS_INTERVAL=0.3, CONCURRENT_REQUESTS_PER_DOMAIN=4),
            [hosts.url("S"), hosts.url("S", "/other")],
            depth=2,
            fanout=12,
        )
    assert result["lost"] == []
    progress = [
        record.getMessage()
        for record in caplog.records
        if record.getMessage().startswith("Throttling: 1 scope(s)")
    ]
    # At least one line mid-crawl, and one at close.
    assert len(progress) >= 2
    scope = hosts.netloc("S")
    mid_crawl = [line for line in progress if "holding requests back (" in line]
    assert mid_crawl, progress
    # The host holds requests back at its (adaptive) concurrency limit.
    assert any("(concurrency=1)" in line for line in mid_crawl), mid_crawl
    assert any(f"busiest: {scope} " in line for line in mid_crawl), mid_crawl
    assert all("request(s) in the scheduler" in line for line in progress)
    assert progress[-1].startswith("Throttling: 1 scope(s), 0 in flight")


@deferred_f_from_coro_f
async def test_the_progress_line_can_be_switched_off(
    simhosts: Any, caplog: pytest.LogCaptureFixture
) -> None:
    hosts = simhosts(FAST)
    with caplog.at_level(logging.INFO, logger="scrapy_adaptive_throttle"):
        result = await crawl_follow(
            "asyncio",
            crawl_settings(LOGSTATS_INTERVAL=0.2, THROTTLING_PROGRESS=False),
            [hosts.url("F")],
            depth=2,
            fanout=10,
        )
    assert result["lost"] == []
    assert not [
        r for r in caplog.records if r.getMessage().startswith("Throttling: 1 scope")
    ]
    # The gauges are still set.
    assert result["stats"]["throttling/live/scopes"] == 1


@pytest.mark.parametrize("reactor", REACTORS)
@deferred_f_from_coro_f
async def test_only_scopes_with_queued_requests_count_as_holding_back(
    simhosts: Any, caplog: pytest.LogCaptureFixture, reactor: str
) -> None:
    # S has its children queued behind a limit of 1; B's one slow request is
    # in flight at its limit of 1 with nothing queued behind it. Only S holds
    # requests back: a scope at its limit with an empty queue holds nothing.
    hosts = simhosts(SLOW, {"name": "B", "kind": "unlimited", "service_time": 1.5})
    settings = crawl_settings(
        LOGSTATS_INTERVAL=0.25,
        LOG_LEVEL="INFO",  # the progress lines, in the EPoll crawl's log
        CONCURRENT_REQUESTS_PER_DOMAIN=1,
        THROTTLING_SCOPE_MANAGER="scrapy_adaptive_throttle.ThrottlingScopeManager",
    )
    with caplog.at_level(logging.INFO, logger="scrapy_adaptive_throttle"):
        result = await crawl_follow(
            reactor,
            settings,
            [hosts.url("S"), hosts.url("B")],
            depth=2,
            fanout=8,
            child_hosts=[hosts.url("S")],
        )
    assert result["lost"] == []
    assert result["failures"] == []
    log = result.get("log") or "\n".join(r.getMessage() for r in caplog.records)
    progress = [line for line in log.splitlines() if "Throttling: 2 scope(s)" in line]
    busy = hosts.netloc("B")
    # The lines written while B's request was in flight (it is the busiest).
    b_in_flight = [line for line in progress if f"{busy} (1/1 in flight" in line]
    assert b_in_flight, progress
    assert any(
        "1 holding requests back (concurrency=1)" in line for line in b_in_flight
    ), b_in_flight
    assert not [line for line in progress if "concurrency=2" in line], progress
    # Limits held at the server.
    assert hosts.stats("S")["max_concurrency"] == 1
    assert hosts.stats("B")["max_concurrency"] == 1
