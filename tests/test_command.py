"""``scrapy throttling URL ...``: scopes and their configuration, no crawl."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from scrapy import cmdline
from scrapy.http import Request
from scrapy.settings import Settings
from twisted.internet.defer import Deferred

from scrapy_adaptive_throttle import RequestScopes, ThrottlingManager

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = "scrapy_adaptive_throttle.commands"
ADDON = {"scrapy_adaptive_throttle.Addon": 500}


def run_command(capsys: pytest.CaptureFixture[str], *args: str, **settings: Any) -> str:
    project = Settings({"COMMANDS_MODULE": COMMANDS, "ADDONS": ADDON, **settings})
    with pytest.raises(SystemExit) as exit_info:
        cmdline.execute(["scrapy", "throttling", *args], project)
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_each_url_shows_its_scopes_and_their_configuration(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = run_command(
        capsys,
        "https://www.example.com/page",
        "https://api.example.com/v1",
        CONCURRENT_REQUESTS_PER_DOMAIN=6,
        THROTTLING_SCOPES={
            "api.example.com": {
                "concurrency": 2,
                "delay": 0.5,
                "quota": 100,
                "window": 60,
                "manager": "scrapy_adaptive_throttle.ThrottlingScopeManager",
            }
        },
    )
    www, api = out.split("https://api.example.com/v1\n")
    assert "scope 'www.example.com': domain, from defaults for domain scopes" in www
    assert "manager: scrapy_adaptive_throttle.LatencyScopeManager" in www
    assert "concurrency: 6 (the ceiling of the adaptive limit; starts at 2" in www
    assert (
        "scope 'api.example.com': domain, from THROTTLING_SCOPES['api.example.com']"
        in api
    )
    assert "manager: scrapy_adaptive_throttle.ThrottlingScopeManager" in api
    assert "concurrency: 2\n" in api
    assert "delay: 0.5s" in api
    assert "quota: 100 per 60s window" in api
    assert "entries no URL above falls under" not in out


def test_a_key_that_no_url_reaches_is_named_with_a_guess(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = run_command(
        capsys,
        "https://www.example.com/page",
        THROTTLING_SCOPES={"example.com": {"concurrency": 1}},
    )
    assert "THROTTLING_SCOPES entries no URL above falls under:" in out
    assert "'example.com' (did you mean 'www.example.com'?)" in out


def test_custom_scopes_from_the_project_manager(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = run_command(
        capsys,
        "https://shop.example/item/1",
        THROTTLING_MANAGER="tests.test_command.SharedScopeManager",
        THROTTLING_SCOPES={"shared": {"concurrency": 3}},
    )
    assert "scope 'shop.example'" in out
    assert "scope 'shared': other, from THROTTLING_SCOPES['shared']" in out
    assert "concurrency: 3" in out


def test_the_command_runs_in_a_project_from_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "observe_project_settings.py").write_text(
        f"COMMANDS_MODULE = {COMMANDS!r}\n"
        f"ADDONS = {ADDON!r}\n"
        "THROTTLING_SCOPES = {'example.org': {'delay': 2.0}}\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "SCRAPY_SETTINGS_MODULE": "observe_project_settings",
    }
    result = subprocess.run(
        [sys.executable, "-m", "scrapy.cmdline", "throttling", "https://example.org/"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "scope 'example.org': domain, from THROTTLING_SCOPES['example.org']" in (
        result.stdout
    )
    assert "delay: 2s" in result.stdout


class SharedScopeManager(ThrottlingManager):
    """A project manager adding a shared scope to every request."""

    def get_request_scopes(self, request: Request) -> RequestScopes:
        own = super().get_request_scopes(request)
        assert isinstance(own, str)
        return [own, "shared"]


class AwaitingScopeManager(ThrottlingManager):
    """A project manager whose scopes come from an awaited look-up."""

    async def get_scopes(self, request: Request) -> RequestScopes:
        await Deferred()  # never fired
        return "never.example"  # pragma: no cover - the look-up never ends


def test_scopes_resolved_asynchronously_are_named_not_shown(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = run_command(
        capsys,
        "https://shop.example/item/1",
        THROTTLING_MANAGER="tests.test_command.AwaitingScopeManager",
    )
    assert (
        "scopes: resolved asynchronously by AwaitingScopeManager.get_scopes(); "
        "not shown"
    ) in out
    assert "never.example" not in out
