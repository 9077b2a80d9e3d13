"""Cost per request of the throttling-aware priority queue vs. number of scopes.

``python -m bench.pqueue_cost [--scopes 100,10000,100000] [--requests 200000]``

Pushes ``--requests`` requests spread over N distinct scopes (one host each),
then drains the queue the way the engine does: pop up to
``CONCURRENT_REQUESTS`` (16) requests, "download" them (release their
reservations), and again, until the queue is empty. It prints the cost per
request of push and of pop+release, in microseconds, for each N. The queue
must not scan every scope per dequeue, so the cost should stay flat from 100
to 100 000 scopes. No network and no engine: the queue and the real
throttling manager only.

``--compare`` also times Scrapy's default DownloaderAwarePriorityQueue for the
scope counts up to 10 000 (it looks at every slot on each pop).
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

from scrapy import Request
from scrapy.squeues import FifoMemoryQueue
from scrapy.utils.test import get_crawler

from scrapy_adaptive_throttle import ThrottlingAwarePriorityQueue
from scrapy_adaptive_throttle._crawler_throttler import get_throttler

BATCH = 16


def run(scopes: int, requests: int, *, warm: bool = False) -> dict[str, float]:
    crawler = get_crawler(
        settings_dict={
            "CONCURRENT_REQUESTS": BATCH,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
            "DOWNLOAD_DELAY": 0,
            "THROTTLING_SCOPE_LIMIT": 0,
            "LOG_LEVEL": "WARNING",
        }
    )
    throttler = get_throttler(crawler)
    queue = ThrottlingAwarePriorityQueue.from_crawler(crawler, FifoMemoryQueue, "")
    batch = [
        Request(f"http://h{index % scopes}.example/{index}", dont_filter=True)
        for index in range(requests)
    ]
    if warm:
        # Create every scope's state first, so that the figures are the
        # queue's own cost, not the one-time creation of scope states.
        for index in range(scopes):
            throttler.get_scope_manager(f"h{index}.example")
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        for request in batch:
            queue.push(request)
        pushed = time.perf_counter()
        popped = 0
        while True:
            taken = []
            for _ in range(BATCH):
                request = queue.pop()
                if request is None:
                    break
                taken.append(request)
            if not taken:
                break
            popped += len(taken)
            for request in taken:
                throttler.release(request)
        done = time.perf_counter()
    finally:
        gc.enable()
    assert popped == requests, (popped, requests)
    return {
        "scopes": scopes,
        "requests": requests,
        "push_us": (pushed - start) / requests * 1e6,
        "pop_release_us": (done - pushed) / requests * 1e6,
    }


def run_scrapy_default(scopes: int, requests: int) -> dict[str, float]:
    from scrapy.crawler import Crawler
    from scrapy.pqueues import DownloaderAwarePriorityQueue
    from scrapy.spiders import Spider

    crawler: Crawler = get_crawler(Spider, settings_dict={"LOG_LEVEL": "WARNING"})
    crawler.engine = _EngineStub(crawler)  # DAPQ reads crawler.engine.downloader
    queue = DownloaderAwarePriorityQueue.from_crawler(crawler, FifoMemoryQueue, "")
    batch = [
        Request(f"http://h{index % scopes}.example/{index}", dont_filter=True)
        for index in range(requests)
    ]
    start = time.perf_counter()
    for request in batch:
        queue.push(request)
    pushed = time.perf_counter()
    while queue.pop() is not None:
        pass
    done = time.perf_counter()
    return {
        "scopes": scopes,
        "requests": requests,
        "push_us": (pushed - start) / requests * 1e6,
        "pop_release_us": (done - pushed) / requests * 1e6,
    }


class _EngineStub:
    """Just enough of an engine for DownloaderAwarePriorityQueue: its downloader."""

    def __init__(self, crawler: Any) -> None:
        from scrapy.core.downloader import Downloader

        self.downloader = Downloader(crawler)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scopes", default="100,10000,100000")
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--compare", action="store_true")
    parser.add_argument(
        "--warm",
        action="store_true",
        help="create the scope states before timing (queue cost only)",
    )
    args = parser.parse_args()
    from scrapy.utils.reactor import install_reactor

    install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
    print(
        f"{'queue':<34} {'scopes':>8} {'requests':>9} {'push us':>8} "
        f"{'pop+release us':>15}"
    )
    for scopes in (int(value) for value in args.scopes.split(",")):
        result = run(scopes, args.requests, warm=args.warm)
        print(
            f"{'ThrottlingAwarePriorityQueue':<34} {scopes:>8} {args.requests:>9} "
            f"{result['push_us']:>8.2f} {result['pop_release_us']:>15.2f}"
        )
        if args.compare and scopes <= 10_000:
            requests = min(args.requests, 20_000)
            result = run_scrapy_default(scopes, requests)
            print(
                f"{'DownloaderAwarePriorityQueue':<34} {scopes:>8} {requests:>9} "
                f"{result['push_us']:>8.2f} {result['pop_release_us']:>15.2f}"
            )


if __name__ == "__main__":
    main()
