"""A fixed-window quota for one scope.

Rule (the quotas section of Scrapy's throttling chapter, pull request #6931,
``_maybe_reset_quota`` and ``can_send`` there): a scope may consume up to
``quota`` units per ``window`` seconds. The first use starts the window (windows
are not aligned to the clock); each elapsed window resets the consumption. A
request that would exceed the quota waits until the current window ends, except
when nothing has been consumed yet: a single request larger than the whole
quota would otherwise wait forever. A window of 0 or less resets on every call,
i.e. no limit.

Servers may report the real consumption afterwards, see :meth:`reconcile`.
"""

from __future__ import annotations

import math

__all__ = ["QuotaWindow"]


class QuotaWindow:
    """Consumption of one quota over fixed windows.

    :param quota: units allowed per window.
    :param window: window length in seconds.

    Attributes: ``quota``, ``window``, ``consumed`` (units used in the current
    window) and ``window_start`` (None until the first use).
    """

    __slots__ = ("consumed", "quota", "window", "window_start")

    def __init__(self, quota: float, window: float) -> None:
        self.quota = quota
        self.window = window
        self.consumed = 0.0
        self.window_start: float | None = None

    def wait(self, now: float, amount: float | None) -> float:
        """Seconds before *amount* may be consumed (0.0 when it may be now)."""
        self._roll(now)
        consumed = self.consumed
        start = self.window_start
        if consumed <= 0 or start is None or consumed + (amount or 0.0) <= self.quota:
            return 0.0
        return max(0.0, start + self.window - now)

    def peek_wait(self, now: float, amount: float | None) -> float:
        """What :meth:`wait` would answer at *now*, without rolling the
        window forward (for a reader that must change nothing)."""
        start = self.window_start
        if start is None or self.consumed <= 0:
            return 0.0
        if self.window > 0 and now - start >= self.window:
            return 0.0
        if self.consumed + (amount or 0.0) <= self.quota:
            return 0.0
        return max(0.0, start + self.window - now)

    def consume(self, now: float, amount: float | None) -> None:
        """Record the use of *amount* units (None or 0 still starts the window)."""
        self._roll(now)
        if self.window_start is None:
            self.window_start = now
        # `amount > 0` also rejects NaN, which would poison the sum for good.
        if amount is not None and amount > 0:
            self.consumed += amount

    def reconcile(
        self,
        now: float,
        *,
        consumed: float | None = None,
        remaining: float | None = None,
    ) -> None:
        """Correct the consumption with what the server reported.

        :param consumed: the difference between actual and estimated use,
            added to the consumption (it may be negative).
        :param remaining: units the server says are left in its window; wins
            over *consumed*.

        Non-finite values are ignored.
        """
        self._roll(now)
        if remaining is not None and math.isfinite(remaining):
            self.consumed = max(0.0, self.quota - remaining)
        elif consumed is not None and math.isfinite(consumed):
            self.consumed = max(0.0, self.consumed + consumed)
        else:
            return
        # A report is a use: without a window, a reported exhaustion could
        # never expire.
        if self.window_start is None:
            self.window_start = now

    def share(self, amount: float | None) -> float:
        """The fraction of the quota that *amount* uses (0.0 for None).

        Lets a queue prefer requests that use a larger share, so that big
        requests are not starved by a stream of small ones.
        """
        if amount is None or not amount > 0:
            return 0.0
        if self.quota <= 0:
            return math.inf
        return amount / self.quota

    def _roll(self, now: float) -> None:
        start = self.window_start
        if start is None:
            return
        window = self.window
        if window <= 0:
            self.consumed = 0.0
            self.window_start = now
            return
        elapsed = now - start
        if elapsed >= window:
            # Whole windows only, so that window boundaries stay where the
            # first use put them, however long the scope was idle.
            start += (elapsed // window) * window
            # Floor division of floats can land one window short.
            if now - start >= window:
                start += window
            self.window_start = start
            self.consumed = 0.0

    def __repr__(self) -> str:
        return (
            f"<QuotaWindow consumed={self.consumed}/{self.quota}"
            f" window={self.window} window_start={self.window_start}>"
        )
