"""The CPU cost of watching a crawl: progress line, gauges and timeline.

``python -m bench.observe_cost`` crawls one simulated host with the add-on,
every request in a scope of its own among ``--scopes`` live scopes (created
before the crawl, so the passes over them see all of them), twice per round:
once with the diagnostics extension switched off, once with the progress
line, the gauges and the timeline file on (with :setting:`LOGSTATS_INTERVAL`
at 10 s by default, six times Scrapy's default, so the pass over every scope
runs often).
Each crawl runs in its own process, from the first request to the close.

Two figures. The first, from the crawls with observation alone: the CPU time
spent inside the extension (each entry point timed with
``time.process_time``) against the crawl's whole CPU time, i.e. the ratio of
CPU seconds with and without observation within one crawl, free of the
machine's noise. The second compares the CPU time of the separate crawls
with and without; on a shared machine two crawls differ by more than the
cost measured, so it is a sanity check only.

    python -m bench.observe_cost --scopes 100000 --requests 30000 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from scrapy import Request, Spider

from scrapy_adaptive_throttle._diagnostics import ThrottlingDiagnostics
from simhosts import SimHosts

ROOT = Path(__file__).resolve().parents[1]
DIAGNOSTICS = "scrapy_adaptive_throttle._diagnostics.ThrottlingDiagnostics"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class MeasuredDiagnostics(ThrottlingDiagnostics):
    """The extension, with the CPU time of each of its entry points summed
    (``time.process_time``; signal dispatch to it is not included)."""

    cpu: dict[str, float] = {}

    def _timed(self, name: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return method(*args, **kwargs)
        finally:
            self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - start

    def response_downloaded(self, response: Any, request: Any) -> None:
        self._timed("response", super().response_downloaded, response, request)

    def report_progress(self) -> Any:
        return self._timed("progress", super().report_progress)

    def sample_timeline(self) -> None:
        self._timed("timeline", super().sample_timeline)

    def spider_closed(self) -> None:
        self._timed("close", super().spider_closed)


class ManyScopesSpider(Spider):
    name = "many_scopes"

    def __init__(self, url: str, scopes: int, requests: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.url = url
        self.scopes = scopes
        self.requests = requests
        self.responses = 0
        self.cpu_start = 0.0
        self.wall_start = 0.0

    async def start(self) -> AsyncIterator[Any]:
        throttler: Any = self.crawler.throttler  # type: ignore[attr-defined]
        for index in range(self.scopes):
            throttler.get_scope_manager(f"s{index}")
        self.cpu_start = _cpu()
        self.wall_start = time.monotonic()
        for index in range(self.requests):
            scope = f"s{index % self.scopes}"
            yield Request(
                f"{self.url}/page/{index}",
                meta={"throttling_scopes": scope},
                dont_filter=True,
            )

    def parse(self, response: Any) -> None:
        self.responses += 1


def run_one(config: dict[str, Any]) -> dict[str, Any]:
    """One crawl in this process; its CPU seconds and responses."""
    from scrapy.crawler import CrawlerProcess

    settings: dict[str, Any] = {
        "ADDONS": {"scrapy_adaptive_throttle.Addon": 500},
        "LOG_LEVEL": "INFO",
        "LOGSTATS_INTERVAL": config["logstats_interval"],
        "TELNETCONSOLE_ENABLED": False,
        "ROBOTSTXT_OBEY": False,
        "RETRY_ENABLED": False,
        "CONCURRENT_REQUESTS": 64,
        "DOWNLOAD_DELAY": 0,
        "THROTTLING_SCOPE_LIMIT": config["scopes"] * 2,
    }
    if config["observe"]:
        settings["THROTTLING_TIMELINE_FILE"] = config["timeline"]
        settings["EXTENSIONS"] = {
            DIAGNOSTICS: None,
            "bench.observe_cost.MeasuredDiagnostics": 0,
        }
    else:
        settings["EXTENSIONS"] = {DIAGNOSTICS: None}
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(ManyScopesSpider)
    process.crawl(
        crawler,
        url=config["url"],
        scopes=config["scopes"],
        requests=config["requests"],
    )
    process.start()
    spider = crawler.spider
    assert isinstance(spider, ManyScopesSpider)
    throttler: Any = crawler.throttler  # type: ignore[attr-defined]
    # The class Scrapy loaded by its path, not this script's __main__ copy.
    from bench.observe_cost import MeasuredDiagnostics as measured

    return {
        "observe": config["observe"],
        "cpu": _cpu() - spider.cpu_start,
        "wall": time.monotonic() - spider.wall_start,
        "responses": spider.responses,
        "live_scopes": len(throttler._scope_managers),
        "observe_cpu": {k: round(v, 4) for k, v in measured.cpu.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scopes", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--logstats-interval",
        type=float,
        default=10.0,
        help="LOGSTATS_INTERVAL of both crawls (Scrapy's default: 60)",
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(json.loads(args.one))))
        return
    hosts = SimHosts([{"name": "A", "kind": "unlimited"}]).start()
    results: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for round_number in range(args.rounds):
                # Alternate the order so that a drift in the machine's load
                # does not always favour the same configuration.
                order = (False, True) if round_number % 2 == 0 else (True, False)
                for observe in order:
                    config = {
                        "observe": observe,
                        "url": hosts.url("A").rstrip("/"),
                        "scopes": args.scopes,
                        "requests": args.requests,
                        "logstats_interval": args.logstats_interval,
                        "timeline": str(Path(tmp) / f"timeline-{round_number}.jsonl"),
                    }
                    completed = subprocess.run(
                        [
                            sys.executable,
                            "-m",
                            "bench.observe_cost",
                            "--one",
                            json.dumps(config),
                        ],
                        cwd=ROOT,
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    result = json.loads(completed.stdout.strip().splitlines()[-1])
                    if observe:
                        timeline = Path(config["timeline"])
                        result["timeline_lines"] = len(
                            timeline.read_text().splitlines()
                        )
                        result["progress_lines"] = completed.stderr.count(
                            "Throttling: "
                        )
                    results.append(result)
                    print(json.dumps(result), flush=True)
    finally:
        hosts.stop()
    off = sum(r["cpu"] for r in results if not r["observe"])
    on = sum(r["cpu"] for r in results if r["observe"])
    inside = sum(sum(r["observe_cpu"].values()) for r in results if r["observe"])
    print(
        f"scopes {args.scopes}, requests {args.requests}, rounds {args.rounds}: "
        f"in the crawls with observation, {inside:.3f} of {on:.2f} CPU s were "
        f"spent observing: with / without = {on / (on - inside):.4f}; "
        f"separate crawls (noisier): without {off:.2f}, with {on:.2f}, "
        f"ratio {on / off:.4f}"
    )


if __name__ == "__main__":
    main()
