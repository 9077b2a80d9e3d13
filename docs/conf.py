"""Sphinx configuration (builds offline: no intersphinx inventories)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

project = "scrapy-adaptive-throttle"
author = "scrapy-adaptive-throttle developers"
release = "0.1.0"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.viewcode"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
autodoc_member_order = "bysource"
autodoc_typehints = "description"
nitpicky = False


def setup(app: Any) -> None:
    # The roles Scrapy's own docs use for settings, request meta keys and
    # stats, so that pages read like Scrapy's: :setting:`X`, :reqmeta:`y`.
    app.add_crossref_type("setting", "setting", "pair: %s; setting")
    app.add_crossref_type("reqmeta", "reqmeta", "pair: %s; reqmeta")
    app.add_crossref_type("stat", "stat", "pair: %s; stat")
