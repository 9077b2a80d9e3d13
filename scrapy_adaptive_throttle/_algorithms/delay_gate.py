"""The delay gate of a scope: when its next request may be sent.

Rule: each send closes the scope for a spacing counted from that send, as
Scrapy's ``DOWNLOAD_DELAY`` always was. The spacing is the current delay with
the scope's jitter applied (``apply_jitter``), except while backed off, where
the backoff step already carried its own jitter; it is never below the floor
(a robots.txt ``Crawl-delay`` is a minimum, not an average, so no jitter ever
spaces two sends closer). A request answered from a cache never reached the
host: its send is given back (:meth:`DelayGate.refund`) unless something moved
the gate since, as Scrapy's downloader never waits a delay for a cache hit.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from .jitter import JitterRange, apply_jitter

__all__ = ["DelayGate"]


class DelayGate:
    """The next-send time of one scope, its jitter and its floor.

    :param jitter: offsets ``(low, high)`` applied to each un-backed-off delay.
    :param uniform: the random source for jitter.
    """

    __slots__ = (
        "_allowed_after_send",
        "_allowed_before_send",
        "_drawn",
        "_last_sent_at",
        "_last_spacing",
        "_uniform",
        "floor",
        "jitter",
        "next_send_at",
    )

    def __init__(
        self,
        jitter: JitterRange,
        *,
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> None:
        self.jitter = jitter
        self._uniform = uniform
        #: When the next send may happen (monotonic seconds).
        self.next_send_at = 0.0
        #: The smallest spacing between two sends, in seconds.
        self.floor = 0.0
        #: The spacing drawn ahead of the next send (see :meth:`draw`).
        self._drawn: float | None = None
        # The last send, and the next-send time before and after it: what a
        # request served from a cache gives back (refund).
        self._last_sent_at: float | None = None
        self._last_spacing = 0.0
        self._allowed_before_send = 0.0
        self._allowed_after_send = 0.0

    def spacing(self, delay: float, *, backed_off: bool) -> float:
        """A fresh spacing for a send: *delay* jittered (unless *backed_off*,
        whose step was jittered once when taken), never below the floor."""
        spacing = (
            delay if backed_off else apply_jitter(delay, self.jitter, self._uniform)
        )
        return spacing if spacing > self.floor else self.floor

    def draw(self, delay: float, *, backed_off: bool) -> float:
        """The spacing of the next send, drawn now and kept for it, so that a
        shared state spaces every process's sends by the same value."""
        spacing = self._drawn
        if spacing is None:
            spacing = self._drawn = self.spacing(delay, backed_off=backed_off)
        return spacing

    def forget_draw(self) -> None:
        """Drop a drawn spacing: its send did not happen, the state may change."""
        self._drawn = None

    def record_send(
        self, now: float, delay: float, *, backed_off: bool, paced_until: float | None
    ) -> None:
        """Close the gate for the spacing of a send at *now* (at least until
        *paced_until*, a learned pace's schedule, if given)."""
        self._last_sent_at = now
        self._allowed_before_send = self.next_send_at
        spacing = self._drawn
        if spacing is None:
            spacing = self.spacing(delay, backed_off=backed_off)
        else:
            self._drawn = None
        self._last_spacing = spacing
        self.next_send_at = now + spacing
        if paced_until is not None:
            self.next_send_at = max(self.next_send_at, paced_until)
        self._allowed_after_send = self.next_send_at

    def refund(self, sent_at: float, *, paced: bool) -> bool:
        """Give back the spacing of the send at *sent_at*, if nothing moved
        the gate since (a later send, a backoff, a recovery, a *paced*
        schedule); return whether the next send may now come sooner."""
        if (
            self._last_sent_at != sent_at
            or paced
            or self.next_send_at != self._allowed_after_send
        ):
            return False
        self._last_sent_at = None
        before = self._allowed_before_send
        if before >= self.next_send_at:
            return False
        self.next_send_at = before
        return True

    def restamp(self, sent_at: float, now: float) -> bool:
        """Count the spacing of the send at *sent_at* from *now*, when its
        request reached the downloader, if nothing moved the gate since (a
        later send, a backoff, a recovery); return whether the gate now
        opens later. A pace's schedule (*paced_until* of the send) is kept
        as it was: the spacing only adds where it ends later."""
        if (
            self._last_sent_at != sent_at
            or now <= sent_at
            or self.next_send_at != self._allowed_after_send
        ):
            return False
        until = now + self._last_spacing
        if until <= self.next_send_at:
            return False
        self.next_send_at = self._allowed_after_send = until
        return True

    def push_back(self, until: float) -> None:
        """Keep the gate closed until at least *until*."""
        self.next_send_at = max(self.next_send_at, until)

    def pull_in(self, until: float) -> None:
        """Open the gate by *until* at the latest (a lowered delay)."""
        self.next_send_at = min(self.next_send_at, until)

    def wait(self, now: float) -> float:
        """Seconds until the gate opens (0.0: open)."""
        wait = self.next_send_at - now
        return wait if wait > 0 else 0.0

    def __repr__(self) -> str:
        return (
            f"DelayGate(next_send_at={self.next_send_at:.3f}, "
            f"floor={self.floor}, jitter={self.jitter})"
        )
