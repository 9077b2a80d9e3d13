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
*REV* (its ``_algorithms`` package, extracted with ``git archive``), the two
versions alternating run by run in this one process, so that the machine's
load weighs on both alike.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import io
import math
import random
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from scrapy_adaptive_throttle._algorithms import LatencyLimit


def load_revision(revision: str) -> Any:
    """``LatencyLimit`` as it is in git revision *revision*.

    The revision's whole ``_algorithms`` package is extracted (the latency
    limit spans several of its modules since the split of issue 10) and
    imported under a name of its own; it imports neither Scrapy nor the rest
    of the package.
    """
    directory = Path(tempfile.mkdtemp(prefix="latency-cost-"))
    archive = subprocess.run(
        ["git", "archive", revision, "scrapy_adaptive_throttle/_algorithms"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(directory, filter="data")
    name = f"algorithms_{revision}".replace("-", "_")
    init = directory / "scrapy_adaptive_throttle" / "_algorithms" / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        name, init, submodule_search_locations=[str(init.parent)]
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
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
