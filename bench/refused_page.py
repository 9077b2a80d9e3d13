"""One page a host always refuses: ``python -m bench.refused_page``.

A host with no rate limit (``unlimited``, 20 ms a page) and a link tree
found from callbacks (the test suite's ``FollowSpider``: depth 3, fanout
12, 1 885 pages, Scrapy's default depth-first order), one page of which
(``0.11``, the first the crawl reaches) answers every request with ``429`` +
``Retry-After: 1`` (``--status``, ``--retry-after``: another answer).
Retries go first (``RETRY_PRIORITY_ADJUST = 0``, so each retry comes as
soon as its hold ends, while the crawl is still speeding up); Scrapy's
default 2 retries. Per configuration and repeat: requests per
second at the server over the whole crawl and after the last hold (the
last retry's ``Retry-After``) to the end, the refusals, and how many times a
pace was learned (``throttling/rate_limit/learned_count``).

Configurations: plain Scrapy (no plugin: no hold, its retries go at once),
the add-on's defaults without the refused page, and with it; ``--before
PATH`` adds the add-on from another checkout (e.g. a ``git worktree`` of an
earlier commit), with the refused page. Ratios only mean something within
one run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from simhosts import SimHosts
from tests.engine_crawls import crawl_in_process

ROOT = Path(__file__).resolve().parent.parent
ADDON = {"scrapy_adaptive_throttle.Addon": 0}
EPOLL = "twisted.internet.epollreactor.EPollReactor"
#: The page refused (the crawl's first page at depth 2, in LIFO order).
REFUSED_PAGE = "0.11"


def crawl(url: str, addon: bool, refused: str, cwd: Path) -> dict[str, Any]:
    """One crawl of the link tree below *url* in a fresh process."""
    settings: dict[str, Any] = {
        "CONCURRENT_REQUESTS": 64,
        "RETRY_PRIORITY_ADJUST": 0,
        "TWISTED_REACTOR": EPOLL,
    }
    if addon:
        settings.update({"ADDONS": ADDON, "CONCURRENT_REQUESTS_PER_DOMAIN": 32})
    else:
        settings["CONCURRENT_REQUESTS_PER_DOMAIN"] = 32
    config = {
        "spider": "follow",
        "settings": settings,
        "urls": [url],
        "spider_kwargs": {
            "depth": 3,
            "fanout": 12,
            "child_queries": {REFUSED_PAGE: refused} if refused else {},
        },
    }
    return crawl_in_process(config, timeout=300, cwd=cwd)


def measure(
    name: str, addon: bool, refused: str, hold: float, cwd: Path = ROOT
) -> dict[str, Any]:
    host = {"name": "A", "kind": "unlimited", "service_time": 0.02}
    with SimHosts([host]) as hosts:
        result = crawl(hosts.url("A"), addon, refused, cwd)
        arrivals = hosts.stats("A")["arrivals"]
    times = sorted(record[0] for record in arrivals)
    refusals = sorted(record[0] for record in arrivals if record[3] >= 400)
    span = times[-1] - times[0]
    row: dict[str, Any] = {
        "config": name,
        "requests": len(arrivals),
        "refusals": len(refusals),
        "seconds": span,
        "rate": len(arrivals) / span,
        "learned": result["stats"].get("throttling/rate_limit/learned_count", 0),
        "unanswered": len(result["lost"]),
    }
    if refusals and times[-1] > refusals[-1] + hold + 1.0:
        # After the last hold (the last refusal's Retry-After) to the end of
        # the crawl: what a pace learned from the retries would slow.
        start = refusals[-1] + hold
        after = [t for t in times if t >= start]
        row["rate after the holds"] = len(after) / (times[-1] - start)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--status", type=int, default=429, help="the refused page's status"
    )
    parser.add_argument(
        "--retry-after",
        type=int,
        default=1,
        help="its Retry-After header, seconds (0: none)",
    )
    parser.add_argument(
        "--before",
        type=Path,
        default=None,
        help="also the add-on of this checkout, with the refused page",
    )
    args = parser.parse_args(argv)
    refused = f"status={args.status}"
    if args.retry_after:
        refused += f"&header=Retry-After:{args.retry_after}"
    runs: list[tuple[str, bool, str, Path]] = [
        ("plain Scrapy, refused page", False, refused, ROOT),
        ("add-on, no refused page", True, "", ROOT),
        ("add-on, refused page", True, refused, ROOT),
    ]
    if args.before is not None:
        runs.append(("add-on before, refused page", True, refused, args.before))
    print(f"refused page: {refused}")
    print(
        "| repeat | configuration | requests | refusals | seconds | requests/s | "
        "requests/s after the last hold | paces learned | unanswered |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for repeat in range(args.repeats):
        for name, addon, refused, cwd in runs:
            row = measure(name, addon, refused, args.retry_after, cwd)
            after = row.get("rate after the holds")
            print(
                f"| {repeat} | {name} | {row['requests']} | {row['refusals']} | "
                f"{row['seconds']:.2f} | {row['rate']:.0f} | "
                f"{'-' if after is None else f'{after:.0f}'} | {row['learned']} | "
                f"{row['unanswered']} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
