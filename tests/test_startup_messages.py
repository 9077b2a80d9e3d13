"""What a user sees at start-up and at close: a `scrapy startproject`
project, invalid settings, and settings that silently undo the plugin.

The subprocess tests run ``scrapy startproject`` and ``scrapy crawl`` as a
user would, against a simulated host; the others crawl in this process and
read the log.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.engine_crawls import ADDON
from tests.spiders import PagesSpider, run_crawl

ROOT = Path(__file__).resolve().parents[1]
CRAWL = (sys.executable, "-m", "scrapy", "crawl", "pages")
EPOLL = "twisted.internet.epollreactor.EPollReactor"
SPIDER = """
import scrapy


class PagesSpider(scrapy.Spider):
    name = "pages"

    def __init__(self, url, **kwargs):
        super().__init__(**kwargs)
        self.url = url

    async def start(self):
        yield scrapy.Request(self.url + "index")

    def parse(self, response):
        for i in range(3):
            yield scrapy.Request(f"{self.url}page{i}", callback=self.parse_page)

    def parse_page(self, response):
        yield {"page": response.url}
"""


def readme_settings_block() -> str:
    """The README's settings block for a `startproject` project."""
    text = (ROOT / "README.rst").read_text()
    blocks = re.findall(r"\.\. code-block:: python\n\n((?:    .*\n|\n)+)", text)
    block = next(b for b in blocks if "appended to the end of settings.py" in b)
    return "\n".join(line[4:] for line in block.splitlines()) + "\n"


def new_project(tmp_path: Path, settings: str) -> Path:
    """``scrapy startproject demo`` with *settings* appended to its
    settings.py, and a spider that follows links from its callback."""
    subprocess.run(
        [sys.executable, "-m", "scrapy", "startproject", "demo"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    project = tmp_path / "demo"
    with (project / "demo" / "settings.py").open("a") as file:
        file.write("\n" + settings)
    (project / "demo" / "spiders" / "pages.py").write_text(SPIDER)
    return project


def scrapy_crawl(
    project: Path, url: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """``scrapy crawl pages -a url=URL`` in *project*, as a user runs it."""
    return subprocess.run(
        [*CRAWL, "-a", f"url={url}", "-s", "LOG_LEVEL=INFO", *args],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def host(simhosts) -> str:
    return simhosts({"name": "A", "kind": "unlimited", "service_time": 0.005}).url(
        "A", "/"
    )


@pytest.mark.parametrize("reactor", ["asyncio", "epoll"])
def test_the_template_as_is_gets_a_warning_that_says_what_to_change(
    tmp_path, simhosts, reactor
):
    project = new_project(tmp_path, f"ADDONS = {ADDON!r}\n")
    args = ["-s", f"TWISTED_REACTOR={EPOLL}"] if reactor == "epoll" else []
    result = scrapy_crawl(project, host(simhosts), *args)
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line]
    delay = [line for line in warnings if "DOWNLOAD_DELAY = 1 " in line]
    assert len(delay) == 1, warnings
    assert "CONCURRENT_REQUESTS_PER_DOMAIN = 1" in delay[0]
    assert "'item_scraped_count': 3" in result.stderr


def test_the_readme_settings_block_works_on_a_new_project(tmp_path, simhosts):
    project = new_project(tmp_path, readme_settings_block())
    result = scrapy_crawl(project, host(simhosts))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "'item_scraped_count': 3" in result.stderr
    # Nothing left to warn about, but the example scope the crawl never met.
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1, warnings
    assert "THROTTLING_SCOPES entries that matched no request" in warnings[0]
    assert "'api.example.com'" in warnings[0]


@pytest.mark.parametrize("reactor", ["asyncio", "epoll"])
@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            'THROTTLING_SCOPES = {"api": {"delay": "soon"}}',
            "Invalid THROTTLING_SCOPES['api']['delay'] value 'soon': expected a number",
        ),
        (
            'THROTTLING_SCOPES = {"example.com": {"concurency": 4}}',
            "Unknown key 'concurency' in THROTTLING_SCOPES['example.com'] (value 4); "
            "accepted keys: backoff, concurrency,",
        ),
        ("THROTTLING_STATS_SCOPES = -1", "Invalid THROTTLING_STATS_SCOPES value -1"),
        (
            'DOWNLOADER = "scrapy.core.downloader.Downloader"',
            "Invalid DOWNLOADER value 'scrapy.core.downloader.Downloader'",
        ),
    ],
)
def test_an_invalid_setting_fails_at_start_up_with_one_message(
    tmp_path, simhosts, reactor, setting, message
):
    url = host(simhosts)
    project = new_project(tmp_path, f"ADDONS = {ADDON!r}\n{setting}\n")
    args = ["-s", f"TWISTED_REACTOR={EPOLL}"] if reactor == "epoll" else []
    result = scrapy_crawl(project, url, *args)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if " ERROR: " in line]
    assert len(errors) == 1, result.stderr[-3000:]
    assert message in errors[0]
    assert "Spider opened" not in result.stderr
    assert simhosts_requests(url) == 0
    assert "Task exception was never retrieved" not in result.stderr
    if reactor == "asyncio":
        # Scrapy's default reactor: that line is all there is.
        assert "Traceback" not in result.stderr, result.stderr[-3000:]


def simhosts_requests(url: str) -> int:
    """Requests the simulated host of *url* received."""
    import json
    import urllib.request

    with urllib.request.urlopen(url + "_stats") as response:
        return int(json.load(response)["requests"])


# -- in-process crawls: warnings at start-up and at close ---------------------------


def _warnings(caplog) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING
        and record.name.startswith("scrapy_adaptive_throttle")
    ]


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.ScrapyPriorityQueue"}, True),
        ({"SCHEDULER": "tests.plugin_components.FifoScheduler"}, True),
        ({}, False),
    ],
)
@deferred_f_from_coro_f
async def test_a_crawl_without_the_throttling_queue_says_what_it_costs(
    simhosts, caplog, settings, expected
):
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.005})
    caplog.set_level(logging.WARNING)
    crawler = await run_crawl(
        PagesSpider,
        {"ADDONS": ADDON, "DOWNLOAD_DELAY": 0, **settings},
        urls=[hosts.url("A", f"/{i}") for i in range(5)],
        follow=True,
    )
    assert crawler.spider.unanswered() == []
    queue = [text for text in _warnings(caplog) if "head-of-line blocking" in text]
    if expected:
        assert len(queue) == 1
        name = next(iter(settings))
        assert queue[0].startswith(f"{name} is {settings[name]!r}")
    else:
        assert queue == []


@deferred_f_from_coro_f
async def test_scopes_that_matched_no_request_are_named_with_a_hint(simhosts, caplog):
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.005})
    netloc = hosts.netloc("A")
    caplog.set_level(logging.WARNING)
    crawler = await run_crawl(
        PagesSpider,
        {
            "ADDONS": ADDON,
            "DOWNLOAD_DELAY": 0,
            "THROTTLING_SCOPES": {
                "127.0.0.1": {"concurrency": 2},
                f"http://{netloc}": {"delay": 1},
                netloc: {"concurrency": 3},
            },
        },
        urls=[hosts.url("A", f"/{i}") for i in range(5)],
        follow=True,
    )
    assert crawler.spider.unanswered() == []
    unmatched = [text for text in _warnings(caplog) if "matched no request" in text]
    assert len(unmatched) == 1
    assert f"'127.0.0.1' (closest scope of the crawl: '{netloc}')" in unmatched[0]
    assert (
        f"'http://{netloc}' (closest scope of the crawl: '{netloc}')" in (unmatched[0])
    )
    assert f"'{netloc}';" not in unmatched[0]
    assert not unmatched[0].endswith(f"'{netloc}'")
