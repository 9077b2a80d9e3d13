"""Run one crawl in a fresh process: ``python -m tests.crawl_process JSON``.

For tests that need what a single test process cannot give: another reactor
(the reactor is installed once per process) or a crawl stopped and resumed
with ``JOBDIR``. The JSON argument holds ``settings``, ``urls`` and optional
``metas``, ``stop_after`` (close the crawl after that many responses),
``follow`` (``PagesSpider``'s index-page mode), ``native`` (run on a
Scrapy with its own throttling: :func:`tests.native_scrapy.install`) and
``barrier`` (``{"ready": path, "go": path}``: create *ready* once Scrapy is
imported and the crawl is set up, then start only when *go* exists, so that
several processes start crawling together however long each takes to start);
the process prints one JSON line: ``{"responses": [...], "failures": [...],
"finish_reason": ..., "reactor": ...}``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from scrapy.crawler import CrawlerProcess
from scrapy.exceptions import CloseSpider

from tests.spiders import BASE_SETTINGS, FollowSpider, PagesSpider


class StoppingSpider(PagesSpider):
    name = "stopping"

    def __init__(self, stop_after: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stop_after = stop_after

    async def start(self) -> Any:
        # Unlike PagesSpider, let the dupefilter see start requests, so that a
        # resumed JOBDIR crawl does not fetch again what the first run queued.
        async for request in super().start():
            yield request.replace(dont_filter=False)

    def parse(self, response: Any, **kwargs: Any) -> None:
        super().parse(response, **kwargs)
        if self.stop_after is not None and len(self.responses) >= self.stop_after:
            raise CloseSpider("stopped_half_way")


def main() -> None:
    config = json.loads(sys.argv[1])
    if config.get("native"):
        from tests.native_scrapy import install

        install()
    process = CrawlerProcess({**BASE_SETTINGS, **config["settings"]})
    if config.get("spider") == "follow":
        crawler = process.create_crawler(FollowSpider)
        process.crawl(crawler, urls=config["urls"], **config.get("spider_kwargs", {}))
    else:
        crawler = process.create_crawler(StoppingSpider)
        process.crawl(
            crawler,
            urls=config["urls"],
            metas=config.get("metas"),
            stop_after=config.get("stop_after"),
            follow=config.get("follow", False),
        )
    barrier = config.get("barrier")
    if barrier:
        Path(barrier["ready"]).touch()
        deadline = time.monotonic() + 60
        while not Path(barrier["go"]).exists():
            if time.monotonic() > deadline:
                raise SystemExit("crawl_process: the barrier never opened")
            time.sleep(0.01)
    process.start()
    from twisted.internet import reactor

    spider = crawler.spider
    result = {
        "responses": spider.responses,
        "failures": spider.failures,
        "unanswered": spider.unanswered(),
        "finish_reason": crawler.stats.get_value("finish_reason"),
        "reactor": f"{type(reactor).__module__}.{type(reactor).__name__}",
        "stats": {
            key: value
            for key, value in crawler.stats.get_stats().items()
            if isinstance(value, (int, float, str))
        },
    }
    throttler = getattr(crawler, "throttler", None)
    result["live_scopes"] = len(getattr(throttler, "_scope_managers", ()))
    result["throttler_class"] = _class_name(throttler)
    try:
        result["downloader_class"] = _class_name(crawler.engine.downloader)
    except (AttributeError, RuntimeError):  # no engine left after the crawl
        result["downloader_class"] = None
    result["scope_managers"] = {
        scope_id: _scope_summary(manager)
        for scope_id, manager in getattr(throttler, "_scope_managers", {}).items()
    }
    if isinstance(spider, FollowSpider):
        result["expected"] = sorted(spider.expected_urls())
        result["lost"] = sorted(spider.lost_urls())
        result["sent"] = spider.sent
    print(json.dumps(result))


def _class_name(component: Any) -> str:
    cls = type(component)
    return f"{cls.__module__}.{cls.__qualname__}"


def _scope_summary(manager: Any) -> dict[str, Any]:
    summary: dict[str, Any] = {"class": _class_name(manager)}
    get_state = getattr(manager, "get_state", None)
    if get_state is not None:
        state = get_state()
        for key in ("limit", "ceiling", "latency_samples", "best_latency"):
            if key in state:
                summary[key] = state[key]
    return summary


if __name__ == "__main__":
    main()
