"""Real crawls with the latency-aware scope manager (the add-on's default).

The simulated hosts of :mod:`simhosts` are the guide's, twice as
slow: a large host (8 workers x 40 ms) and a small one (2 workers x 100
ms), each answering 503 when its queue is full. Crawled together, each must
settle at its own limit, without a single 503. Margins are generous: this
proves adaptation, the figures belong to ``bench/``.

Why twice as slow: the latency the crawler measures includes its own
turnaround, which on a loaded 2-core machine (a CI runner, the suite's
other crawls) adds tens of milliseconds to some answers. Against 20 ms of
service time that hid host A's queue often enough for its limit to pass
its 24 places (four 503s in one run of about a dozen at load 1.5), and the
small host's median limit came out at 6 on a CI run. Against 40 and 100 ms
the 503s did not recur in 30 runs. How the limit fares on fast hosts and
loaded machines is measured in ``bench/`` (``python -m bench.run``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.spiders import PagesSpider, run_crawl

# Every crawl twice: URLs queued at start, and yielded from a callback.
pytestmark = pytest.mark.usefixtures("spider_modes")

ADDON = {"scrapy_adaptive_throttle.Addon": 500}
#: Host A's queue is deeper than the simulated hosts' default of 16: slow
#: start may overshoot its 8 workers to 25 in flight before the first queued
#: answers come back (Scrapy's clock reads them at 1.5-1.8x the service
#: time, inside the threshold of a baseline taken from slow start's own
#: first answers), which a 16-deep queue answers with a 503. Measured on a
#: 2-core machine at load 1: 5 runs in 14 with 1-5 503s, and 2 in 8 on the
#: code before the restructuring of issue 10; a known gap of slow start
#: (see the closing note of issue 9). This test is about the limits the two
#: hosts settle at; host A's peak is bounded below.
LARGE = {
    "name": "A",
    "kind": "queue",
    "workers": 8,
    "service_time": 0.04,
    "queue_size": 40,
}
SMALL = {"name": "B", "kind": "queue", "workers": 2, "service_time": 0.1}


class SamplingSpider(PagesSpider):
    """Records each host's adaptive limit at every response."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.limits: dict[str, list[int]] = {}

    def parse(self, response: Any, **kwargs: Any) -> None:
        super().parse(response, **kwargs)
        scope = response.url.split("/")[2]
        throttler: Any = self.crawler.throttler  # type: ignore[attr-defined]
        state = throttler.get_scope_state(scope)
        self.limits.setdefault(scope, []).append(state["limit"])


def interleave(*url_lists: list[str]) -> list[str]:
    merged: list[str] = []
    for index in range(max(len(urls) for urls in url_lists)):
        merged.extend(urls[index] for urls in url_lists if index < len(urls))
    return merged


@deferred_f_from_coro_f
async def test_two_hosts_settle_at_different_limits(
    simhosts: Any, spider_modes: str
) -> None:
    hosts = simhosts(LARGE, SMALL)
    large = [hosts.url("A", f"/page/{index}") for index in range(600)]
    # 120 pages of the small host (6 s at its capacity): its limit is read
    # over the second half of its crawl, and slow start's overshoot of its 2
    # workers comes down one request per slow round (issue 9's open gap,
    # pinned in tests/algorithms/test_latency_slow_start.py). With 60 pages,
    # on a loaded CI runner, that descent took most of the crawl and the
    # "settled" median read 10, the overshoot itself.
    small = [hosts.url("B", f"/page/{index}") for index in range(120)]
    crawler = await run_crawl(
        SamplingSpider,
        {
            "ADDONS": ADDON,
            "CONCURRENT_REQUESTS": 64,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 32,
            "DOWNLOAD_DELAY": 0,
            "RETRY_ENABLED": False,
        },
        urls=interleave(large, small),
    )
    spider = crawler.spider
    assert isinstance(spider, SamplingSpider)
    assert spider.unanswered() == []
    assert Counter(spider.statuses) == {200: len(large) + len(small)}
    for name in ("A", "B"):
        assert hosts.stats(name)["status_counts"] == {
            "200": len(large if name == "A" else small)
        }
    large_limits = spider.limits[hosts.netloc("A")]
    small_limits = spider.limits[hosts.netloc("B")]
    # Each host's limit over the second half of its crawl.
    large_settled = sorted(large_limits[len(large_limits) // 2 :])
    small_settled = sorted(small_limits[len(small_limits) // 2 :])
    large_median = large_settled[len(large_settled) // 2]
    small_median = small_settled[len(small_settled) // 2]
    # The large host's capacity x service time is 8, the small one's 2; each
    # settles near its own, a little above it to cover Scrapy's turnaround.
    # The small host's bound is loose: after slow start overshoots it, a
    # noise estimate polluted by slow start's loaded answers can make its
    # rounds long, and its limit come down slowly (over the second half of
    # 60 pages, median 6-9 in about one run in ten on a loaded machine and
    # 10 once in CI; over 120 pages, 2-5 in 12 runs with both cores busy).
    assert 5 <= large_median <= 20
    assert 1 <= small_median <= 10
    assert large_median >= small_median + 2
    # The small host never held more than its queue allows (no 503 above),
    # and was never pushed near its 16-request queue: slow start's last
    # doubling may overshoot its 2 workers (10 on a loaded machine), no more.
    assert hosts.stats("B")["max_concurrency"] <= 12
    # Host A: slow start's overshoot stays within the scope's ceiling of 32.
    assert hosts.stats("A")["max_concurrency"] <= 32
    stats = crawler.stats.get_stats()
    # Plus, in the followed mode, the index page's scope.
    assert stats["throttling/latency/scope_count"] == (
        2 if spider_modes == "queued" else 3
    )
    assert stats["throttling/latency/pinned_floor_count"] == 0
