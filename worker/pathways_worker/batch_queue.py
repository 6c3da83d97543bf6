"""A queue drained in batches: what accumulated while the stream was busy goes out
as one message, so no computation costs a round trip of its own.

A stream's writer thread takes batches (`take`); a thread that puts an item someone
waits for may write the batch itself (`put_and_take`) while no other batch is being
written, which spares the writer thread's wake-up on the way. Whoever takes with
`sending` writes the batch and then says so (`sent`); until then no other batch is
taken, so batches reach the stream in the order they were taken."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class BatchQueue(Generic[T]):
    def __init__(self, weight: Callable[[T], int] | None = None) -> None:
        """`weight`: how many items one stands for when `take` asks `more_coming` (one
        each without it); a worker's completion of a run of grants stands for its count."""
        self._cv = threading.Condition()
        self._items: list[T] = []
        self._weight = weight
        self._held = 0
        """What the queued items stand for, by `weight`."""
        self._nudged = False
        self._urgent = False
        self._waiting: list[Callable[[], bool]] = []
        """When each waiting taker is to be woken: a change wakes it only once that holds."""
        self._sending = False
        """A batch taken with `sending` is being written, and no other batch is taken until `sent`."""

    def put(self, item: T, urgent: bool = False) -> None:
        """`urgent`: someone waits for this item, so the batch it joins goes
        without lingering for company."""
        with self._cv:
            self._items.append(item)
            self._held += self._weight(item) if self._weight is not None else 1
            self._urgent = self._urgent or urgent
            self._wake_if_done()

    def put_many(self, items: list[T], urgent: bool = False) -> None:
        if not items:
            return
        with self._cv:
            self._items.extend(items)
            weight = self._weight
            self._held += sum(map(weight, items)) if weight is not None else len(items)
            self._urgent = self._urgent or urgent
            self._wake_if_done()

    def put_and_take(self, items: list[T], urgent: bool = True) -> list[T]:
        """`put_many`; then, where the batch is `urgent` and no other is being written,
        everything queued, for the calling thread to write at once and then call `sent`
        (else [], and a taker takes it)."""
        if not items:
            return []
        with self._cv:
            self._items.extend(items)
            weight = self._weight
            self._held += sum(map(weight, items)) if weight is not None else len(items)
            if not urgent or self._sending:
                self._urgent = self._urgent or urgent
                self._wake_if_done()
                return []
            taken, self._items = self._items, []
            self._held, self._nudged, self._urgent, self._sending = 0, False, False, True
            return taken

    def put_or_write(self, items: list[T], write: Callable[[list[T]], None] | None, urgent: bool = True) -> None:
        """`put_many`; where the batch is `urgent` and `write` is given, `put_and_take`,
        and the calling thread writes what it took with `write`. A write that fails
        (OSError: the stream broke) leaves the batch queued for the stream's taker."""
        if write is None or not urgent:
            self.put_many(items, urgent=urgent)
            return
        taken = self.put_and_take(items)
        if not taken:
            return  # another thread is writing a batch: a taker sends these after it
        try:
            write(taken)
        except OSError as err:
            log.info("writing a batch on its stream failed (%s); left for the stream's taker", err)
            self.put_many(taken, urgent=True)
        finally:
            self.sent()

    def sent(self) -> None:
        """The batch taken with `sending` (or by `put_and_take`) was written: the next may be taken."""
        with self._cv:
            self._sending = False
            self._wake_if_done()

    def nudge(self) -> None:
        """Asks for a batch, empty if need be (e.g. to send fresh counters), without
        waking anyone: a waiting taker finds the nudge when its wait ends, or when an
        item wakes it, and a batch taken meanwhile answers it. A call moves the store's
        count several times, and each wake-up is a thread switch on the host's cores
        that takes the GIL from the executor dispatching the call."""
        with self._cv:
            self._nudged = True

    def wake(self) -> None:
        """Makes a lingering taker ask `more_coming` again (nothing is queued)."""
        with self._cv:
            self._wake_if_done()

    def _wake_if_done(self) -> None:
        """Wakes the takers once what one of them waits for holds (the caller holds
        the lock). A taker woken for nothing takes the GIL from the thread that woke
        it and hands it back: the executor's dispatch of the next computation then
        waited for it, several times per batch of completions lingering for company."""
        if any(done() for done in self._waiting):
            self._cv.notify_all()

    def _wait(self, done: Callable[[], bool], timeout_s: float, wake: Callable[[], bool] | None = None) -> None:
        """`Condition.wait_for(done, timeout_s)`, woken only when `wake` (by default `done`)
        holds (the caller holds the lock)."""
        woken_when = done if wake is None else wake
        self._waiting.append(woken_when)
        try:
            self._cv.wait_for(done, timeout_s)
        finally:
            self._waiting.remove(woken_when)

    def take(
        self,
        timeout_s: float,
        linger_s: float = 0.0,
        more_coming: Callable[[int], bool] | None = None,
        nudges_wake: bool = True,
        owner: Callable[[], bool] | None = None,
        sending: bool = False,
    ) -> tuple[list[T], bool]:
        """Everything queued (waiting up to timeout_s for something), and whether
        a nudge arrived. With `linger_s`, once something is there it waits that
        much longer for company: a few hundred microseconds turn a stream of
        one-completion messages into a few large ones. `more_coming(held)` says
        whether lingering can still pay off with `held` items queued (by `weight`); it is
        asked again at every item put while lingering, and once it says no, or
        an urgent item is queued, the batch goes now.
        Without `nudges_wake`, only items end the wait (a nudge is still reported).
        With `owner`, the batch is taken only if it still holds when the batch is taken
        (under the lock): a taker that lost the queue to another meanwhile leaves it
        everything. With `sending`, the caller writes the batch and then calls `sent`;
        a batch another thread is writing is waited for first (up to `timeout_s`)."""
        with self._cv:
            if not self._items and not (nudges_wake and self._nudged):
                # a nudge ends the wait, but wakes nobody: not when it comes, nor when a
                # batch written meanwhile is `sent`
                self._wait(lambda: bool(self._items) or (nudges_wake and self._nudged), timeout_s,
                           wake=lambda: bool(self._items))
            if not self._items and not (nudges_wake and self._nudged):
                nudged, self._nudged = self._nudged, False
                return [], nudged
            urgent = self._urgent
        if linger_s > 0 and not urgent:
            with self._cv:
                self._wait(
                    lambda: self._urgent or (more_coming is not None and not more_coming(self._held)),
                    linger_s,
                )
        with self._cv:
            if self._sending:
                self._wait(lambda: not self._sending, timeout_s)
                if self._sending:
                    return [], False
            if owner is not None and not owner():
                return [], False
            items, self._items = self._items, []
            self._held = 0
            nudged, self._nudged = self._nudged, False
            self._urgent = False
            self._sending = sending and bool(items)
            return items, nudged

    def __len__(self) -> int:
        with self._cv:
            return len(self._items)
