"""What waits for a call's end without a thread of its own: run at the end, or at a deadline.

A client's `WaitCall` (and a `Run` that waits) on the calls port is answered by a
function, not by a thread asleep on the call's condition: the thread that learns of
the end (the host link's, handling the last completion) runs it once it lets go of the
controller's lock, so the answer leaves without waking another thread. `CallWatch`
keeps each such function's deadline (the wait's timeout), and runs those that end
elsewhere, under the lock at any depth (a failed call, a finished one), on its own
thread. Each function runs once, whichever comes first (`Once`).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

PRUNE_AT = 1024
"""Deadlines kept before those already answered are swept out (each call's watcher stays
until its deadline otherwise: minutes, at thousands of calls a second)."""


class Once:
    """`then()` the first time it is called; later calls do nothing."""

    __slots__ = ("_then", "_lock")

    def __init__(self, then: Callable[[], None]) -> None:
        self._then: Callable[[], None] | None = then
        self._lock = threading.Lock()

    @property
    def done(self) -> bool:
        return self._then is None

    def __call__(self) -> None:
        with self._lock:
            then, self._then = self._then, None
        if then is not None:
            try:
                then()
            except Exception:  # a bug in an answer must not break the thread that ran it
                log.exception("answering a call's waiter failed")


class CallWatch:
    """Deadlines of watchers, and watchers to run soon, on one thread started on first use."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._deadlines: list[tuple[float, int, Once]] = []
        self._soon: deque[Once] = deque()
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def at(self, deadline: float, watcher: Once) -> None:
        """Runs `watcher` at `deadline` (time.monotonic) unless it ran before."""
        with self._cond:
            if len(self._deadlines) >= PRUNE_AT:
                self._deadlines = [d for d in self._deadlines if not d[2].done]
                heapq.heapify(self._deadlines)
            heapq.heappush(self._deadlines, (deadline, next(self._order), watcher))
            if self._deadlines[0][2] is watcher:
                self._cond.notify()
            self._start()

    def soon(self, watchers: Iterable[Once]) -> None:
        """Runs `watchers` on the watch's thread (for a caller that holds a lock they take).
        None wakes nobody: a call whose waiters were answered as it ended has none left
        when its client finishes it, and each call would cost the thread a wake-up."""
        batch = list(watchers)
        if not batch:
            return
        with self._cond:
            self._soon.extend(batch)
            self._cond.notify()
            self._start()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="call-watch", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    due = list(self._soon)
                    self._soon.clear()
                    while self._deadlines and self._deadlines[0][0] <= now:
                        due.append(heapq.heappop(self._deadlines)[2])
                    if due:
                        break
                    wait = self._deadlines[0][0] - now if self._deadlines else None
                    self._cond.wait(wait)
            for watcher in due:
                watcher()
