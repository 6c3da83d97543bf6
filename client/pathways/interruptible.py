"""Waits of the user's thread that Ctrl-C can interrupt.

CPython runs signal handlers only in the main thread, and a blocking lock wait there
(``Event.wait()``, ``Future.result()``, ``Thread.join()`` with no timeout) is woken by a
signal only when the kernel delivered the signal to that very thread. A client process
has gRPC's and the runtime's own threads, so a SIGINT often lands on one of them and the
main thread would sleep on, past the user's Ctrl-C. Each wait here is therefore made in
slices of :data:`SLICE_S`: between two slices the interpreter runs the pending handler,
and ``KeyboardInterrupt`` is raised where the user's code waits.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import Any, TypeVar

T = TypeVar("T")

SLICE_S = 0.2
"""The longest a wait sleeps before letting a pending signal's handler run."""


def wait_event(event: threading.Event) -> None:
    while not event.wait(SLICE_S):
        pass


def result(future: Future[T]) -> T:
    while not future.done():
        wait_futures([future], timeout=SLICE_S)
    return future.result()


def join(thread: threading.Thread) -> None:
    while thread.is_alive():
        thread.join(SLICE_S)


def acquire(lock: Any) -> None:
    """Acquires a lock or semaphore (anything with ``acquire(timeout=...)``)."""
    while not lock.acquire(timeout=SLICE_S):
        pass
