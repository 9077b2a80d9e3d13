"""Shared fixtures: simulated hosts and in-process crawls.

pytest runs with ``--reactor=asyncio`` (pytest-twisted installs Twisted's
``AsyncioSelectorReactor`` and runs every test inside the reactor), so Scrapy
crawls run in the test process. The pattern for a crawl test::

    from scrapy.utils.defer import deferred_f_from_coro_f

    from tests.spiders import PagesSpider, run_crawl


    @deferred_f_from_coro_f
    async def test_all_pages_answered(simhosts):
        hosts = simhosts({"name": "A", "kind": "unlimited"})
        urls = [hosts.url("A", f"/page/{i}") for i in range(20)]
        crawler = await run_crawl(PagesSpider, {"CONCURRENT_REQUESTS": 4}, urls=urls)
        assert crawler.spider.unanswered() == []

``@deferred_f_from_coro_f`` (Scrapy) runs the test coroutine as an asyncio
task, so inside it ``await asyncio.sleep(...)``, asyncio futures and Scrapy's
coroutine APIs work; await a Deferred there with
``scrapy.utils.defer.maybe_deferred_to_future(d)``. This is the recommended
pattern. ``@pytest_twisted.ensureDeferred`` (and a plain undecorated
``async def``, which pytest-twisted 1.14 also runs) drive the coroutine with
Twisted instead: ``run_crawl`` and Deferreds can be awaited, but
``asyncio.sleep`` fails with "await wasn't used with future". Checked with
pytest-twisted 1.14.3, Scrapy 2.19.0, Twisted 26.10.

Blocking calls (``SimHosts.stats()``, ``urllib``) are fine in tests: the
simulated hosts live in a subprocess, so blocking the reactor briefly does not
stop them from answering.

Good to know when writing crawl tests: every simulated host is 127.0.0.1 on
its own port, so Scrapy's own download slots (keyed by hostname) put them all
in one slot, while the plugin's default scopes (``hosts.netloc(name)``,
``127.0.0.1:PORT``) tell them apart; and plain Scrapy 2.19 on the asyncio
reactor does not enforce ``CONCURRENT_REQUESTS_PER_DOMAIN`` (measured: 120
requests in flight in a slot of concurrency 8), so a concurrency limit seen
by a host (``hosts.stats(name)["max_concurrency"]``) comes from the plugin.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from simhosts import SimHosts
from tests.fake_clock import FakeClock
from tests.redis_server import INSTALL_HINT, RedisServer, find_redis_server
from tests.spiders import BASE_SETTINGS, PagesSpider, run_crawl

__all__ = ["BASE_SETTINGS", "FakeClock", "PagesSpider", "run_crawl"]

SimHostsFactory = Callable[..., SimHosts]


@pytest.fixture
def simhosts() -> Iterator[SimHostsFactory]:
    """Start simulated hosts: ``simhosts(*host_configs) -> SimHosts``.

    Each call starts one server process for the given hosts (see
    :mod:`simhosts` for the config keys); every server started by the
    test is stopped at teardown.
    """
    started: list[SimHosts] = []

    def start(*host_configs: dict[str, Any]) -> SimHosts:
        hosts = SimHosts(list(host_configs))
        started.append(hosts)
        return hosts.start()

    yield start
    for hosts in started:
        hosts.stop()


@pytest.fixture
def fake_clock() -> FakeClock:
    """A :class:`tests.fake_clock.FakeClock` at 0, to inject and advance."""
    return FakeClock()


def _started_redis_server() -> Iterator[RedisServer]:
    """Start a real ``redis-server`` (see :mod:`tests.redis_server`), yield
    it, clean it up; skip, with how to install it, when it is missing."""
    executable = find_redis_server()
    if executable is None:
        pytest.skip(INSTALL_HINT)
    server = RedisServer(executable).start()
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real ``redis-server`` for the whole session."""
    yield from _started_redis_server()


@pytest.fixture
def own_redis_server() -> Iterator[RedisServer]:
    """A ``redis-server`` of this test alone, which it may stop and start."""
    yield from _started_redis_server()


@pytest.fixture(name="run_crawl")
def run_crawl_fixture() -> Callable[..., Any]:
    """The :func:`tests.spiders.run_crawl` helper, for tests that prefer a fixture."""
    return run_crawl


@pytest.fixture(params=["queued", "followed"])
def spider_modes(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a test's :class:`PagesSpider` crawls both ways: every URL queued
    at start, and every URL yielded from the callback of an index page while
    the crawl runs (see ``PagesSpider``'s ``follow``). Use it in a crawl-test
    module with ``pytestmark = pytest.mark.usefixtures("spider_modes")``."""
    followed = request.param == "followed"
    PagesSpider.follow_by_default = followed
    if followed:
        # Breadth-first, so that requests yielded from the index page are
        # crawled in page order, like start requests (Scrapy's default
        # scheduler queues are LIFO).
        PagesSpider.custom_settings = {
            "SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue",
            "SCHEDULER_DISK_QUEUE": "scrapy.squeues.PickleFifoDiskQueue",
        }
    try:
        yield request.param
    finally:
        PagesSpider.follow_by_default = False
        PagesSpider.custom_settings = None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--skip-repeats",
        action="store_true",
        help=(
            "Leave out the repeats of a test on the EPoll reactor and in the "
            "'followed' spider mode: every test still runs once, on the "
            "asyncio reactor."
        ),
    )
    parser.addoption(
        "--one-case-per-test",
        action="store_true",
        help=(
            "Run each test function once, in its first parametrization "
            "(after --skip-repeats: on the asyncio reactor): every test, so "
            "every code path it covers, on the oldest Scrapy (.ci/run), "
            "without the cases that only vary data or seeds."
        ),
    )


def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    skip_repeats = config.getoption("--skip-repeats")
    one_case = config.getoption("--one-case-per-test")
    if not (skip_repeats or one_case):
        return
    kept: list[pytest.Item] = []
    left_out: list[pytest.Item] = []
    seen: set[str] = set()
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec is not None else {}
        repeat = skip_repeats and (
            params.get("reactor") == "epoll"
            or params.get("spider_modes") == "followed"
            or "epoll" in item.name
        )
        function = item.nodeid.split("[", 1)[0]
        if not repeat and one_case:
            repeat = function in seen
            seen.add(function)
        (left_out if repeat else kept).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept
