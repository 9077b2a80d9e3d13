"""The state of a latency limit: its parameters, bounds and parts, and how it
reads (the whole limit, diagnostics).

The rules that change it, answer by answer, are
:class:`~scrapy_adaptive_throttle._algorithms.latency.LatencyLimit`'s
(``latency.py``, which states them); its parts each own a piece of the
state: the baseline (``latency_baseline.py``), rounds (``latency_round.py``),
growth (``latency_growth.py``), slow start (``latency_slow_start.py``),
probes (``latency_probe.py``) and changes of the host's speed
(``latency_speed.py``).
"""

from __future__ import annotations

import math

from .latency_baseline import UnloadedBaseline
from .latency_growth import Plateau
from .latency_probe import ProbeRound
from .latency_round import Round
from .latency_slow_start import SlowStart
from .latency_speed import SpeedChange

__all__ = ["LatencyState"]


class LatencyState:
    """What a :class:`~scrapy_adaptive_throttle._algorithms.latency.LatencyLimit`
    holds, validated, and its read-only views; the parameters are the
    limit's (see there)."""

    __slots__ = (
        "_baseline",
        "_last_overload",
        "_maximum",
        "_minimum",
        "_plateau",
        "_probe",
        "_raised_at",
        "_round",
        "_round_size",
        "_slow_start",
        "_speed",
        "best",
        "decrease_count",
        "increase_count",
        "last_latency",
        "limit",
        "overload_count",
        "rebaseline_count",
        "resolution",
        "tolerance",
        "window",
    )

    def __init__(
        self,
        *,
        initial: float = 2.0,
        minimum: int = 1,
        maximum: int = 8,
        tolerance: float = 1.5,
        window: float = 30.0,
        resolution: float = 0.0,
        slow_start: bool = True,
        probe: bool = True,
    ) -> None:
        if not (math.isfinite(tolerance) and tolerance >= 1):
            raise ValueError(f"tolerance must be >= 1, got {tolerance!r}")
        if not math.isfinite(window):
            raise ValueError(f"window must be a finite number, got {window!r}")
        if not (math.isfinite(resolution) and resolution >= 0):
            raise ValueError(f"resolution must be >= 0, got {resolution!r}")
        self.tolerance = tolerance
        self.resolution = resolution
        self.window = window
        self.limit = float(initial)
        self._minimum = 1
        self._maximum = 1
        self.set_bounds(minimum, maximum)
        self.best: float | None = None
        self.last_latency: float | None = None
        self.increase_count = 0
        self.decrease_count = 0
        self.overload_count = 0
        self.rebaseline_count = 0
        # The baseline and the recent answers per in-flight level (requests
        # in flight when each request was sent) it is made of.
        self._baseline = UnloadedBaseline()
        # The answers a round needs before its majority means something.
        self._round_size = 1
        self._last_overload = -math.inf
        # When the whole-number limit last went up: answers to requests sent
        # before then tested the lower limit and do not raise it further.
        self._raised_at = -math.inf
        # The current round: answers to requests sent since its start.
        self._round = Round()
        # Whether the host itself changed speed (a new baseline).
        self._speed = SpeedChange()
        # The whole limit whose round was last slow, and when.
        self._plateau = Plateau()
        self._slow_start = SlowStart(enabled=slow_start)
        # Probe rounds (BBR's ProbeRTT).
        self._probe = ProbeRound(enabled=probe)

    @property
    def in_slow_start(self) -> bool:
        """Whether the limit still doubles every round (no queue seen yet)."""
        return self._slow_start.active

    @property
    def minimum(self) -> int:
        """The floor of the limit (change it with :meth:`set_bounds`)."""
        return self._minimum

    @property
    def maximum(self) -> int:
        """The ceiling of the limit (change it with :meth:`set_bounds`)."""
        return self._maximum

    @property
    def baseline(self) -> float | None:
        """The baseline latency (same as ``best``): the unloaded median."""
        return self.best

    @property
    def round_size(self) -> int:
        """Answers a round needs at least (more on a noisier host)."""
        return self._round_size

    def set_bounds(self, minimum: int, maximum: int) -> None:
        """Set the floor and ceiling and clamp the limit into them.

        A minimum below 1 counts as 1 (a limit of 0 would never send again);
        a maximum below the minimum counts as the minimum.
        """
        low = max(1, int(minimum))
        high = max(low, int(maximum))
        self._minimum = low
        self._maximum = high
        limit = self.limit
        if limit > high:
            self.limit = float(high)
        # Negated so that a NaN limit ends at the floor too.
        elif not limit >= low:
            self.limit = float(low)

    def current(self) -> int:
        """The whole number of requests allowed in flight.

        Half the limit during a probe (see :attr:`probing`).
        """
        limit = max(self._minimum, min(self._maximum, int(self.limit)))
        if self._probe.started is not None:
            return max(self._minimum, limit // 2)
        return limit

    @property
    def probing(self) -> bool:
        """Whether a probe round runs: half the limit for ``PROBE_SAMPLES``
        answers, so that the baseline is made of unloaded answers."""
        return self._probe.started is not None

    def _note_limit(self, now: float) -> None:
        """Record the whole limit if it changed (for the load history)."""
        self._baseline.load.note_limit(now, self.current())

    def _threshold(self, best: float) -> float:
        return max(best * self.tolerance, best + self.resolution)

    def snapshot(self) -> dict[str, float | int | None]:
        """The state worth exporting per scope (the guide's diagnostic hook)."""
        return {
            "limit": self.limit,
            "current": self.current(),
            "best": self.best,
            "minimum": self._minimum,
            "maximum": self._maximum,
        }

    def __repr__(self) -> str:
        return (
            f"<LatencyLimit limit={self.limit:.2f} best={self.best}"
            f" bounds=[{self._minimum}, {self._maximum}]>"
        )
