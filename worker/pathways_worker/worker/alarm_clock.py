"""The executor's clock: the one place the worker's timeouts meet real time.

The host's state machine never reads a clock; when it must bound a wait it
asks for a timer (`StartTimer`), and this thread rings it back after the delay
(the driver turns that into a `TimerFired` stimulus) unless it was cancelled
first. Only the head grant waits at a time, so the heap stays tiny.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class AlarmClock:
    def __init__(self, ring: Callable[[int], None]) -> None:
        self._ring = ring
        self._cv = threading.Condition()
        self._alarms: list[tuple[float, int]] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="alarm-clock", daemon=True)
        self._thread.start()

    def start(self, timer: int, delay_s: float) -> None:
        with self._cv:
            heapq.heappush(self._alarms, (time.monotonic() + delay_s, timer))
            self._cv.notify()

    def cancel(self, timer: int) -> None:
        with self._cv:
            kept = [alarm for alarm in self._alarms if alarm[1] != timer]
            if len(kept) != len(self._alarms):
                heapq.heapify(kept)
                self._alarms = kept
                self._cv.notify()

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stopping:
                    if not self._alarms:
                        self._cv.wait()
                        continue
                    left = self._alarms[0][0] - time.monotonic()
                    if left <= 0:
                        break
                    self._cv.wait(left)
                if self._stopping:
                    return
                _, timer = heapq.heappop(self._alarms)
            try:
                self._ring(timer)
            except Exception:
                log.exception("ringing timer %d failed", timer)
