"""Limits checked where they matter: at the simulated hosts' server.

The simulated hosts record, for every request, its arrival and how long the
server held it (``simhosts``); these helpers rebuild from those records
how many requests were in service at once, per host and across hosts.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any


def service_intervals(stats: dict[str, Any]) -> list[tuple[float, float]]:
    """``(arrival, answer)`` epoch times of every recorded request of one host."""
    origin = stats.get("first_arrival_epoch")
    if origin is None:
        return []
    return [
        (origin + record[0], origin + record[0] + record[4])
        for record in stats["arrivals"]
    ]


def max_in_service(all_stats: Iterable[dict[str, Any]]) -> int:
    """The most requests the server held at once, across the given hosts.

    A request counts from its arrival to its answer as measured by the
    server, so this never exceeds what the client had in flight.
    """
    events: list[tuple[float, int]] = []
    for stats in all_stats:
        for start, end in service_intervals(stats):
            events.append((start, 1))
            events.append((end, -1))
    # At equal times, answers go before arrivals: back-to-back is not overlap.
    events.sort(key=lambda event: (event[0], event[1]))
    current = peak = 0
    for _, change in events:
        current += change
        peak = max(peak, current)
    return peak


def time_in_service(stats: dict[str, Any]) -> dict[int, float]:
    """Seconds the server spent with each number of requests in service,
    from the first arrival to the last answer."""
    events: list[tuple[float, int]] = []
    for start, end in service_intervals(stats):
        events.append((start, 1))
        events.append((end, -1))
    events.sort(key=lambda event: (event[0], event[1]))
    spent: dict[int, float] = {}
    current = 0
    for (time, change), (next_time, _) in itertools.pairwise(events):
        current += change
        spent[current] = spent.get(current, 0.0) + next_time - time
    return spent


def mean_in_service(stats: dict[str, Any]) -> float:
    """The time-weighted mean of the requests in service (see
    :func:`time_in_service`): the load a crawl put on the host, less
    sensitive than :func:`max_in_service` to one instant."""
    spent = time_in_service(stats)
    total = sum(spent.values())
    return sum(count * seconds for count, seconds in spent.items()) / total
