"""The add-on on a Scrapy that ships its own throttling (``scrapy.throttling``).

No released Scrapy has it: :mod:`tests.native_scrapy` stands in for one
(settings, ``crawler.throttler``, the engine's gate). Settings checks patch
the module in for one test; crawls run in a fresh process on both reactors,
with links followed from callbacks, and read the limits at the server.
"""

from __future__ import annotations

import logging
import types

import pytest
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_adaptive_throttle import Addon, LatencySampleMiddleware
from scrapy_adaptive_throttle._addon import MIDDLEWARE_PRIORITY
from scrapy_adaptive_throttle._native import native_throttling
from tests import native_scrapy
from tests.engine_crawls import ADDON, REACTORS, crawl_in_process
from tests.spiders import BASE_SETTINGS

ON_BOTH_REACTORS = pytest.mark.parametrize("reactor", REACTORS)
_EPOLL = "twisted.internet.epollreactor.EPollReactor"
_ASYNCIO = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
OURS = {
    "DOWNLOADER": "scrapy_adaptive_throttle.ThrottlingDownloader",
    "SCHEDULER_PRIORITY_QUEUE": "scrapy_adaptive_throttle.ThrottlingAwarePriorityQueue",
}


def _addon_settings(**values):
    settings = Settings(values)
    Addon().update_settings(settings)
    return settings


def _middlewares(settings):
    return {
        (key if isinstance(key, str) else f"{key.__module__}.{key.__qualname__}"): value
        for key, value in settings.getdict("DOWNLOADER_MIDDLEWARES").items()
    }


def test_released_scrapy_has_no_native_throttling():
    assert native_throttling() is None
    settings = _addon_settings()
    for name, value in OURS.items():
        assert settings[name] == value


def test_a_scrapy_throttling_module_without_the_protocols_is_not_native(monkeypatch):
    # Detection is by what the module has, never by Scrapy's version.
    monkeypatch.setitem(
        __import__("sys").modules, "scrapy.throttling", types.ModuleType("x")
    )
    assert native_throttling() is None


def test_on_native_throttling_the_addon_installs_only_what_scrapy_lacks(
    monkeypatch, caplog
):
    native_scrapy.module_only(monkeypatch)
    assert native_throttling() is native_scrapy
    with caplog.at_level(logging.WARNING, logger="scrapy_adaptive_throttle"):
        settings = _addon_settings()
    # Scrapy's own downloader, scheduler queue and gate stay.
    assert settings["DOWNLOADER"] == "scrapy.core.downloader.Downloader"
    assert settings["SCHEDULER_PRIORITY_QUEUE"] != OURS["SCHEDULER_PRIORITY_QUEUE"]
    middlewares = _middlewares(settings)
    assert (
        "scrapy_adaptive_throttle._downloader_middleware."
        "ThrottlingDownloaderMiddleware" not in middlewares
    )
    latency = f"{LatencySampleMiddleware.__module__}.LatencySampleMiddleware"
    assert middlewares[latency] == MIDDLEWARE_PRIORITY
    # Our scope manager in Scrapy's manager; Scrapy's manager stays.
    assert settings["THROTTLING_SCOPE_MANAGER"] == (
        "scrapy_adaptive_throttle.LatencyScopeManager"
    )
    assert settings["THROTTLING_MANAGER"] == "scrapy.throttling.ThrottlingManager"
    # Scrapy's defaults win for the settings it owns, ours fill the rest.
    assert (
        settings.getlist("BACKOFF_HTTP_CODES")
        == (native_scrapy.DEFAULT_SETTINGS["BACKOFF_HTTP_CODES"])
    )
    assert settings.getfloat("THROTTLING_LATENCY_TOLERANCE") == 1.5
    # One warning naming what Scrapy now owns, and where the defaults differ.
    (warning,) = [
        record for record in caplog.records if "scrapy.throttling" in record.message
    ]
    assert "THROTTLING_SCOPES" in warning.message
    assert "BACKOFF_HTTP_CODES" in warning.message
    assert "THROTTLING_LATENCY_TOLERANCE" not in warning.message
    assert "Scrapy's default differs from the plugin's for: BACKOFF_HTTP_CODES" in (
        warning.message
    )


def test_a_user_scope_manager_is_kept_on_native_throttling(monkeypatch):
    native_scrapy.module_only(monkeypatch)
    settings = Settings({"THROTTLING_SCOPE_MANAGER": "myproject.MyScopeManager"})
    Addon().update_settings(settings)
    assert settings["THROTTLING_SCOPE_MANAGER"] == "myproject.MyScopeManager"


def _native_crawl(reactor, simhosts, settings, *, depth=3, fanout=5):
    hosts = simhosts(
        {"name": "A", "kind": "queue", "workers": 8, "service_time": 0.02},
        {"name": "B", "kind": "queue", "workers": 2, "service_time": 0.05},
    )
    result = crawl_in_process(
        {
            "spider": "follow",
            "native": True,
            "settings": {
                **BASE_SETTINGS,
                "TWISTED_REACTOR": _EPOLL if reactor == "epoll" else _ASYNCIO,
                "CLOSESPIDER_TIMEOUT": 90,
                "CONCURRENT_REQUESTS": 64,
                "CONCURRENT_REQUESTS_PER_DOMAIN": 16,
                "RETRY_ENABLED": False,
                **settings,
            },
            "urls": [hosts.url("A"), hosts.url("B")],
            "spider_kwargs": {"depth": depth, "fanout": fanout},
        },
        timeout=150,
    )
    assert result["finish_reason"] == "finished"
    assert result["lost"] == []
    assert result["failures"] == []
    pages = sum(fanout**level for level in range(depth + 1))
    assert len(result["responses"]) == 2 * pages
    return hosts, result


@ON_BOTH_REACTORS
@deferred_f_from_coro_f
async def test_latency_scope_manager_adapts_inside_scrapys_own_manager(
    simhosts, reactor
):
    hosts, result = _native_crawl(reactor, simhosts, {"ADDONS": ADDON})
    # Scrapy's (stand-in) manager and downloader ran the crawl.
    assert result["throttler_class"] == "tests.native_scrapy.ThrottlingManager"
    assert result["downloader_class"] in (None, "scrapy.core.downloader.Downloader")
    scopes = result["scope_managers"]
    for name in "AB":
        scope = scopes[hosts.netloc(name)]
        assert scope["class"] == (
            "scrapy_adaptive_throttle._latency_scope_manager.LatencyScopeManager"
        )
        assert scope["latency_samples"] > 0
        assert scope["ceiling"] == 16
    # The adaptive limit grew past its start (2) on the 8-worker host, which
    # only latency samples make it do, and never went past the ceiling; the
    # 2-worker host never got more than its queue could take (no 503).
    stats_a, stats_b = hosts.stats("A"), hosts.stats("B")
    assert 2 < stats_a["max_concurrency"] <= 16
    assert stats_b["max_concurrency"] <= 16
    assert stats_a["status_counts"].get("503", 0) == 0
    assert stats_b["status_counts"].get("503", 0) == 0


@deferred_f_from_coro_f
async def test_without_its_latency_samples_the_limit_would_never_move(simhosts):
    # The control: the same crawl with LatencySampleMiddleware switched off
    # holds 2 in flight per host at most (the initial limit) — what the
    # issue saw on the pull request's build.
    middleware = "scrapy_adaptive_throttle.LatencySampleMiddleware"
    hosts, result = _native_crawl(
        "asyncio",
        simhosts,
        {"ADDONS": ADDON, "DOWNLOADER_MIDDLEWARES": {middleware: None}},
        depth=2,
    )
    assert hosts.stats("A")["max_concurrency"] == 2
    assert result["scope_managers"][hosts.netloc("A")]["latency_samples"] == 0


@deferred_f_from_coro_f
async def test_the_stand_in_crawls_without_the_addon(simhosts):
    # The baseline a native Scrapy gives on its own: a fixed limit of
    # CONCURRENT_REQUESTS_PER_DOMAIN per host, held at the server.
    hosts, result = _native_crawl("asyncio", simhosts, {}, depth=2)
    assert result["throttler_class"] == "tests.native_scrapy.ThrottlingManager"
    assert {scope["class"] for scope in result["scope_managers"].values()} == {
        "tests.native_scrapy.ThrottlingScopeManager"
    }
    assert hosts.stats("A")["max_concurrency"] <= 16


@deferred_f_from_coro_f
async def test_the_plugins_queue_chosen_explicitly_works_with_scrapys_manager(
    simhosts,
):
    # The add-on leaves the scheduler to Scrapy, but a user may still pick the
    # plugin's queue: it then talks to Scrapy's manager through the protocol
    # (releases go through Scrapy's engine, not the plugin's downloader, so
    # blocked requests are looked at again on a timer) and never hangs.
    hosts, result = _native_crawl(
        "asyncio",
        simhosts,
        {
            "ADDONS": ADDON,
            "SCHEDULER_PRIORITY_QUEUE": (
                "scrapy_adaptive_throttle.ThrottlingAwarePriorityQueue"
            ),
            "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
            "THROTTLING_SCOPE_MANAGER": "scrapy.throttling.ThrottlingScopeManager",
        },
        depth=2,
    )
    assert result["throttler_class"] == "tests.native_scrapy.ThrottlingManager"
    assert hosts.stats("A")["max_concurrency"] == 4
    assert hosts.stats("B")["max_concurrency"] <= 4


@ON_BOTH_REACTORS
@deferred_f_from_coro_f
async def test_the_diagnostics_read_the_scopes_of_scrapys_own_manager(
    simhosts, reactor
):
    # The add-on's diagnostics run inside Scrapy's manager too: they read its
    # scope managers (LatencyScopeManager, the add-on's) through adapters.
    hosts, result = _native_crawl(reactor, simhosts, {"ADDONS": ADDON}, depth=2)
    stats = result["stats"]
    assert stats["throttling/live/scopes"] == 2
    assert stats["throttling/live/in_flight"] == 0
    assert stats["throttling/latency/scope_count"] == 2
    for name in "AB":
        scope = hosts.netloc(name)
        limit = stats[f"throttling/scopes/{scope}/limit"]
        assert limit == result["scope_managers"][scope]["limit"]
        assert 1 <= limit <= 16
        assert stats[f"throttling/scopes/{scope}/response_count"] > 0
