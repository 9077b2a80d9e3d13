"""One benchmark crawl, run in its own process: ``python -m bench.crawl``.

The runner (:mod:`bench.run`) starts one of these per configuration so that
every crawl gets a fresh reactor and a fresh Scrapy, and nothing measured in
one run depends on another. The config (JSON, a file or ``-`` for stdin)::

    {
      "hosts": [{"name": "A", "url": "http://127.0.0.1:PORT", "pages": 2000,
                 "meta": {...}}],      # meta: optional, of every request
      "settings": {...},          # Scrapy settings over CRAWL_BASE_SETTINGS
      "sample_interval": 0.1,     # seconds between samples of scope state
      "per_host_slots": true,     # one Scrapy download slot per host:port
      "max_seconds": 0            # > 0: close the spider after that long
    }

The result (JSON on stdout, or in ``--output``) has, per host: pages fetched
(status 200), pages/s from the first request sent to the last page received,
the 503 and 429 responses seen, the median and p90 ``download_latency`` of the
200 responses, the epoch time of every 200 (for timelines aligned with the
server's clock), samples of the requests in flight (``[epoch, on the wire, in
the downloader]``), and, when the plugin is enabled, samples of
``crawler.throttler.get_scope_state(scope)`` every ``sample_interval``; for the
whole crawl, ``crawl_cpu_seconds``: the process CPU time from spider_opened
to spider_closed (without interpreter start-up and imports).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from scrapy import Request, Spider, signals
from scrapy.crawler import Crawler, CrawlerProcess
from scrapy.http import Response
from twisted.internet import task

#: Settings of every benchmark crawl; a configuration's settings override them.
CRAWL_BASE_SETTINGS: dict[str, Any] = {
    "CONCURRENT_REQUESTS": 128,
    "DOWNLOAD_DELAY": 0,
    "ROBOTSTXT_OBEY": False,
    "COOKIES_ENABLED": False,
    "TELNETCONSOLE_ENABLED": False,
    # Every page must eventually be fetched, as in the guide, however many
    # 503/429 answers it takes.
    "RETRY_TIMES": 1000,
    "RETRY_HTTP_CODES": [500, 502, 503, 504, 522, 524, 408, 429],
    "LOG_LEVEL": "WARNING",
}

#: Keys of ``get_scope_state()`` kept in the samples, in this order.
STATE_KEYS = ("limit", "in_flight", "best_latency", "delay", "learned_interval")


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile (``fraction`` in [0, 1]); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def _json_scalar(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return str(value)


class HostRecord:
    """What the crawl saw of one simulated host."""

    def __init__(self, name: str, netloc: str, pages: int) -> None:
        self.name = name
        self.netloc = netloc
        self.pages_requested = pages
        self.first_sent: float | None = None
        self.done_times: list[float] = []
        self.latencies: list[float] = []
        self.statuses: Counter[int] = Counter()
        self.in_flight = 0
        self.download_errors: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.failure_examples: dict[str, str] = {}
        self.inflight_samples: list[list[float]] = []
        self.state_samples: list[dict[str, Any]] = []

    def result(self) -> dict[str, Any]:
        pages = len(self.done_times)
        elapsed = (
            self.done_times[-1] - self.first_sent
            if pages and self.first_sent is not None
            else 0.0
        )
        return {
            "netloc": self.netloc,
            "pages_requested": self.pages_requested,
            "pages": pages,
            "pages_per_second": pages / elapsed if elapsed > 0 else 0.0,
            "elapsed": elapsed,
            "first_sent_epoch": self.first_sent,
            "last_page_epoch": self.done_times[-1] if pages else None,
            "count_503": self.statuses.get(503, 0),
            "count_429": self.statuses.get(429, 0),
            "status_counts": {str(k): v for k, v in sorted(self.statuses.items())},
            "download_errors": sum(self.download_errors.values()),
            "download_error_types": dict(self.download_errors),
            "failures": dict(self.failures),
            "failure_examples": self.failure_examples,
            "latency_p50": percentile(self.latencies, 0.5),
            "latency_p90": percentile(self.latencies, 0.9),
            "done_epochs": [round(t, 4) for t in self.done_times],
            "inflight_samples": self.inflight_samples,
            "state_samples": self.state_samples,
        }


class BenchSpider(Spider):
    """Fetch ``pages`` distinct pages from each host, hosts interleaved.

    Interleaving the start requests keeps every host busy from the start, as a
    crawl of several sites would; the measurements come from signals, so the
    callback does nothing.
    """

    name = "bench"

    def __init__(
        self,
        hosts: list[dict[str, Any]] | None = None,
        per_host_slots: bool = True,
        sample_interval: float = 0.1,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.host_configs = hosts or []
        self.per_host_slots = per_host_slots
        self.sample_interval = sample_interval
        self.records: dict[str, HostRecord] = {}
        for host in self.host_configs:
            netloc = urlsplit(host["url"]).netloc
            self.records[netloc] = HostRecord(host["name"], netloc, int(host["pages"]))
        self.sampler: Any = None
        self.sampler_status = "not started"
        self.opened_epoch: float | None = None
        # Process CPU seconds (user + system) at spider_opened / spider_closed:
        # the crawl's own CPU cost, without interpreter start-up and imports.
        self.opened_cpu: float | None = None
        self.closed_cpu: float | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler, *args: Any, **kwargs: Any) -> BenchSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        connect = crawler.signals.connect
        connect(spider.on_opened, signals.spider_opened)
        connect(spider.on_closed, signals.spider_closed)
        connect(spider.on_reached_downloader, signals.request_reached_downloader)
        connect(spider.on_left_downloader, signals.request_left_downloader)
        # response_downloaded fires before the downloader middlewares, so it
        # sees the 503s and 429s that RetryMiddleware turns into retries.
        connect(spider.on_response_downloaded, signals.response_downloaded)
        return spider

    async def start(self) -> AsyncIterator[Any]:
        queues = [
            (host, self.records[urlsplit(host["url"]).netloc])
            for host in self.host_configs
        ]
        for index in range(
            max((int(h["pages"]) for h in self.host_configs), default=0)
        ):
            for host, record in queues:
                if index < record.pages_requested:
                    meta = (
                        {"download_slot": record.netloc} if self.per_host_slots else {}
                    )
                    meta.update(host.get("meta", {}))
                    yield Request(
                        f"{host['url']}/page/{index}",
                        callback=self.parse,
                        errback=self.on_error,
                        dont_filter=True,
                        meta=meta,
                    )

    def parse(self, response: Response, **kwargs: Any) -> None:
        return None

    def on_error(self, failure: Any) -> None:
        request = getattr(failure, "request", None)
        record = self._record(request) if request is not None else None
        if record is not None:
            name = type(failure.value).__name__
            record.failures[name] += 1
            record.failure_examples.setdefault(name, str(failure.value)[:300])

    def _record(self, request: Request) -> HostRecord | None:
        return self.records.get(urlsplit(request.url).netloc)

    # -- signals -----------------------------------------------------------

    def on_reached_downloader(self, request: Request, spider: Spider) -> None:
        record = self._record(request)
        if record is None:
            return
        record.in_flight += 1
        if record.first_sent is None:
            record.first_sent = time.time()

    def on_left_downloader(self, request: Request, spider: Spider) -> None:
        record = self._record(request)
        if record is not None:
            record.in_flight -= 1

    def on_response_downloaded(
        self, response: Response, request: Request, spider: Spider
    ) -> None:
        record = self._record(request)
        if record is None:
            return
        status = response.status
        record.statuses[status] += 1
        if status == 200:
            record.done_times.append(time.time())
            latency = request.meta.get("download_latency")
            if latency is not None:
                record.latencies.append(latency)

    def on_opened(self, spider: Spider) -> None:
        self.opened_epoch = time.time()
        self.opened_cpu = time.process_time()
        self.sampler = task.LoopingCall(self.sample)
        self.sampler.start(self.sample_interval, now=True)
        self.sampler_status = "ok"

    def on_closed(self, spider: Spider, reason: str) -> None:
        self.closed_cpu = time.process_time()
        if self.sampler is not None and self.sampler.running:
            self.sampler.stop()

    def count_transferring(self) -> Counter[str]:
        """Requests on the wire per host:port, from Scrapy's download slots.

        Requests that reached the downloader may still wait in a slot's queue
        (e.g. behind AutoThrottle's delay); only ``transferring`` ones are
        actually sent.
        """
        counts: Counter[str] = Counter()
        downloader = getattr(self.crawler.engine, "downloader", None)
        for slot in list(getattr(downloader, "slots", {}).values()):
            for request in list(getattr(slot, "transferring", ())):
                counts[urlsplit(request.url).netloc] += 1
        return counts

    def sample(self) -> None:
        now = round(time.time(), 4)
        # The plugin is being written alongside this benchmark: sample its
        # state only if it exposes the diagnostic hook, and never let a broken
        # hook stop the crawl.
        throttler = getattr(self.crawler, "throttler", None)
        get_state = getattr(throttler, "get_scope_state", None)
        if throttler is None:
            self.sampler_status = "no crawler.throttler"
        elif get_state is None:
            self.sampler_status = "crawler.throttler has no get_scope_state"
        transferring = self.count_transferring()
        for record in self.records.values():
            record.inflight_samples.append(
                [now, transferring.get(record.netloc, 0), record.in_flight]
            )
            if get_state is None:
                continue
            try:
                state = get_state(record.netloc)
            except Exception as exc:
                self.sampler_status = f"get_scope_state failed: {exc!r}"
                continue
            if not state:
                continue
            sample = {"t": now}
            for key in STATE_KEYS:
                sample[key] = _json_scalar(state.get(key))
            record.state_samples.append(sample)


class DownloadErrorCounter:
    """Downloader middleware counting download exceptions per host.

    Placed next to the downloader, so it sees every exception before
    RetryMiddleware turns it into a retry; it only has ``process_exception``,
    so it costs nothing on normal responses.
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> DownloadErrorCounter:
        return cls(crawler)

    def process_exception(self, request: Request, exception: Exception) -> None:
        # Duck-typed: under ``python -m`` the spider class lives in __main__.
        records = getattr(self.crawler.spider, "records", {})
        record = records.get(urlsplit(request.url).netloc)
        if record is not None:
            record.download_errors[type(exception).__name__] += 1


def run(config: dict[str, Any]) -> dict[str, Any]:
    """Run the crawl described by ``config``; return the result dict."""
    settings = {**CRAWL_BASE_SETTINGS, **config.get("settings", {})}
    settings["DOWNLOADER_MIDDLEWARES"] = {
        **settings.get("DOWNLOADER_MIDDLEWARES", {}),
        f"{__name__}.DownloadErrorCounter": 990,
    }
    if config.get("max_seconds"):
        settings["CLOSESPIDER_TIMEOUT"] = float(config["max_seconds"])
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(BenchSpider)
    crawl = process.crawl(
        crawler,
        hosts=config["hosts"],
        per_host_slots=config.get("per_host_slots", True),
        sample_interval=float(config.get("sample_interval", 0.1)),
    )
    failures: list[Any] = []
    crawl.addErrback(failures.append)
    started = time.time()
    process.start()
    wall = time.time() - started
    if failures or getattr(crawler, "spider", None) is None:
        # Make the cause the last thing on stderr: the runner shows the tail.
        if failures:
            failures[0].printTraceback(file=sys.stderr)
            raise SystemExit(f"crawl failed: {failures[0].getErrorMessage()}")
        raise SystemExit("crawl failed: the spider was never created")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    spider: BenchSpider = crawler.spider  # type: ignore[assignment]
    stats = crawler.stats.get_stats() if crawler.stats else {}
    return {
        "hosts": {record.name: record.result() for record in spider.records.values()},
        "wall": wall,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "crawl_cpu_seconds": (
            spider.closed_cpu - spider.opened_cpu
            if spider.opened_cpu is not None and spider.closed_cpu is not None
            else None
        ),
        "opened_epoch": spider.opened_epoch,
        "finish_reason": stats.get("finish_reason"),
        "sampler": spider.sampler_status,
        "plugin": hasattr(crawler, "throttler"),
        "stats": {
            key: _json_scalar(value)
            for key, value in stats.items()
            if key.startswith(("throttling/", "retry/", "downloader/response_status"))
            or key
            in ("finish_reason", "elapsed_time_seconds", "downloader/request_count")
        },
    }


def start_in_subprocess(
    crawl_config: dict[str, Any],
    output: Path,
    *,
    module: Sequence[str] = ("bench.crawl",),
) -> subprocess.Popen[str]:
    """Start one crawl in a fresh process, writing its result to *output*,
    and return the running process (its stderr piped, for the caller to read
    before it waits). *module*: ``python -m`` arguments before ``--config``
    (a module that takes this one's options, such as ``bench.shared_trace``).
    """
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", *module),
            *("--config", "-", "--output", str(output)),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert process.stdin is not None
    process.stdin.write(json.dumps(crawl_config))
    process.stdin.close()
    return process


def run_in_subprocess(
    crawl_config: dict[str, Any], *, timeout: float, cwd: Path | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    """Run one crawl in a fresh process (a fresh reactor each time) and
    return the finished process and its result (``None`` if it failed).
    *cwd*: another checkout of the project (e.g. a ``git worktree`` of an
    earlier commit), whose package and ``bench.crawl`` the crawl runs.

    Raises :exc:`subprocess.TimeoutExpired` past *timeout* seconds.
    """
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "result.json"
        process = subprocess.run(
            [
                *(sys.executable, "-m", "bench.crawl"),
                *("--config", "-", "--output", str(output)),
            ],
            input=json.dumps(crawl_config),
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            cwd=cwd or Path(__file__).resolve().parent.parent,
        )
        result = None
        if process.returncode == 0 and output.exists():
            result = json.loads(output.read_text())
    return process, result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.crawl", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--config", required=True, help="JSON file, or '-' for stdin")
    parser.add_argument("--output", help="write the result here instead of stdout")
    args = parser.parse_args(argv)
    text = sys.stdin.read() if args.config == "-" else Path(args.config).read_text()
    result = run(json.loads(text))
    output = json.dumps(result)
    if args.output:
        Path(args.output).write_text(output)
    else:
        sys.stdout.write(output + "\n")


if __name__ == "__main__":
    main()
