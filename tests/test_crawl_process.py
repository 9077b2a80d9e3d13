"""Crawls in a fresh process: a plain Twisted reactor, and JOBDIR pause/resume."""

from __future__ import annotations

from typing import Any

import pytest

from tests.engine_crawls import ADDON, crawl_in_process
from tests.spiders import PagesSpider

# Every crawl runs twice: URLs queued at start, and yielded from a callback.
pytestmark = pytest.mark.usefixtures("spider_modes")


def crawl(config: dict[str, Any]) -> dict[str, Any]:
    """Crawl in a fresh process, in the mode the ``spider_modes`` fixture set."""
    if PagesSpider.follow_by_default:
        config = {
            **config,
            "follow": True,
            "settings": {**config["settings"], **(PagesSpider.custom_settings or {})},
        }
    return crawl_in_process(config)


def test_concurrency_is_enforced_on_a_plain_twisted_reactor(simhosts):
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.05})
    urls = [hosts.url("A", f"/{i}") for i in range(40)]
    result = crawl(
        {
            "settings": {
                "ADDONS": ADDON,
                "TWISTED_REACTOR": "twisted.internet.epollreactor.EPollReactor",
                "CONCURRENT_REQUESTS": 32,
                "THROTTLING_SCOPES": {hosts.netloc("A"): {"concurrency": 3}},
            },
            "urls": urls,
        }
    )
    assert result["reactor"] == "twisted.internet.epollreactor.EPollReactor"
    assert result["unanswered"] == []
    assert len(result["responses"]) == 40
    assert hosts.stats("A")["max_concurrency"] == 3


def test_jobdir_crawl_stopped_half_way_and_resumed_fetches_each_page_once(
    simhosts, tmp_path
):
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.02})
    urls = [hosts.url("A", f"/page/{i}") for i in range(40)]
    # Half the requests in a custom scope, to check scopes survive the pause.
    metas = [{"throttling_scopes": "custom"} if i % 2 else {} for i in range(40)]
    config = {
        "settings": {
            "ADDONS": ADDON,
            "JOBDIR": str(tmp_path / "job"),
            "CONCURRENT_REQUESTS": 4,
            "THROTTLING_SCOPES": {
                "custom": {"concurrency": 1, "delay": 0.02},
                hosts.netloc("A"): {"concurrency": 2},
            },
        },
        "urls": urls,
        "metas": metas,
        "stop_after": 15,
    }
    first = crawl(config)
    assert first["finish_reason"] == "stopped_half_way"
    assert 15 <= len(first["responses"]) < 40
    second = crawl({**config, "stop_after": None})
    assert second["finish_reason"] == "finished"
    fetched = [path for _, path, *_ in hosts.stats("A")["arrivals"]]
    assert sorted(fetched) == sorted(f"/page/{i}" for i in range(40))
    # The restored custom-scope requests kept their scope (concurrency 1).
    custom = {f"/page/{i}" for i in range(1, 40, 2)}
    assert all(
        concurrent <= 3
        for _, path, concurrent, *_ in hosts.stats("A")["arrivals"]
        if path in custom
    )
