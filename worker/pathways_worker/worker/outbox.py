"""The worker's events for its sidecar, batched; each event carries the store's byte count.

A batch lingers for company only while more completions are on their way
(`busy()`: grants still queued on the executor); the last completion of a call
and every export go out at once, since someone is waiting for them: completions
put while nothing is queued end a linger under way. A change of
the byte count alone (a nudge) waits up to `STATS_LINGER_S` for something to
ride with: only health and metrics read it, and a call moves the count several
times, which would otherwise cost a message each.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from pathways_wire import pathways_pb2 as pb
from pathways_worker.batch_queue import BatchQueue

EVENT_LINGER_S = float(os.environ.get("PATHWAYS_EVENT_LINGER_S", "0.001"))
STATS_LINGER_S = float(os.environ.get("PATHWAYS_STATS_LINGER_S", "0.02"))


class WorkerOutbox:
    def __init__(
        self, store_bytes: Callable[[], int], store_limit: int, busy: Callable[[], bool] = lambda: False
    ) -> None:
        self._queue: BatchQueue[pb.Completion | pb.Exported] = BatchQueue()
        self._store_bytes = store_bytes
        self._store_limit = store_limit
        self._busy = busy

    def completions(self, done: list[pb.Completion]) -> None:
        self._queue.put_many(list(done), urgent=not self._busy())

    def exported(self, exported: pb.Exported) -> None:
        self._queue.put(exported, urgent=True)

    def finished(self, done: list[pb.Completion], exported: list[pb.Exported]) -> None:
        """Completions and the values their computations routed elsewhere, in one
        event that goes at once."""
        self._queue.put_many([*exported, *done], urgent=True)

    def nudge(self) -> None:
        self._queue.nudge()

    def take_event(self, timeout_s: float) -> pb.WorkerEvent | None:
        items, nudged = self._queue.take(timeout_s, EVENT_LINGER_S, self._busy)
        if not items and not nudged:
            return None
        if not items:
            items, _ = self._queue.take(STATS_LINGER_S, EVENT_LINGER_S, self._busy, nudges_wake=False)
        event = self.stats_event()
        for item in items:
            if isinstance(item, pb.Completion):
                event.completions.append(item)
            else:
                event.exported.append(item)
        return event

    def stats_event(self) -> pb.WorkerEvent:
        return pb.WorkerEvent(store_bytes=self._store_bytes(), store_limit=self._store_limit)
