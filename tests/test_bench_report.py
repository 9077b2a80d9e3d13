"""The demo's tables name rows by what they are and end with a verdict."""

from __future__ import annotations

from typing import Any

from bench.run import config_label, format_verdict


def _run(config: str, pages: int, elapsed: float, refused: int = 0) -> dict[str, Any]:
    return {
        "status": "ok",
        "config": config,
        "repeat": 0,
        "metrics": {
            "A": {
                "pages": pages,
                "count_503": refused,
                "count_429": 0,
                "ratio": pages / elapsed / 400,
            }
        },
        "crawl": {"hosts": {"A": {"elapsed": elapsed}}},
    }


def test_config_labels_say_what_a_configuration_is() -> None:
    assert config_label("autothrottle") == "AutoThrottle (Scrapy default)"
    assert config_label("addon-default") == "this plugin (add-on defaults)"
    assert config_label("fixed-8") == "fixed limit 8 (plugin)"
    assert config_label("autothrottle-8") == "AutoThrottle target 8"
    assert config_label("latency-2.0") == "this plugin, tolerance 2.0"
    assert config_label("unknown-thing") == "unknown-thing"


def test_verdict_compares_with_the_fastest_polite_alternative() -> None:
    result = {
        "runs": [
            {"status": "ok", "config": "probe"},
            _run("addon-default", 1000, 2.5),
            # Faster, but the host refused 50 requests: not a better crawl.
            _run("fixed-32", 1000, 2.0, refused=50),
            _run("fixed-2", 1000, 10.0),
            _run("autothrottle", 1000, 5.0),
        ]
    }
    verdict = format_verdict(result)
    assert verdict.startswith("verdict: this plugin (add-on defaults) 400.0 pages/s")
    assert "(A 1.00 of capacity)" in verdict
    assert (
        "best alternative in this run: AutoThrottle (Scrapy default) 200.0" in verdict
    )
    assert "ours = 2.00 x" in verdict


def test_verdict_says_when_every_alternative_was_refused_more() -> None:
    result = {"runs": [_run("addon-default", 100, 1.0), _run("fixed-32", 100, 0.5, 9)]}
    verdict = format_verdict(result)
    assert "fixed limit 32 (plugin) 200.0 pages/s, 9 503s" in verdict
    assert "every alternative drew more refusals" in verdict


def test_no_verdict_without_a_configuration_of_ours() -> None:
    assert format_verdict({"runs": [_run("fixed-2", 10, 1.0)]}) == ""
