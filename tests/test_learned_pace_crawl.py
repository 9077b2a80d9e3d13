"""The pace learned from 429 answers, in real crawls on both reactors.

An API serving 20 requests per sliding second (429 + ``Retry-After: 1``
beyond that), crawled with the add-on's defaults and no per-scope setting,
with most requests yielded from callbacks and every 429 retried. Read at the
server: after the first refusal episodes the crawl keeps under the limit
(no more 429s) and close to it (pages per second).
"""

from __future__ import annotations

import itertools
import math

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.engine_crawls import ADDON, REACTORS, crawl_follow

RATE = 20


@pytest.mark.parametrize("reactor", REACTORS)
@deferred_f_from_coro_f
async def test_an_api_limit_is_learned_from_its_429s(simhosts, reactor):
    hosts = simhosts(
        {
            "name": "R",
            "kind": "ratelimit",
            "rate": RATE,
            "service_time": 0.01,
            "retry_after": 1,
        }
    )
    result = await crawl_follow(
        reactor,
        {
            "ADDONS": ADDON,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 32,
            "RETRY_TIMES": 50,
            "CLOSESPIDER_TIMEOUT": 60,
        },
        [hosts.url("R")],
        depth=2,
        fanout=14,  # 1 + 14 + 196 pages, all but one from callbacks
    )
    assert result["finish_reason"] == "finished"
    assert result["lost"] == []
    assert len(result["responses"]) == 211
    stats = result["stats"]
    assert stats["throttling/rate_limit/learned_count"] >= 1
    arrivals = hosts.stats("R")["arrivals"]
    refused = [t for t, _, _, status, _ in arrivals if status == 429]
    served = sorted(t for t, _, _, status, _ in arrivals if status == 200)
    assert refused, "the crawl met the limit"
    # Episodes: refusals less than half a second apart (those in flight when
    # the first came back). The first teaches nothing (no count yet), the
    # second sets the pace (its burst reaches the server out of order: the
    # echoes of requests sent before the counted one correct the count); a
    # count one too many at the window's edge (5 % at 20/s) costs up to
    # three more, each slowing the pace by 2 %.
    episodes = [t for i, t in enumerate(refused) if i == 0 or t - refused[i - 1] > 0.5]
    assert len(episodes) <= 5, refused
    # Between episodes (each holds the scope 1 s), the pace holds under the
    # limit and close to it: read on the longest stretch without refusals.
    starts = [t + 1.0 for t in episodes]
    ends = [*episodes[1:], math.inf]
    stretches = [
        [t for t in served if start < t < end]
        for start, end in zip(starts, ends, strict=True)
    ]
    longest = max(stretches, key=len)
    assert len(longest) >= 60, (refused, len(served))
    pace = (len(longest) - 1) / (longest[-1] - longest[0])
    # (a sliding window lets a long stretch run a little over the rate)
    assert 0.9 * RATE <= pace <= 1.02 * RATE


@pytest.mark.parametrize("reactor", REACTORS)
@deferred_f_from_coro_f
async def test_a_page_always_refused_teaches_no_pace(simhosts, reactor):
    """One page of a host without a rate limit answers every request with
    ``429`` + ``Retry-After: 1``, and its retries go first
    (``RETRY_PRIORITY_ADJUST = 0``), while the rest of the crawl is found
    from callbacks. Each refusal holds the host (read at the server), but
    none teaches a pace: the first only starts the count, and the retries'
    are of a request refused before. Before, the first retry's refusal
    learned the rate the crawl had reached by then, about 150 requests/s
    where the crawl ran at 200, for the rest of the crawl."""
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.02})
    result = await crawl_follow(
        reactor,
        {
            "ADDONS": ADDON,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 32,
            "CONCURRENT_REQUESTS": 64,
            "RETRY_PRIORITY_ADJUST": 0,
            "BACKOFF_JITTER": 0,
        },
        [hosts.url("A")],
        depth=3,
        fanout=8,  # 1 + 8 + 64 + 512 pages, all but one from callbacks
        child_queries={"0.7": "status=429&header=Retry-After:1"},
    )
    assert result["finish_reason"] == "finished"
    assert result["lost"] == []
    assert len(result["responses"]) + len(result["failures"]) == 585
    stats = result["stats"]
    assert stats["throttling/backoff/status/429_count"] == 3  # page, 2 retries
    assert "throttling/rate_limit/learned_count" not in stats
    arrivals = hosts.stats("A")["arrivals"]
    assert len(arrivals) == 587
    # (arrival, answer) of each refusal, on the server's clock.
    refusals = [
        (record[0], record[0] + record[4]) for record in arrivals if record[3] == 429
    ]
    assert len(refusals) == 3
    # Each refusal held the host for its Retry-After, read at the server: a
    # silence of at least 0.7 s starts within 0.4 s of the answer. Without
    # the hold, requests arrive ~5 ms apart. The margin is the time the 429
    # takes to be read by the crawler, with the sends already decided by
    # then: a burst 0.21 s after the answer was seen on a busy CI machine,
    # where a fixed 0.2-s margin failed.
    times = sorted(record[0] for record in arrivals)
    for _, answered in refusals:
        later = [t for t in times if answered < t < answered + 1.5]
        silences = [
            after - before
            for before, after in itertools.pairwise([answered, *later])
            if before < answered + 0.4
        ]
        assert later, answered
        assert later[-1] > answered + 0.7, (answered, later[-5:])
        assert max(silences) >= 0.7, (answered, later[:10])
