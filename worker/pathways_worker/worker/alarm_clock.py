"""The executor's clock: the one place the worker's timeouts meet real time.

The host's state machine never reads a clock; when it must bound a wait it
asks for a timer (`StartTimer`), and this thread rings it back after the delay
(the driver turns that into a `TimerFired` stimulus) unless it was cancelled
first. Only the head grant waits at a time, so the heap stays tiny.

A grant that waits for an input starts a timer and cancels it when the input
comes, usually within a millisecond, while the executor is busy with that very
grant. Neither wakes this thread unless it must: a timer wakes it only when
it rings before the thread would wake anyway (it sleeps at most `NAP_S`), and
a cancelled one is simply left out when its time comes.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

NAP_S = 1.0
"""The longest the thread sleeps: a timer due later than that from now starts
without waking it, since it looks again by then."""

STALE_SLACK = 64
"""Entries of cancelled timers the heap may hold beyond twice the live ones before it is
rebuilt from the live ones alone."""


class AlarmClock:
    def __init__(self, ring: Callable[[int], None], nap_s: float = NAP_S) -> None:
        self._ring = ring
        self._nap_s = nap_s
        self._cv = threading.Condition()
        self._alarms: list[tuple[float, int]] = []
        """(due, timer), soonest first; a timer cancelled (or started again) leaves its
        entry behind, skipped when it comes up."""
        self._live: dict[int, float] = {}
        """Each timer that may still ring, and when."""
        self._wake_at = 0.0
        """When the sleeping thread looks again by itself (0 while it is awake)."""
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="alarm-clock", daemon=True)
        self._thread.start()

    def start(self, timer: int, delay_s: float) -> None:
        due = time.monotonic() + delay_s
        with self._cv:
            self._live[timer] = due
            heapq.heappush(self._alarms, (due, timer))
            if len(self._alarms) > 2 * len(self._live) + STALE_SLACK:
                self._alarms = [(when, t) for t, when in self._live.items()]
                heapq.heapify(self._alarms)
            if due < self._wake_at:
                self._wake_at = 0.0
                self._cv.notify()

    def cancel(self, timer: int) -> None:
        """The timer does not ring; the thread is not woken to forget it."""
        with self._cv:
            self._live.pop(timer, None)

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                timer = self._next_due()
                if timer is None:
                    return
            try:
                self._ring(timer)
            except Exception:
                log.exception("ringing timer %d failed", timer)

    def _next_due(self) -> int | None:
        """Sleeps (under the lock) until a live timer is due and takes it; None: stopping."""
        live = self._live
        while not self._stopping:
            alarms = self._alarms  # `start` may have rebuilt the heap while this slept
            while alarms and live.get(alarms[0][1]) != alarms[0][0]:
                heapq.heappop(alarms)
            now = time.monotonic()
            if alarms and alarms[0][0] <= now:
                _, timer = heapq.heappop(alarms)
                del live[timer]
                return timer
            nap = min(self._nap_s, alarms[0][0] - now) if alarms else self._nap_s
            self._wake_at = now + nap
            self._cv.wait(nap)
            self._wake_at = 0.0
        return None
