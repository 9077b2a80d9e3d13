"""One adaptive limit per host across real crawler processes (issue 13).

A host with 4 workers (30 ms a request) and a queue: latency grows as soon
as more than 4 requests are in service, which the add-on's
latency-adaptive limit (ceiling ``CONCURRENT_REQUESTS_PER_DOMAIN = 16``)
reads as the host queueing. The same test crawls it with one process, with
3 processes sharing their state through a real ``redis-server``, and with 3
independent processes, and checks at the server (requests in service) that
the 3 shared processes keep the host at about the load the one process put
on it, while the 3 independent ones put more (so the check can fail).
Pages come from the callback of an index page and a tenth redirect (see
``tests/test_shared_state_crawl.py``).
"""

from __future__ import annotations

import uuid

import pytest

from tests.server_checks import max_in_service, mean_in_service
from tests.test_shared_state_crawl import (
    assert_complete,
    finish,
    page_arrivals,
    process_config,
    start_process,
)

HOST = {"name": "A", "kind": "queue", "workers": 4, "service_time": 0.03}
PAGES = 240
ADAPTIVE = {"THROTTLING_SCOPES": {}, "CONCURRENT_REQUESTS_PER_DOMAIN": 16}


def crawl(hosts, count, pages, redis_url, reactor):
    prefix = f"crawl-{uuid.uuid4().hex[:8]}"
    processes = [
        start_process(
            process_config(
                hosts,
                index,
                pages,
                redis_url=redis_url,
                prefix=prefix,
                reactor=reactor,
                THROTTLING_STATE_PROCESSES=count,
                **ADAPTIVE,
            )
        )
        for index in range(count)
    ]
    for process in processes:
        assert_complete(finish(process, timeout=120), pages)
    stats = hosts.stats("A")
    assert set(page_arrivals(stats).values()) == {1}
    assert len(page_arrivals(stats)) == count * pages
    return stats


@pytest.mark.parametrize("reactor", ["asyncio", "epoll"])
def test_processes_share_one_adaptive_limit(simhosts, redis_server, reactor):
    one = crawl(
        simhosts({**HOST, "queue_size": 64}), 1, 3 * PAGES, redis_server.url, reactor
    )
    shared = crawl(
        simhosts({**HOST, "queue_size": 64}), 3, PAGES, redis_server.url, reactor
    )
    independent = crawl(simhosts({**HOST, "queue_size": 64}), 3, PAGES, None, reactor)
    runs = (one, shared, independent)
    peaks = [max_in_service([stats]) for stats in runs]
    means = [round(mean_in_service(stats), 2) for stats in runs]
    print(
        "in service, one process, 3 shared, 3 independent: peak", peaks, "mean", means
    )
    for stats in runs:
        assert not [record for record in stats["arrivals"] if record[3] == 503]
    # The 3 shared processes hold the host about where one process does:
    # one limit, whose peak varies from run to run as one process's does
    # (10 runs on 2 loaded cores: one process 8-9, 3 shared 7-13; time-weighted
    # mean one 4.8-5.6, shared 4.8-7.4), where 3 independent processes held
    # it at 2-3 times one process's load (peak 14-39, mean 8.0-23.4)...
    assert peaks[1] <= 1.5 * peaks[0] + 1
    assert means[1] <= 1.5 * means[0] + 1
    # ...and without sharing they hold it higher.
    assert peaks[2] > peaks[1]
    assert means[2] > means[1]
