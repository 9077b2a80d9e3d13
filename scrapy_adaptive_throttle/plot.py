"""Draw a timeline file as a PNG chart.

``python -m scrapy_adaptive_throttle.plot TIMELINE -o CHART.png`` draws

three panels over the crawl's time, one line per scope (the busiest ones,
``--scopes`` or ``--top``): the concurrency limit (and, dotted, the requests
in flight), the median latency, and pages per second; the figures of the
docs' latency chapter, for your own crawl. Needs matplotlib
(``pip install scrapy-adaptive-throttle[plot]``). The timeline is written by
:setting:`THROTTLING_TIMELINE_FILE`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

__all__ = ["main", "plot_timeline", "read_timeline"]


def read_timeline(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """The samples of a timeline file, per scope, in time order."""
    samples: dict[str, list[dict[str, Any]]] = defaultdict(list)
    with Path(path).open(encoding="utf-8") as stream:
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                sample = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}, line {number}: not JSON ({exc})") from None
            if isinstance(sample, dict) and "scope" in sample and "time" in sample:
                samples[str(sample["scope"])].append(sample)
    for scope_samples in samples.values():
        scope_samples.sort(key=lambda sample: sample["time"])
    return dict(samples)


def plot_timeline(
    timeline: dict[str, list[dict[str, Any]]],
    output: str | Path,
    *,
    scopes: list[str] | None = None,
    top: int = 6,
    title: str | None = None,
) -> list[str]:
    """Draw *timeline* (see :func:`read_timeline`) to the PNG *output*.

    :param scopes: the scopes to draw; by default the *top* with the most
        responses.
    :returns: the scopes drawn.
    """
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(
            "Drawing a timeline needs matplotlib: "
            "pip install 'scrapy-adaptive-throttle[plot]'"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if scopes is None:
        totals = {
            scope: sum(sample.get("responses") or 0 for sample in samples)
            for scope, samples in timeline.items()
        }
        scopes = sorted(totals, key=lambda scope: -totals[scope])[:top]
    missing = [scope for scope in scopes if scope not in timeline]
    if missing:
        raise ValueError(f"Scopes not in the timeline: {', '.join(missing)}")
    figure, (limit_axes, latency_axes, rate_axes) = plt.subplots(
        3, 1, sharex=True, figsize=(9, 8)
    )
    for index, scope in enumerate(scopes):
        samples = timeline[scope]
        color = f"C{index % 10}"
        times = [sample["time"] for sample in samples]
        limits = [sample.get("limit") for sample in samples]
        limit_axes.step(times, limits, where="post", color=color, label=scope)
        limit_axes.plot(
            times,
            [sample.get("in_flight") for sample in samples],
            color=color,
            linestyle=":",
            linewidth=1,
        )
        latency = [
            (sample["time"], sample["latency_p50"] * 1000)
            for sample in samples
            if sample.get("latency_p50") is not None
        ]
        if latency:
            latency_axes.plot(*zip(*latency, strict=True), color=color, marker=".")
        rate_axes.plot(
            times,
            [sample.get("pages_per_second") or 0 for sample in samples],
            color=color,
        )
    limit_axes.set_ylabel("concurrency limit\n(dotted: in flight)")
    limit_axes.legend(loc="upper left", fontsize="small")
    latency_axes.set_ylabel("median latency (ms)")
    rate_axes.set_ylabel("pages/s")
    rate_axes.set_xlabel("seconds since the crawl started")
    for axes in (limit_axes, latency_axes, rate_axes):
        axes.grid(alpha=0.3)
        axes.set_ylim(bottom=0)
    figure.suptitle(title or "Throttling timeline")
    figure.tight_layout()
    figure.savefig(output, format="png", dpi=100)
    plt.close(figure)
    return scopes


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m scrapy_adaptive_throttle.plot",
        description="Draw a THROTTLING_TIMELINE_FILE as a PNG chart: each "
        "scope's concurrency limit, median latency and pages/s over time.",
    )
    parser.add_argument("timeline", help="the timeline file (JSON lines)")
    parser.add_argument("-o", "--output", required=True, help="the PNG to write")
    parser.add_argument(
        "--scopes", help="comma-separated scopes to draw (default: the busiest)"
    )
    parser.add_argument(
        "--top", type=int, default=6, help="draw the N busiest scopes (default 6)"
    )
    parser.add_argument("--title", help="the chart's title")
    args = parser.parse_args(argv)
    timeline = read_timeline(args.timeline)
    if not timeline:
        print(f"{args.timeline}: no samples", file=sys.stderr)
        return 1
    scopes = args.scopes.split(",") if args.scopes else None
    try:
        drawn = plot_timeline(
            timeline, args.output, scopes=scopes, top=args.top, title=args.title
        )
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"{args.output}: {len(drawn)} scope(s): {', '.join(drawn)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
