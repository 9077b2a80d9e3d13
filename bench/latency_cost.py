"""CPU cost per answer of :class:`LatencyLimit`, for 1 and for 200 scopes.

``python -m bench.latency_cost [--scopes 1,200] [--answers 50] [--repeat 5]
[--compare REV]``

Each scope is one ``LatencyLimit`` (the add-on's defaults: ceiling 32,
window 30 s) driven on a fake clock in rounds: ``current()`` requests sent
(``on_sent``), answered after a lognormal latency (median 20 ms, sigma 0.6,
seeded) with ``on_response``, the scopes interleaved the way answers from
many hosts arrive. It prints microseconds per answer (one ``on_sent`` plus
one ``on_response``; the latencies are drawn beforehand), the best of
``--repeat`` runs. With 1 scope the scope answers ``--answers`` x 200 times,
so that both rows time the same number of calls. No network, no Scrapy: the
algorithm only, which is what the add-on adds to every response.

``--compare REV`` also times ``LatencyLimit`` as it is in the git revision
*REV* (its ``_algorithms/latency.py``, loaded from ``git show``), the two
versions alternating run by run in this one process, so that the machine's
load weighs on both alike.
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import subprocess
import time
import types
from typing import Any

from scrapy_adaptive_throttle._algorithms import LatencyLimit


def load_revision(revision: str) -> Any:
    """``LatencyLimit`` as it is in git revision *revision*."""
    source = subprocess.run(
        ["git", "show", f"{revision}:scrapy_adaptive_throttle/_algorithms/latency.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    module = types.ModuleType(f"latency_{revision}")
    exec(compile(source, module.__name__, "exec"), module.__dict__)
    return module.LatencyLimit


def run(scopes: int, answers: int, seed: int = 1, cls: Any = LatencyLimit) -> float:
    """Microseconds per answer for *scopes* limits of *answers* answers each."""
    rng = random.Random(seed)
    limits = [cls(maximum=32, window=30.0) for _ in range(scopes)]
    # Versions before the median baseline have no on_sent().
    sends = hasattr(cls, "on_sent")
    clocks = [0.0] * scopes
    left = [answers] * scopes
    draws = [0.02 * math.exp(rng.gauss(0.0, 0.6)) for _ in range(4096)]
    mask = len(draws) - 1
    spent = 0.0
    drawn = 0
    gc.collect()
    gc.disable()
    try:
        while True:
            busy = False
            for index in range(scopes):
                remaining = left[index]
                if remaining <= 0:
                    continue
                busy = True
                limit = limits[index]
                count = min(limit.current(), remaining)
                sent = clocks[index]
                latencies = sorted(
                    draws[(drawn + offset) & mask] for offset in range(count)
                )
                drawn += count
                start = time.perf_counter()
                if sends:
                    for _ in range(count):
                        limit.on_sent(sent, count)
                for latency in latencies:
                    limit.on_response(sent + latency, latency, count)
                spent += time.perf_counter() - start
                clocks[index] = sent + latencies[-1] + 0.001
                left[index] = remaining - count
            if not busy:
                break
    finally:
        gc.enable()
    return spent / (scopes * answers) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scopes", default="1,200")
    parser.add_argument("--answers", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--compare", metavar="REV", help="also time git revision REV")
    args = parser.parse_args()
    counts = [int(value) for value in args.scopes.split(",")]
    most = max(counts)
    versions: dict[str, Any] = {"working tree": LatencyLimit}
    if args.compare:
        versions = {args.compare: load_revision(args.compare), **versions}
    print(f"us/answer, best of {args.repeat}")
    print("scopes  answers/scope  " + "  ".join(f"{name:>12}" for name in versions))
    for scopes in counts:
        answers = args.answers * most // scopes
        best = {name: math.inf for name in versions}
        for seed in range(1, args.repeat + 1):
            for name, cls in versions.items():
                best[name] = min(best[name], run(scopes, answers, seed, cls))
        row = "  ".join(f"{best[name]:12.2f}" for name in versions)
        print(f"{scopes:6d}  {answers:13d}  {row}")


if __name__ == "__main__":
    main()
