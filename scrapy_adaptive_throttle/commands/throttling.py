"""``scrapy throttling URL [URL ...]``: each URL's scopes and their configuration.

Nothing is downloaded. The URLs go through the project's
:setting:`THROTTLING_MANAGER` (its scopes, as the crawl would assign them) and
each scope is resolved against the project's settings, add-ons included, so
a :setting:`THROTTLING_SCOPES` key that no URL reaches (``example.com`` for
``www.example.com``) shows before the crawl rather than after it.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider
from scrapy.commands import ScrapyCommand
from scrapy.crawler import Crawler
from scrapy.exceptions import UsageError
from scrapy.statscollectors import DummyStatsCollector
from scrapy.utils.misc import build_from_crawler
from twisted.internet.defer import Deferred

from .._scopes import iter_scope_values
from .._settings import ThrottlingSettings

if TYPE_CHECKING:
    import argparse

    from .._settings import ScopeSettings

__all__ = ["Command", "describe_scope"]


class _NoSpider(Spider):
    name = "throttling"


class Command(ScrapyCommand):
    """Print each URL's throttling scopes and the configuration of each."""

    requires_project = False
    requires_crawler_process = False
    default_settings = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "[options] URL [URL ...]"

    def short_desc(self) -> str:
        return "Show the throttling scopes of URLs and their configuration"

    def long_desc(self) -> str:
        return (
            "Show, without crawling, the throttling scopes each URL gets and the "
            "configuration each scope would have under the project's settings "
            "(THROTTLING_SCOPES, add-ons, defaults). Check THROTTLING_SCOPES keys "
            "before a crawl."
        )

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if not args:
            raise UsageError("Give at least one URL.")
        assert self.settings is not None
        crawler = Crawler(_NoSpider, self.settings.copy())
        # The add-ons' settings (ours registers the defaults), as a crawl
        # would have them; the reactor and the rest are not needed.
        crawler.addons.load_settings(crawler.settings)
        crawler.stats = DummyStatsCollector(crawler)
        config = ThrottlingSettings.from_crawler(crawler)
        throttler = build_from_crawler(config.manager_cls, crawler)
        used: set[str] = set()
        for url in args:
            print(url)
            try:
                request = Request(url)
            except ValueError as exc:
                print(f"  invalid URL: {exc}")
                self.exitcode = 1
                continue
            resolved = throttler.resolve_scopes_now(request)
            if isinstance(resolved, Deferred):
                print(
                    f"  scopes: resolved asynchronously by "
                    f"{type(throttler).__name__}.get_scopes(); not shown"
                )
                continue
            values = list(iter_scope_values(resolved))
            if not values:
                print("  no scope: not throttled")
            for scope, amount in values:
                used.add(scope)
                for line in describe_scope(config, scope, amount):
                    print(f"  {line}")
        unused = [scope for scope in config.scopes if scope not in used]
        if unused:
            print()
            print("THROTTLING_SCOPES entries no URL above falls under:")
            for scope in unused:
                close = difflib.get_close_matches(scope, sorted(used), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                print(f"  {scope!r}{hint}")


def describe_scope(
    config: ThrottlingSettings, scope: str, amount: float | None = None
) -> list[str]:
    """The configuration of *scope* in a few lines."""
    settings: ScopeSettings = config.scope(scope)
    configured = scope in config.scopes
    source = (
        f"THROTTLING_SCOPES[{scope!r}]"
        if configured
        else f"defaults for {settings.kind} scopes (no THROTTLING_SCOPES entry)"
    )
    manager: Any = settings.manager or config.scope_manager_cls
    lines = [f"scope {scope!r}: {settings.kind}, from {source}"]
    lines.append(f"  manager: {_class_path(manager)}")
    limit = "none" if settings.concurrency is None else str(settings.concurrency)
    concurrency = f"  concurrency: {limit}"
    if getattr(manager, "ceiling", None) is not None:  # LatencyScopeManager
        concurrency += (
            f" (the ceiling of the adaptive limit; starts at "
            f"{settings.initial_concurrency}, floor {settings.min_concurrency}, "
            f"latency tolerance x{settings.latency_tolerance}, window "
            f"{settings.latency_window:g}s)"
        )
    elif settings.min_concurrency > 1:
        concurrency += f" (min {settings.min_concurrency})"
    lines.append(concurrency)
    low, high = settings.jitter
    jitter = f", jitter {low:+.0%}..{high:+.0%}" if (low or high) else ""
    lines.append(f"  delay: {settings.delay:g}s{jitter}")
    backoff = settings.backoff
    lines.append(
        f"  backoff on: {', '.join(map(str, sorted(settings.http_codes))) or '-'}"
        f" and {len(settings.exceptions)} exception type(s); delay x"
        f"{backoff.delay_factor:g} from {backoff.min_delay:g}s up to "
        f"{backoff.max_delay:g}s, one step back per {backoff.window:g}s quiet"
    )
    if settings.quota is not None:
        cost = "" if amount is None else f", this request costs {amount:g}"
        lines.append(
            f"  quota: {settings.quota:g} per {settings.window:g}s window{cost}"
        )
    if settings.rampup is not None:
        low_target, high_target = settings.rampup.target
        lines.append(
            f"  rampup: target {low_target:g}-{high_target:g} backoff trigger(s) "
            f"per window, delay factor {settings.rampup.delay_factor:g}"
        )
    if not config.robotstxt_obey:
        robots = "not obeyed"
    elif settings.ignore_robots_txt:
        robots = "Crawl-delay ignored (ignore_robots_txt)"
    else:
        robots = (
            f"Crawl-delay applied (capped at {config.robotstxt_max_delay:g}s) "
            "when robots.txt gives one"
        )
    lines.append(f"  robots.txt: {robots}")
    return lines


def _class_path(cls: Any) -> str:
    """The import path of *cls*, the public one for this package's classes."""
    import scrapy_adaptive_throttle

    name: str = cls.__name__
    if getattr(scrapy_adaptive_throttle, name, None) is cls:
        return f"scrapy_adaptive_throttle.{name}"
    return f"{cls.__module__}.{cls.__qualname__}"
