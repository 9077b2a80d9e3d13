"""The algorithm modules import neither Scrapy nor Twisted, never log, never
read the clock: they are fed ``now`` and samples, which keeps them testable
with a fake clock and cheap on the hot path."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).parents[2] / "scrapy_adaptive_throttle"
ALGORITHMS_DIR = PACKAGE_DIR / "_algorithms"
MODULES = sorted(path.stem for path in ALGORITHMS_DIR.glob("*.py"))

FORBIDDEN_IMPORTS = {"scrapy", "twisted", "logging", "time", "asyncio"}
# Attribute names that read a clock or log, whatever module they come from.
FORBIDDEN_ATTRIBUTES = {
    "now",
    "utcnow",
    "today",
    "monotonic",
    "perf_counter",
    "getLogger",
}

# The package's own __init__ imports Scrapy (the add-on), so each module is
# imported under a stub parent package: only the algorithms are measured.
IMPORT_CHECK = """
import sys, types
parent = types.ModuleType("scrapy_adaptive_throttle")
parent.__path__ = [{package_dir!r}]
sys.modules["scrapy_adaptive_throttle"] = parent
import importlib
importlib.import_module({module!r})
leaked = sorted(
    name for name in sys.modules
    if name.split(".")[0] in ("scrapy", "twisted")
)
print(",".join(leaked))
"""


def test_modules_found() -> None:
    expected = {"__init__", "backoff", "headers", "jitter", "latency", "quota"}
    expected.add("rampup")
    assert expected <= set(MODULES)


@pytest.mark.parametrize("stem", MODULES)
def test_import_loads_no_scrapy_or_twisted(stem: str) -> None:
    module = "scrapy_adaptive_throttle._algorithms"
    if stem != "__init__":
        module += f".{stem}"
    code = IMPORT_CHECK.format(package_dir=str(PACKAGE_DIR), module=module)
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


@pytest.mark.parametrize("stem", MODULES)
def test_source_has_no_forbidden_imports_or_clock(stem: str) -> None:
    source = (ALGORITHMS_DIR / f"{stem}.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots = {(node.module or "").split(".")[0]}
        else:
            roots = set()
        assert not roots & FORBIDDEN_IMPORTS, (stem, ast.dump(node))
        if isinstance(node, ast.Attribute):
            assert node.attr not in FORBIDDEN_ATTRIBUTES, (stem, node.attr)


@pytest.mark.parametrize("stem", [m for m in MODULES if m != "__init__"])
def test_module_docstring_and_future_import(stem: str) -> None:
    tree = ast.parse((ALGORITHMS_DIR / f"{stem}.py").read_text(encoding="utf-8"))
    assert ast.get_docstring(tree)
    assert any(
        isinstance(node, ast.ImportFrom)
        and node.module == "__future__"
        and any(alias.name == "annotations" for alias in node.names)
        for node in tree.body
    )
