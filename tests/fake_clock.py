"""A clock that tests set and advance by hand.

The package reads time only through an injected clock (a zero-argument
callable returning seconds), so a test passes a :class:`FakeClock` and moves
``now`` instead of sleeping. Import the class, or use the ``fake_clock``
fixture of ``tests/conftest.py``.
"""

from __future__ import annotations


class FakeClock:
    """A zero-argument callable returning :attr:`now` (seconds).

    *now* is where it starts: 0 by default; some tests start far from 0 so
    that "time 0" cannot be confused with "never".
    """

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move the clock *seconds* forward; return the new time."""
        self.now += seconds
        return self.now
