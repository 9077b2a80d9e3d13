"""Every request meta key lives in ``_meta_keys``: the package uses its
constants, never a string literal, and the docs name each key it holds."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from scrapy_adaptive_throttle import _meta_keys

PACKAGE = Path(_meta_keys.__file__).parent
META_DOCS = PACKAGE.parent / "docs" / "reference" / "meta.rst"
KEYS = {
    name: value
    for name, value in vars(_meta_keys).items()
    if name.endswith("_META_KEY") and isinstance(value, str)
}


def _is_meta(node: ast.expr) -> bool:
    """``meta`` or ``<anything>.meta``."""
    return (isinstance(node, ast.Name) and node.id == "meta") or (
        isinstance(node, ast.Attribute) and node.attr == "meta"
    )


def _literal_meta_keys(tree: ast.AST) -> list[tuple[int, str]]:
    """String literals used as meta keys: ``meta.get("k")``, ``meta["k"]``,
    ``meta.pop("k")``, ``meta.setdefault("k")``, ``"k" in meta``."""
    found = []
    for node in ast.walk(tree):
        key: ast.expr | None = None
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"get", "pop", "setdefault"}
            and _is_meta(node.func.value)
            and node.args
        ):
            key = node.args[0]
        elif isinstance(node, ast.Subscript) and _is_meta(node.value):
            key = node.slice
        elif (
            isinstance(node, ast.Compare)
            and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
            and any(_is_meta(right) for right in node.comparators)
        ):
            key = node.left
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            found.append((node.lineno, key.value))
    return found


MODULES = sorted(
    path.relative_to(PACKAGE).as_posix()
    for path in PACKAGE.rglob("*.py")
    if path.name != "_meta_keys.py"
)


@pytest.mark.parametrize("module", MODULES)
def test_the_package_reads_meta_keys_through_the_constants(module: str) -> None:
    tree = ast.parse((PACKAGE / module).read_text(), module)
    assert _literal_meta_keys(tree) == []


def test_the_scan_finds_literal_meta_keys() -> None:
    source = (
        "request.meta.get('a')\nmeta['b'] = 1\nmeta.pop('c', None)\n"
        "'d' in request.meta\nrequest.meta.get(KEY)\n"
    )
    assert [key for _, key in _literal_meta_keys(ast.parse(source))] == [
        "a",
        "b",
        "c",
        "d",
    ]


def test_every_key_is_documented_and_every_documented_key_is_a_constant() -> None:
    pattern = r"``((?:_?throttling|autothrottle|download)_\w+)``"
    documented = set(re.findall(pattern, META_DOCS.read_text()))
    assert documented == set(KEYS.values()) - {
        # Scrapy's own keys, read as Scrapy documents them: they mean nothing
        # different with the add-on, so docs/reference/meta.rst leaves them out.
        "download_latency",
        "dont_obey_robotstxt",
        "dont_redirect",
    }
