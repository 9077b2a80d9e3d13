"""Per-scope throttling for Scrapy: concurrency, delay, backoff, rampup,
quotas, robots.txt Crawl-delay, and a concurrency limit that adapts to each
host's latency."""

from ._addon import Addon
from ._containment import ThrottlingComponentError
from ._downloader import ThrottlingDownloader
from ._downloader_middleware import ThrottlingDownloaderMiddleware
from ._explain import Explanation, ScopeExplanation
from ._latency_scope_manager import LatencyScopeManager
from ._manager import ThrottlingManager
from ._native import LatencySampleMiddleware
from ._pqueue import ThrottlingAwarePriorityQueue
from ._protocols import ThrottlingManagerProtocol, ThrottlingScopeManagerProtocol
from ._scope_config import BackoffConfig, RampupConfig, ThrottlingScopeConfig
from ._scope_manager import ThrottlingScopeManager
from ._scopes import (
    BackoffData,
    BackoffScopeData,
    RequestScopes,
    ScopeID,
    add_scope,
    iter_scope_values,
    iter_scopes,
    scope_cache,
    update_scope_backoff,
)

__all__ = [
    "Addon",
    "BackoffConfig",
    "BackoffData",
    "BackoffScopeData",
    "Explanation",
    "LatencySampleMiddleware",
    "LatencyScopeManager",
    "RampupConfig",
    "RequestScopes",
    "ScopeExplanation",
    "ScopeID",
    "ThrottlingAwarePriorityQueue",
    "ThrottlingComponentError",
    "ThrottlingDownloader",
    "ThrottlingDownloaderMiddleware",
    "ThrottlingManager",
    "ThrottlingManagerProtocol",
    "ThrottlingScopeConfig",
    "ThrottlingScopeManager",
    "ThrottlingScopeManagerProtocol",
    "add_scope",
    "iter_scope_values",
    "iter_scopes",
    "scope_cache",
    "update_scope_backoff",
]
