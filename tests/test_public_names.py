"""Every public name stays importable from ``scrapy_adaptive_throttle``, and
what the old private module ``_types`` held stays importable from it (for
one release), as the same objects as in their new modules."""

from __future__ import annotations

import importlib

import pytest

import scrapy_adaptive_throttle
from scrapy_adaptive_throttle import _types

#: Where each name of the old ``_types`` module lives now.
NEW_HOMES = {
    "RESOLVED_SCOPES_META_KEY": "_meta_keys",
    "dont_track": "_meta_keys",
    "ThrottlingManagerProtocol": "_protocols",
    "ThrottlingScopeManagerProtocol": "_protocols",
    "BackoffConfig": "_scope_config",
    "RampupConfig": "_scope_config",
    "ThrottlingScopeConfig": "_scope_config",
    "BackoffData": "_scopes",
    "BackoffScopeData": "_scopes",
    "RequestScopes": "_scopes",
    "ScopeID": "_scopes",
    "add_scope": "_scopes",
    "iter_scope_values": "_scopes",
    "iter_scopes": "_scopes",
    "scope_cache": "_scopes",
    "update_scope_backoff": "_scopes",
}


def test_every_public_name_is_importable() -> None:
    assert scrapy_adaptive_throttle.__all__ == sorted(scrapy_adaptive_throttle.__all__)
    for name in scrapy_adaptive_throttle.__all__:
        assert getattr(scrapy_adaptive_throttle, name) is not None


@pytest.mark.parametrize("name", sorted(NEW_HOMES))
def test_the_old_types_module_reexports_the_new_homes(name: str) -> None:
    home = importlib.import_module(f"scrapy_adaptive_throttle.{NEW_HOMES[name]}")
    assert getattr(_types, name) is getattr(home, name)
    if name in scrapy_adaptive_throttle.__all__:
        assert getattr(scrapy_adaptive_throttle, name) is getattr(home, name)


def test_the_old_types_module_holds_nothing_else() -> None:
    assert sorted(_types.__all__) == sorted(NEW_HOMES)
