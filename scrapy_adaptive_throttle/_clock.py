"""The clocks: the one place in the package that reads the system's time.

Everything else is given a clock (a ``Callable[[], float]`` of seconds) by
whoever builds it, with these as the defaults at the crawler's edge, so that
a test replaces the clock of a whole manager (its scopes, its gate and the
scheduler queue) at once; ``_algorithms/`` takes times as arguments.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["MONOTONIC_CLOCK", "WALL_CLOCK", "Clock"]

#: A clock: seconds, as a float.
Clock = Callable[[], float]

#: Spacing, holds, latency and every scope's state: never goes back.
MONOTONIC_CLOCK: Clock = time.monotonic

#: :reqmeta:`throttling_delay` deadlines (they survive a crawl paused and
#: resumed with ``JOBDIR``) and HTTP dates.
WALL_CLOCK: Clock = time.time
