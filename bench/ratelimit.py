"""Rate-limited API benchmark (issue 4): ``python -m bench.ratelimit``.

A simulated API (:mod:`simhosts`, kind ``ratelimit``) serves at most
``N`` requests in any sliding second and answers the others ``429`` with
``Retry-After: 1``. Each configuration crawls it in its own process
(:mod:`bench.crawl`) against a fresh server, one after the other, and the
table compares:

* pages/s from the first request to the last page, and its ratio to ``N``;
* the same over the second half of the crawl (``settled``), once rampup has
  found the limit;
* 429 answers in all, and per window of ``--window`` seconds of server time
  (the rampup configurations' :setting:`BACKOFF_WINDOW`): mean and max.

Every 429 is retried (``RETRY_TIMES`` 1000 in ``bench.crawl``), so each page
is eventually fetched; with the plugin every 429 also holds the scope for its
``Retry-After``, which is what a 429 costs in throughput.

Configurations (``--configs`` picks some):

``addon-default``
    The add-on as installed, no per-scope setting: the latency-aware scope
    manager with :setting:`CONCURRENT_REQUESTS_PER_DOMAIN` 32 (as a new user
    would try it) and the pace learned from 429 answers.
``plain-scope-manager``
    The add-on with the plain scope manager: a fixed 32 at a time (the same
    :setting:`CONCURRENT_REQUESTS_PER_DOMAIN`), the learned pace.
``fixed-c2``, ``fixed-c8``
    The plugin with a fixed limit: concurrency 2 (or 8), no delay.
``fixed-delay``
    The plugin with the delay a user who knows the limit would set,
    ``1 / N`` seconds (default jitter).
``autothrottle``, ``autothrottle-8``
    Scrapy's AutoThrottle (defaults, start delay 0.05 s), without the plugin;
    target concurrency 1 (the default) or 8.
``rampup``
    The plugin's rampup (``"rampup": True``) on the API's scope, with the
    plain scope manager and ``"jitter": 0`` (an API gains nothing from
    randomised spacing, and the jitter's bursts cost 429s).
``rampup-jitter``
    The same with the default jitter (±50%).
``rampup-exponential``
    ``rampup`` with the pull request's reaction to a window above the
    target, an exponential backoff step, instead of undoing the last rampup
    step (:class:`ExponentialRampupScopeManager`).
``rampup-latency``
    ``rampup`` with the add-on's default scope manager,
    :class:`~scrapy_adaptive_throttle.LatencyScopeManager`.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.crawl import run_in_subprocess
from bench.run import windowed_counts
from scrapy_adaptive_throttle import ThrottlingScopeManager
from simhosts import SimHosts

PROJECT_ROOT = Path(__file__).resolve().parent.parent
#: Seconds of server time after which a configuration counts as converged
#: (issue 9: the figures "once converged" start after the first 10 s).
CONVERGED_AFTER = 10.0
ADDON = {"scrapy_adaptive_throttle.Addon": 500}
PLAIN = "scrapy_adaptive_throttle.ThrottlingScopeManager"


class ExponentialRampupScopeManager(ThrottlingScopeManager):
    """Rampup that reacts to a window above its target with an exponential
    backoff step (the pull request's behaviour), for comparison."""

    def __init__(self, crawler: Any, config: dict[str, Any]) -> None:
        super().__init__(crawler, config)
        rampup = self._rampup
        if rampup is not None:
            rampup.policy = dataclasses.replace(rampup.policy, gentle=False)


def configs(netloc: str, rate: float, window: float) -> dict[str, dict[str, Any]]:
    """Scrapy settings per configuration, for the API at *netloc*."""
    rampup_scope = {"rampup": True, "jitter": 0}
    rampup_common = {"ADDONS": ADDON, "BACKOFF_WINDOW": window}
    autothrottle = {
        "AUTOTHROTTLE_ENABLED": True,
        "AUTOTHROTTLE_START_DELAY": 0.05,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 32,
    }
    return {
        "addon-default": {"ADDONS": ADDON, "CONCURRENT_REQUESTS_PER_DOMAIN": 32},
        "plain-scope-manager": {
            "ADDONS": ADDON,
            "THROTTLING_SCOPE_MANAGER": PLAIN,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 32,
        },
        "fixed-c8": {
            "ADDONS": ADDON,
            "THROTTLING_SCOPE_MANAGER": PLAIN,
            "THROTTLING_SCOPES": {netloc: {"concurrency": 8, "delay": 0}},
        },
        "fixed-c2": {
            "ADDONS": ADDON,
            "THROTTLING_SCOPE_MANAGER": PLAIN,
            "THROTTLING_SCOPES": {netloc: {"concurrency": 2, "delay": 0}},
        },
        "fixed-delay": {
            "ADDONS": ADDON,
            "THROTTLING_SCOPE_MANAGER": PLAIN,
            "THROTTLING_SCOPES": {netloc: {"concurrency": 8, "delay": 1 / rate}},
        },
        "autothrottle": autothrottle,
        "autothrottle-8": {**autothrottle, "AUTOTHROTTLE_TARGET_CONCURRENCY": 8.0},
        "rampup": {
            **rampup_common,
            "THROTTLING_SCOPE_MANAGER": PLAIN,
            "THROTTLING_SCOPES": {netloc: rampup_scope},
        },
        "rampup-jitter": {
            **rampup_common,
            "THROTTLING_SCOPE_MANAGER": PLAIN,
            "THROTTLING_SCOPES": {netloc: {"rampup": True}},
        },
        "rampup-exponential": {
            **rampup_common,
            "THROTTLING_SCOPE_MANAGER": "bench.ratelimit.ExponentialRampupScopeManager",
            "THROTTLING_SCOPES": {netloc: rampup_scope},
        },
        "rampup-latency": {
            **rampup_common,
            "THROTTLING_SCOPES": {netloc: rampup_scope},
        },
    }


def run_config(
    name: str, args: argparse.Namespace, host: dict[str, Any]
) -> dict[str, Any]:
    """Crawl with configuration *name*; return the crawl and server figures."""
    pages, limit = args.pages, args.max_seconds
    with SimHosts([host]) as hosts:
        settings = configs(hosts.netloc("R"), args.rate, args.window)[name]
        plugin = "ADDONS" in settings
        crawl_config = {
            "hosts": [
                {"name": "R", "url": hosts.url("R", "").rstrip("/"), "pages": pages}
            ],
            "settings": settings,
            "sample_interval": 0.5,
            "per_host_slots": not plugin,
            "max_seconds": limit,
        }
        process, crawl = run_in_subprocess(crawl_config, timeout=limit + 120)
        if crawl is None:
            tail = " | ".join(process.stderr.strip().splitlines()[-3:])
            return {"config": name, "status": "failed", "error": tail}
        server = hosts.stats("R")
    return {"config": name, "status": "ok", "crawl": crawl, "server": server}


def time_to_reach(done: list[float], target: float, span: float) -> float | None:
    """Seconds until the pages/s over the last *span* seconds first reach
    *target* (None: never)."""
    start = 0
    for end, t in enumerate(done):
        while done[start] < t - span:
            start += 1
        if t >= span and (end - start + 1) / span >= target:
            return t
    return None


def analyse(record: dict[str, Any], rate: float, window: float) -> dict[str, Any]:
    """Throughput and 429 figures of one run."""
    host = record["crawl"]["hosts"]["R"]
    server = record["server"]
    t0 = server["first_arrival_epoch"] or host["first_sent_epoch"]
    done = sorted(epoch - t0 for epoch in host["done_epochs"])
    elapsed = done[-1] if done else 0.0
    half = elapsed / 2
    second_half = [t for t in done if t >= half]
    counts = windowed_counts(server["arrivals"], 429, window)
    # The last window is partial: leave it out of the mean.
    full = counts[:-1] or counts
    reached = time_to_reach(done, 0.9 * rate, window)
    # Once converged: after the first CONVERGED_AFTER seconds of server time.
    late = [t for t in done if t >= CONVERGED_AFTER]
    late_429 = [
        a[0] for a in server["arrivals"] if a[3] == 429 and a[0] >= CONVERGED_AFTER
    ]
    late_span = elapsed - CONVERGED_AFTER
    return {
        "pages": len(done),
        "pages_requested": host["pages_requested"],
        "elapsed": elapsed,
        "pages_per_second": len(done) / elapsed if elapsed else 0.0,
        "ratio": (len(done) / elapsed / rate) if elapsed else 0.0,
        "settled_ratio": (len(second_half) / (elapsed - half) / rate)
        if elapsed
        else 0.0,
        "reached_at": reached,
        "after_ratio": (
            sum(t >= reached for t in done) / (elapsed - reached) / rate
            if reached is not None and elapsed > reached
            else None
        ),
        "converged_ratio": (len(late) / late_span / rate) if late_span > 0 else None,
        "converged_429": len(late_429),
        "converged_429_per_10s": (
            len(late_429) / late_span * 10 if late_span > 0 else None
        ),
        "count_429": server["status_counts"].get("429", 0),
        "per_window_429": counts,
        "mean_429_per_window": statistics.mean(full) if full else 0.0,
        "max_429_per_window": max(counts, default=0),
        "finish_reason": record["crawl"].get("finish_reason"),
        "rampup_stats": {
            key: value
            for key, value in record["crawl"].get("stats", {}).items()
            if key.startswith("throttling/rampup/")
        },
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(results: list[dict[str, Any]], rate: float, window: float) -> str:
    header = (
        f"{'config':<20} {'pages':>11} {'time s':>7} {'pages/s':>8} {'ratio':>6} "
        f"{'settled':>8} {'t0.9N':>6} {'after':>6} {'429s':>6} {'429/win':>8} "
        f"{'max/win':>8} {'>10s':>6} {'429>10s':>8}"
    )
    lines = [header, "-" * len(header)]
    for result in results:
        if result["status"] != "ok":
            lines.append(f"{result['config']:<20} FAILED: {result['error']}"[:300])
            continue
        m = result["metrics"]
        pages = f"{m['pages']}/{m['pages_requested']}"
        lines.append(
            f"{result['config']:<20} {pages:>11} {m['elapsed']:>7.1f} "
            f"{m['pages_per_second']:>8.1f} {m['ratio']:>6.3f} "
            f"{m['settled_ratio']:>8.3f} {_fmt(m['reached_at'], '.0f'):>6} "
            f"{_fmt(m['after_ratio'], '.3f'):>6} "
            f"{m['count_429']:>6} {m['mean_429_per_window']:>8.2f} "
            f"{m['max_429_per_window']:>8} {_fmt(m['converged_ratio'], '.3f'):>6} "
            f"{_fmt(m['converged_429_per_10s'], '.2f'):>8}"
        )
    lines.append(
        f"N = {rate:g} requests/s; ratio = pages/s / N over the whole crawl; settled = "
        f"the same over its second half; t0.9N = seconds until the pages/s over the "
        f"last {window:g} s first reached 0.9 N, after = pages/s / N from then on; "
        f"429/win = mean 429s per {window:g} s window of server time (full windows), "
        "max/win = the most in one window; >10s = pages/s / N after the first "
        f"{CONVERGED_AFTER:g} s, 429>10s = 429s per 10 s after them"
    )
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], rate: float, path: Path) -> None:
    """Per configuration: pages/s (1 s buckets) and the pace over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (rate_axis, pace_axis) = plt.subplots(2, 1, figsize=(12, 7.5))
    for result in results:
        if result["status"] != "ok":
            continue
        host = result["crawl"]["hosts"]["R"]
        t0 = result["server"]["first_arrival_epoch"] or host["first_sent_epoch"]
        counts: dict[int, int] = {}
        for epoch in host["done_epochs"]:
            counts[int(epoch - t0)] = counts.get(int(epoch - t0), 0) + 1
        if counts:
            seconds = range(max(counts) + 1)
            rate_axis.step(
                list(seconds),
                [counts.get(second, 0) for second in seconds],
                where="post",
                label=result["config"],
            )
        paces = [
            (sample["t"] - t0, 1.0 / max(sample["learned_interval"], sample["delay"]))
            for sample in host["state_samples"]
            if isinstance(sample.get("learned_interval"), int | float)
            and isinstance(sample.get("delay"), int | float)
            and max(sample["learned_interval"], sample["delay"]) > 0
        ]
        if paces:
            xs, ys = zip(*paces, strict=True)
            pace_axis.plot(xs, ys, label=result["config"])
    rate_axis.axhline(rate, color="black", linewidth=0.8, linestyle=":")
    pace_axis.axhline(rate, color="black", linewidth=0.8, linestyle=":")
    rate_axis.set_title(f"pages/s (1 s buckets); dotted: N = {rate:g}")
    pace_axis.set_title("requests/s the scope's pace allows (1 / max(learned, delay))")
    for axis in (rate_axis, pace_axis):
        axis.set_xlabel("server time (s)")
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ratelimit", description=__doc__
    )
    parser.add_argument("--rate", type=float, default=50.0, help="N, requests/s")
    parser.add_argument("--pages", type=int, default=6000)
    parser.add_argument(
        "--window", type=float, default=10.0, help="BACKOFF_WINDOW of rampup, seconds"
    )
    parser.add_argument("--service-time", type=float, default=0.01)
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument(
        "--configs", help="comma-separated subset of the configurations"
    )
    parser.add_argument("--output", help="write the raw results (JSON) here")
    parser.add_argument("--plot", type=Path, help="write a chart (PNG) here")
    args = parser.parse_args(argv)
    host = {
        "name": "R",
        "kind": "ratelimit",
        "rate": args.rate,
        "service_time": args.service_time,
        "retry_after": 1,
    }
    names = args.configs.split(",") if args.configs else list(configs("", 1.0, 1.0))
    results = []
    command = " ".join(argv if argv is not None else sys.argv[1:])
    now = datetime.datetime.now(datetime.timezone.utc)
    print(
        f"# {now:%Y-%m-%d %H:%M} UTC, python -m bench.ratelimit {command}", flush=True
    )
    for name in names:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        record = run_config(name, args, host)
        if record["status"] == "ok":
            record["metrics"] = analyse(record, args.rate, args.window)
        results.append(record)
    print(format_table(results, args.rate, args.window))
    for result in results:
        if result["status"] == "ok":
            m = result["metrics"]
            print(f"  {result['config']}: 429s per window {m['per_window_429']}")
            if m["rampup_stats"]:
                print(f"  {result['config']}: {m['rampup_stats']}")
            if m["finish_reason"] != "finished":
                print(f"  {result['config']}: crawl ended early: {m['finish_reason']}")
    if args.output:
        Path(args.output).write_text(json.dumps(results))
    if args.plot:
        plot(results, args.rate, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
