"""The worker's events for its sidecar, batched; each event carries the store's byte count.

A batch of completions lingers for company, up to `EVENT_LINGER_S`, while the
host holds back fewer of them than it has grants left to finish, or, while the
island scheduler has no work waiting for room on the slice, while it has any
left (`worth_lingering`); the last completion of a call, a failed one and every export
go out at once, since someone is waiting for them: completions put while nothing
is left end a linger under way. A change of
the byte count alone (a nudge) wakes no thread: the session's writer finds it when it
next looks (`executor_service.TAKE_S`), and then waits up to `STATS_LINGER_S` for
something to ride with, unless an event took the fresh count along before. Only health
and metrics read it, and a call moves the count several times, which would otherwise
cost a message, and a thread's wake-up beside the executor, each.

Where the session can be written by any thread (the session port, `attach`), the
thread that puts what someone waits for writes the event itself, unless another
event is being written: a call's end then reaches the sidecar without waking the
session's writer thread on the way.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from pathways_wire.env_flags import env_number
from pathways_wire import pathways_pb2 as pb
from pathways_worker.batch_queue import BatchQueue

EVENT_LINGER_S = env_number(os.environ, "PATHWAYS_EVENT_LINGER_S", 0.02, minimum=0.0)
"""How long completions wait for company at most: how stale the controller's count
of a busy host's work may get."""
STATS_LINGER_S = env_number(os.environ, "PATHWAYS_STATS_LINGER_S", 0.02, minimum=0.0)


class WorkerOutbox:
    def __init__(
        self,
        store_bytes: Callable[[], int],
        store_limit: int,
        in_hand: Callable[[], int] = lambda: 0,
        room_wanted: Callable[[], bool] = lambda: True,
    ) -> None:
        self._queue: BatchQueue[pb.Completion | pb.Exported] = BatchQueue(held_grants)
        self._store_bytes = store_bytes
        self._store_limit = store_limit
        self._in_hand = in_hand
        self._room_wanted = room_wanted
        self._write: Callable[[pb.WorkerEvent], None] | None = None
        """Writes an event on the session from any thread (`attach`); None: only the session's
        writer thread takes events."""
        self._attach_lock = threading.Lock()

    def _more_coming(self, held: int) -> bool:
        return worth_lingering(self._in_hand(), held, self._room_wanted())

    def attach(self, write: Callable[[pb.WorkerEvent], None]) -> None:
        """From now on an urgent event may be written by the thread that puts it, with
        `write` (safe to call from any thread; raises OSError once the session broke)."""
        with self._attach_lock:
            self._write = write

    def detach(self, write: Callable[[pb.WorkerEvent], None]) -> None:
        """Ends `attach`, unless a newer session attached meanwhile."""
        with self._attach_lock:
            if self._write is write:
                self._write = None

    def completions(self, done: list[pb.Completion], ends_call: bool = False) -> None:
        """`ends_call`: one of them is a call's last on this host, which its client may wait for."""
        failed = any(not c.ok for c in done)
        self._put(list(done), urgent=ends_call or failed or not self._more_coming(0))

    def exported(self, exported: pb.Exported) -> None:
        self._put([exported], urgent=True)

    def finished(self, done: list[pb.Completion], exported: list[pb.Exported]) -> None:
        """Completions and the values their computations routed elsewhere, in one
        event that goes at once."""
        self._put([*exported, *done], urgent=True)

    def _put(self, items: list[pb.Completion | pb.Exported], urgent: bool) -> None:
        """Queues `items`; urgent ones, where the session can be written from here and no
        other event is being written, go now in an event written by this thread."""
        write = self._write
        self._queue.put_or_write(items, None if write is None else lambda taken: write(self._event(taken)), urgent)

    def nudge(self) -> None:
        self._queue.nudge()

    def reconsider(self) -> None:
        """Completions lingering for company ask `worth_lingering` again."""
        self._queue.wake()

    def take_event(
        self, timeout_s: float, owner: Callable[[], bool] | None = None, sending: bool = False
    ) -> pb.WorkerEvent | None:
        """The next event; with `owner`, only while it holds as the event is taken (see
        `BatchQueue.take`): a session replaced meanwhile leaves the event to the next.
        With `sending`, an event that carries completions or exports is followed by `sent`
        once written (`BatchQueue.take`)."""
        items, nudged = self._queue.take(timeout_s, EVENT_LINGER_S, self._more_coming, owner=owner, sending=sending)
        if not items and not nudged:
            return None
        if not items:
            items, _ = self._queue.take(
                STATS_LINGER_S, EVENT_LINGER_S, self._more_coming, nudges_wake=False, owner=owner, sending=sending
            )
        return self._event(items)

    def sent(self) -> None:
        """The event `take_event` gave with `sending` was written."""
        self._queue.sent()

    @staticmethod
    def carries_items(event: pb.WorkerEvent) -> bool:
        """Whether `event` came with completions or exports (its writer owes `sent`)."""
        return bool(event.completions) or bool(event.exported)

    def _event(self, items: list[pb.Completion | pb.Exported]) -> pb.WorkerEvent:
        event = self.stats_event()
        # one extend, not an append each: a chain's completions number in the dozens per event
        event.completions.extend(item for item in items if isinstance(item, pb.Completion))
        event.exported.extend(item for item in items if isinstance(item, pb.Exported))
        return event

    def stats_event(self) -> pb.WorkerEvent:
        return pb.WorkerEvent(store_bytes=self._store_bytes(), store_limit=self._store_limit)


def worth_lingering(in_hand: int, held: int, room_wanted: bool = True) -> bool:
    """Whether `held` completions should wait for company, with `in_hand` grants
    the host has still to finish (queued, running or being waited for), and
    `room_wanted` as the island scheduler last said (other work waits for the
    window room completions free).

    They wait while the host has more left to run than it holds back. A host
    with nothing left sends at once (its call's end, which someone waits for),
    and one that has run as much as it has left tells the island scheduler
    then: a contended slice is refilled once half of what it was granted has
    run (`island_scheduler`), and the half still in hand covers the trip of
    the next grants back. Completions one at a time cost a message on every
    hop worker -> sidecar -> controller, and with 1 ms computations on 2
    cores those messages took the time the computations needed.

    While no room is wanted, nobody needs them before the host's work runs
    out: they wait for as long as anything is left in hand (still at most
    `EVENT_LINGER_S`)."""
    return in_hand > held if room_wanted else in_hand > 0


def held_grants(item: pb.Completion | pb.Exported) -> int:
    """Grants a queued item reports: a completion of a run (`Completion.count`) each of
    them, so lingering weighs what is held back in grants, as before runs."""
    return max(item.count, 1) if isinstance(item, pb.Completion) else 1
