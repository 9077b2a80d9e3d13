"""Spiders and the crawl helper shared by the crawl tests.

Import them as ``from tests.spiders import PagesSpider, run_crawl`` (the
``run_crawl`` fixture of ``tests/conftest.py`` is the same function). See
``tests/conftest.py`` for the test pattern that works with pytest-twisted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from scrapy import Request, Spider, signals
from scrapy.crawler import Crawler, CrawlerRunner
from scrapy.http import Response
from scrapy.spidermiddlewares.httperror import HttpError
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

#: Settings every test crawl starts from; a test's own settings override them.
BASE_SETTINGS: dict[str, Any] = {
    "LOG_LEVEL": "WARNING",
    "TELNETCONSOLE_ENABLED": False,
    "ROBOTSTXT_OBEY": False,
}


async def run_crawl(
    spider_cls: type[Spider],
    settings: dict[str, Any] | None = None,
    **spider_kwargs: Any,
) -> Crawler:
    """Run one crawl in this process, on the installed asyncio reactor.

    Returns the finished :class:`~scrapy.crawler.Crawler`: read
    ``crawler.stats.get_stats()``, ``crawler.spider`` (e.g. a
    :class:`PagesSpider`'s records), and the plugin's ``crawler.throttler``.
    ``settings`` are applied over :data:`BASE_SETTINGS`.

    Works when awaited from an asyncio task (tests decorated with Scrapy's
    ``deferred_f_from_coro_f``, the recommended pattern) and from a coroutine
    driven by Twisted (tests decorated with ``pytest_twisted.ensureDeferred``).
    """
    runner = CrawlerRunner({**BASE_SETTINGS, **(settings or {})})
    crawler = runner.create_crawler(spider_cls)
    await _wait(runner.crawl(crawler, **spider_kwargs))
    return crawler


def _wait(deferred: Deferred[Any]) -> Any:
    """Make a Deferred awaitable from whichever kind of coroutine awaits it.

    An asyncio task can only await asyncio futures, and a coroutine run by
    ``Deferred.fromCoroutine`` can only await Deferreds; the current task tells
    which of the two is running us.
    """
    try:
        in_asyncio_task = asyncio.current_task() is not None
    except RuntimeError:  # no running event loop
        in_asyncio_task = False
    if in_asyncio_task:
        return deferred.asFuture(asyncio.get_running_loop())
    return deferred


#: Scopes the index page of ``PagesSpider(follow=True)`` can get: its own,
#: or, with a manager that ignores meta, the empty netloc of its URL.
INDEX_PAGE_SCOPES = frozenset({"index-page", ""})


class PagesSpider(Spider):
    """Fetch a fixed list of URLs and record what happened to each request.

    :param urls: the URLs to fetch, each once (``dont_filter=True``, so the same
        URL may appear several times).
    :param meta: request meta shared by every request.
    :param metas: per-URL request meta, aligned with ``urls`` (merged over
        ``meta``).
    :param request_kwargs: extra :class:`~scrapy.Request` keyword arguments.

    After the crawl:

    * ``responses``: one dict per response that reached the spider, with
      ``url``, ``status``, ``time`` (``time.monotonic()``), ``download_latency``
      (``None`` if the response did not go through the downloader), ``index``
      (position in ``urls``) and ``http_error`` (``True`` for non-2xx responses
      that Scrapy's HttpError middleware turned into errors);
    * ``failures``: one dict per request that ended in an error without a
      response: ``url``, ``index``, ``time``, ``error`` (exception class name),
      ``message``;
    * :meth:`unanswered`: indexes of URLs with neither, which must be empty
      when no request was lost;
    * ``sent``: ``[time, path]`` of every request of ``urls`` (retries and
      redirects included, the index page of ``follow`` mode left out) when
      Scrapy handed it to the downloader (``request_reached_downloader``):
      its send, free of the transit jitter of the server's arrival times.

    With ``follow=True`` (default: :attr:`follow_by_default`), no URL is a
    start request: the only start request is an index page (a ``data:`` URL,
    in a scope of its own, so that no host sees it), whose callback yields
    every URL, in order. The same requests then come from a callback, the
    way most crawls find their pages, with the engine running, instead of
    being queued before the crawl starts; the ``spider_modes`` fixture also
    makes the scheduler FIFO (Scrapy's breadth-first setting), so that they
    are crawled in page order, as start requests are.
    (:class:`FollowSpider` builds deeper link trees.)
    """

    name = "pages"
    #: Default of ``follow``; the ``spider_modes`` fixture of a test module
    #: sets it to run the module's crawls both ways.
    follow_by_default = False

    def __init__(
        self,
        urls: Sequence[str] = (),
        meta: dict[str, Any] | None = None,
        metas: Sequence[dict[str, Any]] | None = None,
        request_kwargs: dict[str, Any] | None = None,
        follow: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.follow = self.follow_by_default if follow is None else follow
        self.urls = list(urls)
        self.common_meta = dict(meta or {})
        self.metas = list(metas) if metas is not None else None
        if self.metas is not None and len(self.metas) != len(self.urls):
            raise ValueError("metas must have one entry per URL")
        self.request_kwargs = dict(request_kwargs or {})
        self.responses: list[dict[str, Any]] = []
        self.failures: list[dict[str, Any]] = []
        self.sent: list[list[Any]] = []

    @classmethod
    def from_crawler(cls, crawler: Crawler, *args: Any, **kwargs: Any) -> Any:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(
            spider._record_send, signal=signals.request_reached_downloader
        )
        return spider

    def _record_send(self, request: Request) -> None:
        if "pages_index" in request.meta:
            self.sent.append([time.monotonic(), urlparse_cached(request).path])

    async def start(self) -> AsyncIterator[Any]:
        if self.follow:
            yield Request(
                "data:,index",
                callback=self.parse_index,
                dont_filter=True,
                meta={"throttling_scopes": "index-page", "dont_cache": True},
            )
            return
        for index in range(len(self.urls)):
            yield self.request_for(index)

    def parse_index(self, response: Response) -> Any:
        """The index page of ``follow`` mode: it links to every URL."""
        for index in range(len(self.urls)):
            yield self.request_for(index)

    def request_for(self, index: int) -> Request:
        """The request of ``urls[index]``."""
        meta = dict(self.common_meta)
        if self.metas is not None:
            meta.update(self.metas[index])
        meta["pages_index"] = index
        return Request(
            self.urls[index],
            callback=self.parse,
            errback=self.on_error,
            dont_filter=True,
            meta=meta,
            **self.request_kwargs,
        )

    def _record_response(self, response: Response, *, http_error: bool) -> None:
        meta = response.meta
        self.responses.append(
            {
                "url": response.url,
                "status": response.status,
                "time": time.monotonic(),
                "download_latency": meta.get("download_latency"),
                "index": meta.get("pages_index"),
                "http_error": http_error,
            }
        )

    def parse(self, response: Response, **kwargs: Any) -> None:
        self._record_response(response, http_error=False)

    def on_error(self, failure: Failure) -> None:
        if isinstance(failure.value, HttpError):
            self._record_response(failure.value.response, http_error=True)
            return
        request = getattr(failure, "request", None)
        self.failures.append(
            {
                "url": request.url if request is not None else None,
                "index": request.meta.get("pages_index")
                if request is not None
                else None,
                "time": time.monotonic(),
                "error": type(failure.value).__name__,
                "message": str(failure.value),
            }
        )

    @property
    def statuses(self) -> list[int]:
        """Status of every response, in arrival order."""
        return [entry["status"] for entry in self.responses]

    def unanswered(self) -> list[int]:
        """Indexes of ``urls`` that got neither a response nor a failure."""
        seen = {entry["index"] for entry in self.responses}
        seen.update(entry["index"] for entry in self.failures)
        return [index for index in range(len(self.urls)) if index not in seen]


class FollowSpider(PagesSpider):
    """Follow links yielded from callbacks: a tree of pages below each seed.

    Every response to a page at depth ``d < depth`` yields ``fanout`` child
    requests from the callback (``/follow/<depth left>/<id>`` paths, so that
    nothing is queued at start but the seeds). Children go to the seed's host,
    or round-robin to ``child_hosts`` (base URLs) when given; ``child_query``
    is appended to every child URL (e.g. ``"delay=0.05"`` or ``"status=503"``),
    and ``child_queries`` (page id to query) to the pages it names, instead
    (e.g. ``{"0.1": "status=429"}``: one page the host always refuses).
    With ``block_at`` (a count of responses), the callback of that response
    blocks the event loop for ``block_seconds`` (``time.sleep``), as a spider
    doing blocking work in a callback does.

    ``sent`` holds every request to a host (not only the seeds) at
    ``request_reached_downloader``. :meth:`expected_urls` is every URL the
    crawl must reach; a request that
    vanished is one of them with neither a response nor a failure
    (:meth:`lost_urls`).
    """

    name = "follow"

    def __init__(
        self,
        urls: Sequence[str] = (),
        depth: int = 2,
        fanout: int = 2,
        child_hosts: Sequence[str] | None = None,
        child_query: str = "",
        *,
        child_queries: dict[str, str] | None = None,
        block_at: int = 0,
        block_seconds: float = 0.0,
        **kwargs: Any,
    ) -> None:
        seeds = [self._page_url(url, depth, str(i)) for i, url in enumerate(urls)]
        # Its own links, never PagesSpider's follow mode.
        super().__init__(urls=seeds, follow=False, **kwargs)
        self.depth = depth
        self.fanout = fanout
        self.child_hosts = list(child_hosts or [])
        self.child_query = child_query
        self.child_queries = dict(child_queries or {})
        self.block_at = block_at
        self.block_seconds = block_seconds

    @staticmethod
    def _page_url(base: str, depth_left: int, page_id: str, query: str = "") -> str:
        url = f"{_base(base)}/follow/{depth_left}/{page_id}"
        return f"{url}?{query}" if query else url

    def _children(self, base: str, depth_left: int, page_id: str) -> list[str]:
        if depth_left <= 0:
            return []
        children = []
        for k in range(self.fanout):
            child_id = f"{page_id}.{k}"
            child_base = base
            if self.child_hosts:
                child_base = self.child_hosts[
                    sum(map(ord, child_id)) % len(self.child_hosts)
                ]
            query = self.child_queries.get(child_id, self.child_query)
            children.append(self._page_url(child_base, depth_left - 1, child_id, query))
        return children

    def expected_urls(self) -> set[str]:
        """Every URL the crawl must reach: the seeds, and the children of
        every page that was answered (a page that failed has none)."""
        expected = set(self.urls)
        for entry in self.responses:
            expected.update(self._children(*self._parse_url(entry["url"])))
        return expected

    @staticmethod
    def _parse_url(url: str) -> tuple[str, int, str]:
        depth_left, page_id = (
            url.split("/follow/", 1)[1].split("?", maxsplit=1)[0].split("/")
        )
        return _base(url), int(depth_left), page_id

    def _record_send(self, request: Request) -> None:
        # Every request to a host (seeds, followed links, retries and
        # redirects): this spider's pages carry no ``pages_index``.
        if request.url.startswith("http"):
            self.sent.append([time.monotonic(), urlparse_cached(request).path])

    def lost_urls(self) -> set[str]:
        """Expected URLs that got neither a response nor a failure."""
        seen = {entry["url"] for entry in self.responses}
        seen.update(entry["url"] for entry in self.failures)
        return self.expected_urls() - seen

    def _follow(self, url: str) -> list[Request]:
        return [
            Request(
                child,
                callback=self.parse,
                errback=self.on_error,
                dont_filter=True,
                meta=dict(self.common_meta),
                **self.request_kwargs,
            )
            for child in self._children(*self._parse_url(url))
        ]

    def parse(self, response: Response, **kwargs: Any) -> Any:  # type: ignore[override]
        self._record_response(response, http_error=False)
        if self.block_at and len(self.responses) == self.block_at:
            time.sleep(self.block_seconds)
        return self._follow(response.url)

    def on_error(self, failure: Failure) -> Any:
        super().on_error(failure)
        if isinstance(failure.value, HttpError):
            return self._follow(failure.value.response.url)
        return None


def _base(url: str) -> str:
    """``scheme://netloc`` of *url*."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"
