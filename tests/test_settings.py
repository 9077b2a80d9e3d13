"""Every invalid setting fails at start-up, naming the setting, scope and value."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_adaptive_throttle._settings import ThrottlingSettings, classify_scope
from tests.spiders import PagesSpider, run_crawl


class HalfAScopeManager:
    """can_send and record_sent, but no record_done: not a scope manager."""

    can_send = record_sent = staticmethod(lambda *args, **kwargs: 0.0)


def read(**settings: Any) -> ThrottlingSettings:
    return ThrottlingSettings.from_settings(Settings(settings))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"DOWNLOAD_DELAY": -1}, "DOWNLOAD_DELAY value -1"),
        (
            {"CONCURRENT_REQUESTS_PER_DOMAIN": "abc"},
            "CONCURRENT_REQUESTS_PER_DOMAIN value 'abc'",
        ),
        ({"BACKOFF_MAX_DELAY": float("nan")}, "BACKOFF_MAX_DELAY value nan"),
        ({"BACKOFF_DELAY_FACTOR": 0.5}, "BACKOFF_DELAY_FACTOR value 0.5"),
        ({"BACKOFF_JITTER": [0.3, 0.1]}, "BACKOFF_JITTER value [0.3, 0.1]"),
        ({"BACKOFF_HTTP_CODES": "429"}, "BACKOFF_HTTP_CODES value '429'"),
        (
            {"BACKOFF_EXCEPTIONS": ["no.such.Error"]},
            "BACKOFF_EXCEPTIONS value 'no.such.Error'",
        ),
        (
            {"THROTTLING_MANAGER": "no.such.Manager"},
            "THROTTLING_MANAGER value 'no.such.Manager'",
        ),
        ({"THROTTLING_SCOPE_LIMIT": -5}, "THROTTLING_SCOPE_LIMIT value -5"),
        (
            {"THROTTLING_LATENCY_TOLERANCE": 0.9},
            "THROTTLING_LATENCY_TOLERANCE value 0.9",
        ),
        (
            {"THROTTLING_SCOPES": ["example.com"]},
            "THROTTLING_SCOPES value ['example.com']",
        ),
        (
            {"THROTTLING_SCOPES": {"example.com": {"delay": -0.5}}},
            "THROTTLING_SCOPES['example.com']['delay'] value -0.5",
        ),
        (
            {"THROTTLING_SCOPES": {"example.com": {"concurrency": "abc"}}},
            "THROTTLING_SCOPES['example.com']['concurrency'] value 'abc'",
        ),
        (
            {"THROTTLING_SCOPES": {"example.com": {"concurency": 4}}},
            "Unknown key 'concurency' in THROTTLING_SCOPES['example.com'] (value 4)",
        ),
        (
            {"THROTTLING_SCOPES": {"api": {"manager": "no.such.ScopeManager"}}},
            "THROTTLING_SCOPES['api']['manager'] value 'no.such.ScopeManager'",
        ),
        (
            {"THROTTLING_SCOPES": {"api": {"backoff": {"http_code": [429]}}}},
            "unknown key 'http_code'",
        ),
        (
            {"THROTTLING_SCOPES": {"api": {"concurrency": 2, "min_concurrency": 3}}},
            "THROTTLING_SCOPES['api']['min_concurrency'] value 3",
        ),
        (
            {"THROTTLING_SCOPES": {"api": {"rampup": {"delay_factor": 2}}}},
            "THROTTLING_SCOPES['api']['rampup']",
        ),
        ({"THROTTLING_SCOPES": {"api": 4}}, "THROTTLING_SCOPES['api'] value 4"),
        # A class that is not a scope manager (here: the manager itself).
        (
            {"THROTTLING_SCOPE_MANAGER": "scrapy_adaptive_throttle.ThrottlingManager"},
            "THROTTLING_SCOPE_MANAGER value "
            "'scrapy_adaptive_throttle.ThrottlingManager': it does not implement "
            "ThrottlingScopeManagerProtocol (missing: can_send, record_sent, "
            "record_done)",
        ),
        (
            {"THROTTLING_SCOPE_MANAGER": dict},
            "THROTTLING_SCOPE_MANAGER value <class 'dict'>: it does not implement",
        ),
        (
            {
                "THROTTLING_SCOPES": {
                    "api": {"manager": "tests.test_settings.HalfAScopeManager"}
                }
            },
            "THROTTLING_SCOPES['api']['manager'] value "
            "'tests.test_settings.HalfAScopeManager': it does not implement "
            "ThrottlingScopeManagerProtocol (missing: record_done)",
        ),
    ],
)
def test_invalid_values_name_setting_scope_and_value(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        read(**settings)


def test_valid_values_are_normalised() -> None:
    config = read(
        CONCURRENT_REQUESTS_PER_DOMAIN="4",
        DOWNLOAD_DELAY="0.5",
        DOWNLOAD_DELAY_JITTER=0.2,
        THROTTLING_SCOPE_CONCURRENCY=0,
        THROTTLING_SCOPES={
            "example.com": {"concurrency": 2, "jitter": [-0.1, 0.3], "delay": 1},
            "api": {"rampup": {"backoff_target": [1, 3]}},
        },
    )
    assert config.domain_concurrency == 4
    domain = config.scope("other.example")
    assert (domain.concurrency, domain.delay, domain.jitter) == (4, 0.5, (-0.2, 0.2))
    configured = config.scope("example.com")
    assert (configured.concurrency, configured.delay, configured.jitter) == (
        2,
        1.0,
        (-0.1, 0.3),
    )
    # THROTTLING_SCOPE_CONCURRENCY = 0: custom scopes have no limit.
    assert config.scope("custom").concurrency is None
    assert config.scope("api").rampup is not None
    assert config.scope("api").rampup.target == (1.0, 3.0)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, (-0.5, 0.5)),
        (False, (0.0, 0.0)),
        (0.2, (-0.2, 0.2)),
        ([-0.1, 0.3], (-0.1, 0.3)),
    ],
)
def test_randomize_download_delay_accepts_bool_factor_and_range(
    value: Any, expected: tuple[float, float]
) -> None:
    assert read(RANDOMIZE_DOWNLOAD_DELAY=value).scope("a.example").jitter == expected


@pytest.mark.parametrize(
    ("scope", "kind"),
    [
        ("example.com", "domain"),
        ("example.com:8080", "domain"),
        ("EXAMPLE.COM.", "domain"),
        ("xn--bcher-kva.example", "domain"),
        ("::1", "ip"),
        ("127.0.0.1", "ip"),
        ("127.0.0.1:8080", "ip"),
        ("[::1]:80", "ip"),
        ("localhost", "other"),
        ("localhost:8080", "other"),
        ("api", "other"),
        ("my_host.com", "other"),
        ("-a.com", "other"),
        ("api.toscrape.com/fast", "other"),
    ],
)
def test_scope_kinds(scope: str, kind: str) -> None:
    assert classify_scope(scope) == kind


def test_default_concurrency_by_scope_kind() -> None:
    config = read(
        CONCURRENT_REQUESTS_PER_DOMAIN=6,
        CONCURRENT_REQUESTS_PER_IP=3,
        THROTTLING_SCOPE_CONCURRENCY=2,
    )
    assert config.scope("example.com").concurrency == 6
    assert config.scope("10.0.0.1").concurrency == 3
    assert config.scope("api").concurrency == 2


@deferred_f_from_coro_f
async def test_invalid_setting_stops_the_crawl_at_start_up(simhosts):
    hosts = simhosts({"name": "A", "kind": "unlimited"})
    with pytest.raises(
        ValueError, match=r"THROTTLING_SCOPES\['api'\]\['delay'\] value 'soon'"
    ):
        await run_crawl(
            PagesSpider,
            {
                "ADDONS": {"scrapy_adaptive_throttle.Addon": 500},
                "THROTTLING_SCOPES": {"api": {"delay": "soon"}},
            },
            urls=[hosts.url("A", "/")],
        )
    assert hosts.stats("A")["requests"] == 0


NOT_A_SCOPE_MANAGER = {
    "ADDONS": {"scrapy_adaptive_throttle.Addon": 500},
    # A plausible mistake: the manager where the scope manager belongs.
    "THROTTLING_SCOPES": {
        "api": {"manager": "scrapy_adaptive_throttle.ThrottlingManager"}
    },
}
NOT_A_SCOPE_MANAGER_MESSAGE = (
    "Invalid THROTTLING_SCOPES['api']['manager'] value "
    "'scrapy_adaptive_throttle.ThrottlingManager': it does not implement "
    "ThrottlingScopeManagerProtocol"
)


@deferred_f_from_coro_f
async def test_a_class_that_is_no_scope_manager_stops_the_crawl_at_start_up(
    simhosts,
):
    # Before, it was accepted, and every request of the scope failed later.
    hosts = simhosts({"name": "A", "kind": "unlimited"})
    with pytest.raises(ValueError, match=re.escape(NOT_A_SCOPE_MANAGER_MESSAGE)):
        await run_crawl(
            PagesSpider,
            NOT_A_SCOPE_MANAGER,
            urls=[hosts.url("A", "/")],
            meta={"throttling_scopes": "api"},
            follow=True,
        )
    assert hosts.stats("A")["requests"] == 0


def test_a_class_that_is_no_scope_manager_stops_an_epoll_crawl_at_start_up(
    simhosts,
):
    hosts = simhosts({"name": "A", "kind": "unlimited"})
    config = {
        "settings": {
            **NOT_A_SCOPE_MANAGER,
            "TWISTED_REACTOR": "twisted.internet.epollreactor.EPollReactor",
        },
        "urls": [hosts.url("A", "/")],
        "metas": [{"throttling_scopes": "api"}],
    }
    result = subprocess.run(
        [sys.executable, "-m", "tests.crawl_process", json.dumps(config)],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert NOT_A_SCOPE_MANAGER_MESSAGE in result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["reactor"].endswith("EPollReactor")
    assert outcome["finish_reason"] is None  # the spider never opened
    assert hosts.stats("A")["requests"] == 0
