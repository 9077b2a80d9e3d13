"""The old home of the package's types, kept for one release.

What it held now lives in modules named after it: :mod:`._protocols` (the
manager and scope manager protocols), :mod:`._scope_config` (the
:setting:`THROTTLING_SCOPES` entry types), :mod:`._scopes` (request scopes,
backoff data and their helpers) and :mod:`._meta_keys` (meta keys). Import
public names from ``scrapy_adaptive_throttle``.
"""

from __future__ import annotations

from ._meta_keys import RESOLVED_SCOPES_META_KEY, dont_track
from ._protocols import ThrottlingManagerProtocol, ThrottlingScopeManagerProtocol
from ._scope_config import BackoffConfig, RampupConfig, ThrottlingScopeConfig
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
    "RESOLVED_SCOPES_META_KEY",
    "BackoffConfig",
    "BackoffData",
    "BackoffScopeData",
    "RampupConfig",
    "RequestScopes",
    "ScopeID",
    "ThrottlingManagerProtocol",
    "ThrottlingScopeConfig",
    "ThrottlingScopeManagerProtocol",
    "add_scope",
    "dont_track",
    "iter_scope_values",
    "iter_scopes",
    "scope_cache",
    "update_scope_backoff",
]
